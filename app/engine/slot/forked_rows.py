"""A forked batch's slot: k working sequences of the cache's own context, forked from one
resident node, whose rows are evaluated and generated together (runs/forked_runs.py).

Each row gets a sequence the cache lends, forked from the node with seq_cp (the node's cells
are shared, not copied). The rows' suffixes go in through the feeding loop's multi-sequence
form (batch_feed.feed_groups) in the decodes the batch policy plans (``forked_decodes``: each
row cut where its one-by-one warm run cuts it, packed under SMALL_UBATCH when exact); every
generation step is one decode holding a token of each row still generating. The sequences go
back to the cache when the slot closes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..cache.radix_cache import RadixCache
from ..cache.radix_tree import RadixNode
from ..kv.sequence_ops import SequenceOps
from ..kv.sequence_tokens import SequenceTokens
from ..llama.batch_feed import feed_groups, feed_step
from ..llama.batch_policy import BatchPolicy
from ..llama.native import NativeContext
from ..task_state import TaskState


class ForkedRows:
    """Rows 0..k-1, each in a sequence of its own forked from the sequence ``src``."""

    def __init__(self, src: int, seq_ids: list[int], seqs: SequenceOps,
                 seq_tokens: SequenceTokens, ctx: NativeContext, batching: BatchPolicy):
        self._src, self._ids = src, list(seq_ids)
        self._seqs, self._seq_tokens, self._ctx, self.batching = seqs, seq_tokens, ctx, batching

    @property
    def ctx(self) -> NativeContext:
        """The context the rows' logits are read from."""
        return self._ctx

    def seq(self, row: int) -> int:
        """The sequence row ``row`` holds its cells in."""
        return self._ids[row]

    def held(self, row: int) -> int:
        """Tokens row ``row``'s sequence holds, from position 0."""
        return self._seq_tokens.count(self._ids[row])

    def fork(self, reused: Sequence[int]) -> None:
        """Give each row the node's first ``reused[row]`` cells (shared, not copied)."""
        for row, n in enumerate(reused):
            self._seqs.fork(self._src, self._ids[row], upto=n)

    def evaluate(self, prompts: Sequence[Sequence[int]], reused: Sequence[int],
                 marks: Sequence[Sequence[int]], *, exact: bool, task: TaskState | None = None,
                 at_last: Callable[[int, int], None] | None = None) -> int:
        """Append each row's ``prompts[row][reused[row]:]`` in the batch policy's decodes
        (``marks``: each row's segment starts; ``exact``: decodes under SMALL_UBATCH tokens).
        ``at_last(row, i)`` runs once the decode holding a row's last prompt token is in, ``i``
        being that token's index in the decode (its logits). Returns the decodes made."""
        decodes = self.batching.forked_decodes(
            [(row, reused[row], len(p), marks[row]) for row, p in enumerate(prompts)], exact)
        groups = [[(prompts[row][i], i, (self._ids[row],), i == len(prompts[row]) - 1)
                   for row, a, b in group for i in range(a, b)] for group in decodes]
        rows_of = [[row for row, a, b in group for _i in range(a, b)] for group in decodes]

        def after(g: int) -> None:
            if at_last is not None:
                for i, (_t, _p, _s, last) in enumerate(groups[g]):
                    if last:
                        at_last(rows_of[g][i], i)

        feed_groups(self._seqs.decode, groups, task=task, stage="fork", after=after)
        return len(groups)

    def step(self, tokens: Sequence[tuple[int, int]]) -> None:
        """One generation step in one decode: a (row, token) for each row generating; the
        i-th one's logits are the decode's i-th."""
        feed_step(self._seqs.decode,
                  [(token, self.held(row), self._ids[row]) for row, token in tokens])


@contextmanager
def forked_rows(cache: RadixCache, seqs: SequenceOps, seq_tokens: SequenceTokens,
                ctx: NativeContext, batching: BatchPolicy, node: RadixNode, k: int,
                cells: int) -> Iterator[ForkedRows]:
    """``k`` sequences the cache lends, with room for ``cells`` more cells, beside ``node``
    made resident (making room must not evict it); each row still to be forked (``fork``)."""
    ids: list[int] = []
    try:
        with cache.busy(node):
            cache.ensure_free_cells(cells)
            for _ in range(k):
                ids.append(cache.take_work_seq())
            src = cache.materialise(node)
        yield ForkedRows(src, ids, seqs, seq_tokens, ctx, batching)
    finally:
        for seq in ids:
            cache.give_back(seq)
