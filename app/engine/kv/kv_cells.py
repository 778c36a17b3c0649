"""A mirror of llama.cpp's KV cell array: each cell's position and owning sequences.

llama.cpp no longer exposes its cells. Its debug log shows them, but only *before* each ubatch
is placed, and a shared cell shows as "M" without its owners. So we keep our own copy: every
operation the engine performs is applied here with llama.cpp's rules (seq_rm, seq_cp, seq_keep,
seq_add, seq_div, clear, and where a ubatch lands), and every cell map llama.cpp logs is checked
against it. A disagreement marks the mirror untrusted; the view then falls back to ranges.

Owners are a bitmask per cell (sequence s is bit s), so a 8,192-cell view is a few numpy ops.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_SEQ = 64  # the engine allows 1 to 64 sequences: one uint64 bit each


@dataclass(frozen=True)
class LoggedMap:
    """One find_slot record of the debug log: the cache before a ubatch was placed."""
    head: int
    used: int
    size: int
    pos: np.ndarray  # int32 per cell, -1 empty
    single: np.ndarray  # int16 per cell: the owner when exactly one, -1 empty, -2 shared ("M")


class CellMirror:
    def __init__(self, size: int):
        self.size = size
        self.pos = np.full(size, -1, dtype=np.int64)
        self.owners = np.zeros(size, dtype=np.uint64)
        self.head = 0
        self.trusted = True
        self.problem = ""  # why it is not trusted, for the user

    # ---- trust
    def distrust(self, why: str) -> None:
        if self.trusted:
            self.trusted, self.problem = False, why

    def reset(self) -> None:
        """An empty cache is known exactly, whatever happened before."""
        self.pos[:] = -1
        self.owners[:] = 0
        self.head = 0
        self.trusted, self.problem = True, ""

    @property
    def used(self) -> int:
        return int(np.count_nonzero(self.owners))

    def has_holes(self) -> bool:
        """Is a free cell followed by a used one (llama.cpp would fill it next)?"""
        used = np.flatnonzero(self.owners)
        return bool(len(used)) and int(used[-1]) + 1 > len(used)

    # ---- checking against what llama.cpp logged
    def check(self, m: LoggedMap) -> None:
        """Compare with a logged map; adopt it outright when it names every owner."""
        if m.size != self.size:
            self.distrust("llama.cpp's cell map has another size than the context")
            return
        shared = m.single == -2
        if not shared.any():
            # no "M" cells: the map alone says everything, so take it (this also recovers trust)
            self.pos[:] = m.pos
            self.owners[:] = 0
            one = m.single >= 0
            self.owners[one] = np.left_shift(np.uint64(1), m.single[one].astype(np.uint64))
            self.trusted, self.problem = True, ""
            return
        if self.trusted and not agrees(self.pos, self.owners, m):
            self.distrust(DISAGREES)

    # ---- placing tokens (llama.cpp's find_slot + apply_ubatch, without SWA)
    def place(self, entries, head: int | None = None, used: int | None = None,
              contiguous: bool = False) -> None:
        """Put (position, seq ids) entries where llama.cpp's find_slot puts them."""
        n = len(entries)
        if n == 0:
            return
        head = self.head if head is None else head
        used = self.used if used is None else used
        if head > used + 2 * n:  # llama.cpp restarts the search at 0 when the front has room
            head = 0
        idxs = self._find(n, head, contiguous)
        if idxs is None:
            self.distrust("could not tell where llama.cpp placed a batch")
            return
        for idx, (pos, seqs) in zip(idxs, entries):
            self.pos[idx] = pos
            mask = 0
            for s in seqs:
                mask |= 1 << s
            self.owners[idx] = np.uint64(mask)
        self.head = idxs[-1] + 1

    def _find(self, n: int, head: int, contiguous: bool) -> list[int] | None:
        size = self.size
        empty = self.owners == 0
        if not contiguous:
            order = np.concatenate([np.arange(head, size), np.arange(0, head)])
            free = order[empty[order]]
            return free[:n].tolist() if len(free) >= n else None
        tested = 0
        cur = head
        while tested < size:
            if cur + n > size:
                tested += size - cur
                cur = 0
                continue
            run = empty[cur:cur + n]
            if run.all():
                return list(range(cur, cur + n))
            bad = int(np.argmin(run))  # the first occupied cell in the window
            tested += bad + 1
            cur += bad + 1
        return None

    # ---- the memory operations, with llama.cpp's semantics
    def _in(self, seq: int, p0: int, p1: int) -> np.ndarray:
        lo = 0 if p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        sel = (self.pos >= lo) & (self.pos < hi) & (self.owners != 0)
        if seq >= 0:
            sel &= (self.owners & np.uint64(1 << seq)) != 0
        return sel

    def _emptied(self, sel: np.ndarray) -> None:
        freed = sel & (self.owners == 0)
        self.pos[freed] = -1
        if freed.any():
            self.head = min(self.head, int(np.argmax(freed)))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        sel = self._in(seq, p0, p1)
        if seq < 0:
            self.owners[sel] = 0
        else:
            self.owners[sel] &= ~np.uint64(1 << seq)
        self._emptied(sel)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.owners[self._in(src, p0, p1)] |= np.uint64(1 << dst)

    def seq_keep(self, seq: int) -> None:
        bit = np.uint64(1 << seq)
        had = self.owners != 0
        mine = (self.owners & bit) != 0
        self.owners[had & ~mine] = 0
        self.owners[mine] = bit
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
        self.reset()

    # ---- questions
    def seq_range(self, seq: int) -> tuple[int, int]:
        mine = (self.owners & np.uint64(1 << seq)) != 0
        if not mine.any():
            return (-1, -1)
        p = self.pos[mine]
        return (int(p.min()), int(p.max()))


DISAGREES = "the engine's record of the cells disagrees with llama.cpp's cell map"


def agrees(pos: np.ndarray, owners: np.ndarray, m: LoggedMap) -> bool:
    """Do these cells look like the logged map: same positions, same single owners, "M" where shared?"""
    single = np.full(len(owners), -1, dtype=np.int64)
    nonzero = owners != 0
    multi = nonzero & ((owners & (owners - np.uint64(1))) != 0)
    one = nonzero & ~multi
    single[one] = _lowest_bit(owners[one])
    single[multi] = -2
    return bool(np.array_equal(single, m.single) and np.array_equal(pos, m.pos))


def _lowest_bit(masks: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) uint64."""
    low = masks & (~masks + np.uint64(1))
    return np.log2(low.astype(np.float64)).round().astype(np.int64)
