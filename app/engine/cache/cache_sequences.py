"""The main context's sequences as the radix cache uses them: which are free, which are lent to
a running job, and the two it keeps for itself.

Sequence 0 stays the user's (KV dock actions, `kvprimer kv`); the last one is scratch (cells
pass through it on their way in or out of a state). Evicted nodes' cells go to a holding
sequence instead of being freed: llama.cpp fills freed cells first, which would put a later
run's cells before its prefix's and change the order of its arithmetic (batch_policy.py);
compaction (cell_compaction.py) frees them all at once, in order. Windowed models have no
holding sequence: they cannot be compacted (a restore misplaces window cells).

This class owns the free list and the lent set; nodes' ``seq`` fields are the tiers'
(cache_tiers.py).
"""
from __future__ import annotations

from ..errors import CacheError
from .engine_access import EngineAccess

MIN_SEQUENCES = 6  # the user's, scratch, holding, a working sequence and two nodes


class CacheSequences:
    def __init__(self, parts: EngineAccess):
        n = parts.n_seq_max
        if n < MIN_SEQUENCES:
            raise CacheError(f"the radix cache needs a context of at least {MIN_SEQUENCES} "
                             f"sequences, not {n}")
        self.parts = parts
        windowed = parts.windowed
        self.scratch = n - 1
        self.holding: int | None = None if windowed else n - 2
        self.free = list(range(n - (2 if windowed else 3), 0, -1))
        self.lent: set[int] = set()  # working sequences handed out and not given back yet

    def pop(self) -> int | None:
        """A free sequence, or None when every one holds a node or is lent."""
        return self.free.pop() if self.free else None

    def put_back(self, seq: int) -> None:
        """A sequence whose cells are the newest (a job's, or a failed promotion's) is free
        again: its cells are freed."""
        self.lent.discard(seq)
        self.parts.seqs.clear(seq)
        self.free.append(seq)

    def lend(self, seq: int) -> int:
        self.lent.add(seq)
        return seq

    def release(self, seq: int) -> None:
        """A node's sequence is no longer needed: its cells go to the holding sequence."""
        if self.holding is not None:
            self.parts.seqs.hold(seq, self.holding)
        else:
            self.parts.seqs.clear(seq)
        self.free.append(seq)

    def forget(self, seq: int) -> None:
        """llama.cpp dropped this sequence's cells: it is free (nothing to clear)."""
        self.free.append(seq)

    def held_cells(self) -> int:
        """Cells only the holding sequence keeps (freed by the next compaction)."""
        if self.holding is None:
            return 0
        return self.parts.seqs.used_cells() - self.parts.seqs.used_cells(ignoring=self.holding)

    def drop_held(self) -> None:
        """Free the held cells where they lie (when a relayout cannot run)."""
        if self.holding is not None:
            self.parts.seqs.clear(self.holding)
