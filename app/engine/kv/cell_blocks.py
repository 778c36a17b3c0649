"""The KV cells gathered into blocks of ``k`` consecutive cells, for a map that has fewer pixels
than the context has cells (32k cells in a dock a few hundred pixels wide).

Each cell has one key: the sequence it is drawn as (0..63), ``EMPTY`` or ``UNREPORTED``
(a used cell whose owners llama.cpp does not tell, kv_view.py). A block is drawn by its most
common key and, when its cells are mixed, the next most common, so a sequence's end or a
sparse block stays visible however far out the map is; a block is hatched when most of its
cells are also held by a sequence outside the cache (the cell map's hatching). Everything is
counted with numpy over the whole context at once: the cost is O(cells) arithmetic and the
result has one entry per block, whatever the drawing does with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = -1
UNREPORTED = -2
NONE = -3  # no runner-up (a block of one key), no hatching
_SHIFT = 2  # keys -2..63 counted at 0..65
_KEYS = 64 + _SHIFT
_PAD = -9  # past the last cell, in the last block
SMALL_K = 16  # blocks up to this many cells are counted pairwise


@dataclass(frozen=True)
class CellBlocks:
    """Blocks of ``k`` cells over ``n_cells`` cells (the last one may be shorter)."""
    k: int
    n_cells: int
    first: np.ndarray  # int64 per block: the most common key
    second: np.ndarray  # int64 per block: the next most common key, NONE for a block of one
    first_count: np.ndarray  # int64 per block: cells of the most common key
    second_count: np.ndarray  # int64 per block
    hatch: np.ndarray  # int64 per block: the sequence its cells are hatched with, NONE if not

    def __len__(self) -> int:
        return len(self.first)

    def cells(self, block: int) -> tuple[int, int]:
        """The block's cells: ``a`` to ``b`` - 1."""
        a = block * self.k
        return a, min(a + self.k, self.n_cells)

    @property
    def mixed(self) -> np.ndarray:
        return self.second != NONE


def cell_keys(primary: np.ndarray, unreported: np.ndarray | None) -> np.ndarray:
    """Each cell's key: its primary sequence (``kv_grid.cell_colours``), ``EMPTY`` (-1) or
    ``UNREPORTED``."""
    keys = primary.astype(np.int64, copy=True)
    if unreported is not None:
        keys[unreported] = UNREPORTED
    return keys


def aggregate(keys: np.ndarray, secondary: np.ndarray, k: int) -> CellBlocks:
    """Blocks of ``k`` cells from each cell's key and hatching sequence (``secondary``, -1 for
    none)."""
    k = max(int(k), 1)
    n = len(keys)
    keys = keys.astype(np.int64, copy=False)
    if k == 1:  # a block per cell: nothing to count
        one = np.ones(n, dtype=np.int64)
        hatch = np.where((secondary >= 0) & (keys >= 0), secondary, NONE).astype(np.int64)
        return CellBlocks(1, n, keys.copy(), np.full(n, NONE, dtype=np.int64), one,
                          np.zeros(n, dtype=np.int64), hatch)
    nb = -(-n // k)
    block = np.arange(n, dtype=np.int64) // k
    first, c1, second, c2 = (_top_two_small if k <= SMALL_K else _top_two_counted)(keys, k, nb)
    hatch = np.full(nb, NONE, dtype=np.int64)
    hatched = secondary >= 0
    if hatched.any():
        hb = np.bincount(block[hatched] * 64 + secondary[hatched], minlength=nb * 64)
        hb = hb.reshape(nb, 64)
        most = hb.argmax(axis=1)
        # hatched when at least half as many of its cells as its own key's are held elsewhere too
        many = (hb.sum(axis=1) * 2 >= c1) & (first >= 0)
        hatch[many] = most[many]
    return CellBlocks(k, n, first.astype(np.int64), second.astype(np.int64), c1.astype(np.int64),
                      c2.astype(np.int64), hatch)


def _top_two_counted(keys: np.ndarray, k: int, nb: int):
    """(first, its count, second, its count) per block from a count of every key per block:
    O(cells + blocks x keys), for large blocks."""
    block = np.arange(len(keys), dtype=np.int64) // k
    counts = np.bincount(block * _KEYS + (keys + _SHIFT), minlength=nb * _KEYS)
    counts = counts.reshape(nb, _KEYS)
    rows = np.arange(nb)
    top = counts.argmax(axis=1)  # ties go to the lower key: empty before a sequence
    c1 = counts[rows, top]
    counts[rows, top] = -1
    nxt = counts.argmax(axis=1)
    c2 = np.maximum(counts[rows, nxt], 0)
    return top - _SHIFT, c1, np.where(c2 > 0, nxt - _SHIFT, NONE), c2


def _top_two_small(keys: np.ndarray, k: int, nb: int):
    """The same from comparing each block's cells pairwise: O(cells x k), for small blocks
    (where the count per key would be mostly zeros)."""
    grid = np.full(nb * k, _PAD, dtype=np.int64)
    grid[:len(keys)] = keys
    grid = grid.reshape(nb, k)
    same = (grid[:, :, None] == grid[:, None, :]).sum(axis=2)
    # the most cells first, then the lower key (as the counted way breaks ties)
    score = np.where(grid == _PAD, -1, same * 128 + (127 - (grid + _SHIFT)))
    rows = np.arange(nb)
    i1 = score.argmax(axis=1)
    first, c1 = grid[rows, i1], same[rows, i1]
    score[grid == first[:, None]] = -1
    i2 = score.argmax(axis=1)
    has = score[rows, i2] >= 0
    return first, c1, np.where(has, grid[rows, i2], NONE), np.where(has, same[rows, i2], 0)


def occupants(keys: np.ndarray, a: int, b: int) -> list[tuple[int, int]]:
    """(key, cells) of cells ``a``..``b`` - 1, the most cells first (a tooltip's figures)."""
    got, counts = np.unique(keys[a:b], return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return [(int(got[i]), int(counts[i])) for i in order]
