"""A working sequence of the cache's own context as a run's slot: sliding-window models.

Their window cells do not survive a trim or a copy (llama.cpp issue 25295), so a run forks a
resident node into a sequence the cache lends it (seq_cp: the cells are shared, not copied),
evaluates there in batches under 64 tokens (batch_policy.py), and forks its nodes off while
the sequence ends at them. The sequence goes back to the cache when the slot closes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..kv.sequence_ops import SequenceOps
from ..kv.sequence_tokens import SequenceTokens
from ..llama.batch_policy import BatchPolicy, fork_marks
from ..llama.native import NativeContext
from ..task_state import TaskState
from .run_slot import NodeEnd, Slot

# Engine.evaluate: append tokens to a sequence of the cache's context in planned batches
Evaluate = Callable[..., object]


class ForkedSlot(Slot):
    windowed = True

    def __init__(self, seq: int, cache: RadixCache, seqs: SequenceOps, seq_tokens: SequenceTokens,
                 ctx: NativeContext, evaluate: Evaluate, batching: BatchPolicy,
                 landing_empty: bool):
        super().__init__(cache, batching)
        self.seq = seq
        self._seqs, self._seq_tokens, self._ctx, self._evaluate = seqs, seq_tokens, ctx, evaluate
        # the context held no cell when the slot opened: what it evaluates first lands from
        # cell 0, as a cold run's cells do
        self._landing_empty = landing_empty
        self._cuts: list[int] = []  # batch starts of the history its cells hold

    @property
    def ctx(self) -> NativeContext:
        return self._ctx

    @property
    def held(self) -> int:
        return self._seq_tokens.count(self.seq)

    def history(self, end: int) -> list[int]:
        return [c for c in self._cuts if c < end]

    def whole(self, hit: CacheHit) -> CacheHit:
        return hit  # forked up to any position: small batches do not depend on the cells' place

    def bring(self, hit: CacheHit, tokens: list[int]) -> int:
        self.cache.fork_into(hit, self.seq)
        self._cuts = hit.head_cuts()
        return 0

    def place(self, src: int, p0: int, p1: int, at: int, tokens: list[int]) -> None:
        self._seqs.place_cells(src, p0, p1, self.seq, at - p0, self.cache.scratch, tokens)

    def marks(self, segment_starts: Sequence[int], reused: int, end: int,
              storing: bool, reusable: int | None = None) -> list[int]:
        return fork_marks(segment_starts, reused, end)

    def prime_starts(self, end: int) -> list[int]:
        return self.batching.prime(self.held, end, windowed=True,
                                   cache_empty=self._landing_empty)

    def evaluate(self, tokens: list[int], starts: list[int], task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, nodes: Sequence[NodeEnd] = ()):
        """As ``Slot.evaluate``; each node is forked off the moment the sequence ends at it (a
        later fork up to a position would lose the window cells past it), so each node must
        end where a batch starts or at the end."""
        ends = {n.pos: n for n in nodes}
        self._cuts += list(starts)

        def at_mark(pos: int) -> None:
            self._stored.append(self._store([], ends[pos]))

        return self._evaluate(tokens, self.seq, task, stage=stage, want_logits=want_logits,
                              starts=starts, marks=sorted(ends), at_mark=at_mark if ends else None)

    def step(self, token: int) -> None:
        self._evaluate([token], self.seq, stage="generate")

    def _store(self, tokens: list[int], end: NodeEnd) -> RadixNode:
        """What the sequence holds now becomes the node (``tokens``: unused, it is all)."""
        return self.cache.add(self.seq, end.label, self._cuts, end.template_sha256, end.approx)


@contextmanager
def forked_slot(cache: RadixCache, seqs: SequenceOps, seq_tokens: SequenceTokens,
                ctx: NativeContext, evaluate: Evaluate, batching: BatchPolicy, cells: int,
                promote: Sequence[RadixNode | None] = ()) -> Iterator[ForkedSlot]:
    """A slot on a sequence the cache lends, with room for ``cells`` more cells; the nodes in
    ``promote`` (the run's reuse) are made resident first, since promoting takes cells too."""
    with cache.busy(*promote):  # making room must not evict what the run reuses
        for node in promote:
            if node is not None:
                cache.materialise(node)
        empty = seqs.used_cells() == 0
        cache.ensure_free_cells(cells)
        seq = cache.take_work_seq()
    try:
        yield ForkedSlot(seq, cache, seqs, seq_tokens, ctx, evaluate, batching, empty)
    finally:
        cache.give_back(seq)
