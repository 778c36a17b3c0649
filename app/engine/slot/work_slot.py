"""The work context as a run's slot: cells where a cold run puts them (work_context.py)."""
from __future__ import annotations

from collections.abc import Sequence

from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..kv.sequence_ops import SequenceOps
from ..llama.batch_policy import BatchPolicy, chain_marks, chain_node_ends
from ..llama.native import NativeContext
from ..task_state import TaskState
from .run_slot import NodeEnd, Slot
from .work_context import WorkContext


class WorkSlot(Slot):
    windowed = False

    def __init__(self, work: WorkContext, cache: RadixCache, seqs: SequenceOps,
                 batching: BatchPolicy):
        super().__init__(cache, batching)
        self.work, self._seqs = work, seqs

    @property
    def ctx(self) -> NativeContext:
        return self.work.ctx

    @property
    def held(self) -> int:
        return len(self.work.tokens)

    def history(self, end: int) -> list[int]:
        return [c for c in self.work.cuts if c < end]

    def whole(self, hit: CacheHit) -> CacheHit:
        return self.cache.whole_batches(hit)

    def bring(self, hit: CacheHit, tokens: list[int]) -> int:
        """Keep what the work context shares of the hit's history, copy the rest from the
        cache (whole batches: ``whole`` first)."""
        if hit.node is None:
            self.work.keep(0)
            return 0
        return self.cache.hand_out(hit, lambda cuts, fetch, snapshot: self.work.bring(
            tokens, hit.reused, cuts, fetch, snapshot))

    def restore(self, data: bytes, tokens: list[int], reuse: int,
                recurrent: bytes | None = None, cuts: list[int] | None = None) -> int:
        """Hold ``tokens[:reuse]`` from a state of cells computed in batches starting at
        ``cuts`` (None: a saved state, primed in plain batches from position 0); returns the
        tokens restored."""
        if cuts is None:
            cuts = self.batching.saved_state(len(tokens))
        return self.work.restore(data, tokens, cuts, reuse, recurrent)

    def reset(self) -> None:
        """Hold nothing (as a run from a saved state finds it)."""
        self.work.reset()

    def checkpoints(self, tokens: list[int], starts: list[int], task: TaskState | None,
                    depths) -> dict[int, tuple[bytes, bytes | None]]:
        """Evaluate ``tokens`` (batches also ending at every depth) and keep, for each depth,
        a state of the cells before it and the recurrent state there (None: an attention-only
        model); the cache is not touched."""
        work = self.work
        work.evaluate(tokens, starts, task, stage="prime", want_logits=False, snap_at=depths)
        return {n: (work.cells(0, n), work.snapshots.get(n)) for n in depths}

    def place(self, src: int, p0: int, p1: int, at: int, tokens: list[int]) -> None:
        self.work.append_cells(self._seqs.cells_of(src, p0, p1, self.cache.scratch), tokens,
                               [at], shift=at - p0)

    @property
    def can_hold(self) -> bool:
        return self.work.can_hold

    def hold(self, src: int, p0: int, p1: int, at: int) -> None:
        self.work.hold(self._seqs.cells_of(src, p0, p1, self.cache.scratch), p0, p1, at - p0)

    def take_held(self, tokens: list[int]) -> None:
        self.work.take_held(tokens)

    def drop_held(self) -> None:
        self.work.drop_held()

    def marks(self, segment_starts: Sequence[int], reused: int, end: int,
              storing: bool, reusable: int | None = None) -> list[int]:
        return chain_marks(segment_starts, reused, storing=storing,
                           grouping_exact=self.work.grouping_exact(), reusable=reusable)

    def node_ends(self, segment_ends: Sequence[int], reused: int, end: int,
                  marks: Sequence[int]) -> list[int]:
        return chain_node_ends(segment_ends, reused, end, marks,
                               grouping_exact=self.work.grouping_exact())

    def prime_starts(self, end: int) -> list[int]:
        return self.batching.prime(self.held, end, windowed=False, cache_empty=False)

    def evaluate(self, tokens: list[int], starts: list[int], task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, nodes: Sequence[NodeEnd] = ()):
        """As ``Slot.evaluate``; a stateful model keeps its recurrent state where each node
        ends, and the nodes are stored at ``flush``."""
        out = self.work.evaluate(tokens, starts, task, stage, want_logits,
                                 snap_at=[n.pos for n in nodes])
        self._pending += [(self.work.tokens[:n.pos], n) for n in nodes]
        return out

    def step(self, token: int) -> None:
        self.work.step(token)

    def _store(self, tokens: list[int], end: NodeEnd) -> RadixNode:
        work = self.work
        return self.cache.store(tokens, end.label, end.template_sha256, end.approx,
                                cuts=work.cuts, cells=work.cells,
                                recurrent=work.snapshots.get(len(tokens)))
