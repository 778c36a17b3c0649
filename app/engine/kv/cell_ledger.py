"""The cells each sequence holds, as llama.cpp's memory operations define them: a position and
a set of owners per cell, and nothing about *where* a cell lies.

Where cells land is llama.cpp's business (find_slot); only its own report says so
(cell_report.py). What a cell holds, though, follows from the operations alone: a decode adds
one cell per token owned by the token's sequences, seq_cp adds an owner, seq_rm removes one,
seq_keep keeps one, seq_add/seq_div move positions. This ledger applies exactly those rules.
It answers what placement does not decide (how many cells are used, by whom, which sequences
share a cell at a position) and lets the view name the owners of a shared cell, which
llama.cpp's map prints as "M". The engine's sequence owner (sequence_ops.py) is the only
writer, through the cache context (kv_debug_log.TrackedContext).

Its arrays are an unordered pool: index i is not cell i. Owners are a bitmask per entry
(sequence s is bit s), so a 8,192-cell ledger is a few numpy operations.
"""
from __future__ import annotations

import numpy as np

MAX_SEQ = 64  # the engine allows 1 to 64 sequences: one uint64 bit each


class CellLedger:
    def __init__(self, size: int):
        self.size = size
        self.pos = np.full(size, -1, dtype=np.int64)
        self.owners = np.zeros(size, dtype=np.uint64)
        # a cell was freed since the cache was last empty: cells filled in order from an empty
        # cache have no free cell between used ones until one is freed (see has_holes)
        self.freed = False

    def used(self, ignoring: int | None = None) -> int:
        """Cells holding some sequence's tokens (besides sequence ``ignoring``'s)."""
        if ignoring is None:
            return int(np.count_nonzero(self.owners))
        return int(np.count_nonzero(self.owners & ~_bit(ignoring)))

    # ---- the memory operations, with llama.cpp's semantics (llama-kv-cache.cpp, -kv-cells.h)
    def add(self, entries) -> None:
        """New cells: (position, seq ids) each (a decode, or a state's cells put back)."""
        if not entries:
            return
        free = np.flatnonzero(self.owners == 0)[:len(entries)]
        if len(free) < len(entries):  # llama.cpp placed them, so it had room: grow the pool
            self._grow(len(entries) - len(free))
            free = np.flatnonzero(self.owners == 0)[:len(entries)]
        for idx, (pos, seqs) in zip(free.tolist(), entries):
            mask = 0
            for s in seqs:
                mask |= 1 << s
            self.pos[idx] = pos
            self.owners[idx] = np.uint64(mask)

    def _grow(self, n: int) -> None:
        self.pos = np.concatenate([self.pos, np.full(n, -1, dtype=np.int64)])
        self.owners = np.concatenate([self.owners, np.zeros(n, dtype=np.uint64)])

    def _in(self, seq: int, p0: int, p1: int) -> np.ndarray:
        lo = 0 if p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        sel = (self.pos >= lo) & (self.pos < hi) & (self.owners != 0)
        if seq >= 0:
            sel &= (self.owners & _bit(seq)) != 0
        return sel

    def _emptied(self, sel: np.ndarray) -> None:
        freed = sel & (self.owners == 0)
        if freed.any():
            self.pos[freed] = -1
            self.freed = True

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        sel = self._in(seq, p0, p1)
        if seq < 0:
            self.owners[sel] = 0
        else:
            self.owners[sel] &= ~_bit(seq)
        self._emptied(sel)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.owners[self._in(src, p0, p1)] |= _bit(dst)

    def seq_keep(self, seq: int) -> None:
        had = self.owners != 0
        mine = (self.owners & _bit(seq)) != 0
        self.owners[had & ~mine] = 0
        self.owners[mine] = _bit(seq)
        self._emptied(had & ~mine)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        sel = self._in(seq, p0, p1)
        self.pos[sel] += delta
        gone = sel & (self.pos < 0)  # llama.cpp frees a cell shifted below 0, for all owners
        self.owners[gone] = 0
        self._emptied(gone)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        sel = self._in(seq, p0, p1)
        self.pos[sel] //= d

    def clear(self) -> None:
        self.pos[:] = -1
        self.owners[:] = 0
        self.freed = False

    # ---- questions
    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, owner masks) of the used cells, in no particular order."""
        used = self.owners != 0
        return self.pos[used].copy(), self.owners[used].copy()


def _bit(seq: int) -> np.uint64:
    return np.uint64(1 << seq)


def lowest_bit(masks: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) uint64."""
    low = masks & (~masks + np.uint64(1))
    return np.log2(low.astype(np.float64)).round().astype(np.int64)


def is_shared(masks: np.ndarray) -> np.ndarray:
    """Which (non-zero) owner masks name more than one sequence."""
    return (masks != 0) & ((masks & (masks - np.uint64(1))) != 0)
