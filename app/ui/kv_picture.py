"""The KV map's colours and its picture: a colour per sequence, each cell's sequence (its radix
node's, else its lowest owner's) and hatching, and the image of rows of blocks built with numpy
from one entry per block (app/engine/kv/cell_blocks.py), never one widget or one draw per cell."""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QColor, QImage

from ..engine.kv import cell_blocks
from ..engine.kv.cell_blocks import CellBlocks
from ..engine.kv.cell_ledger import is_shared, lowest_bit
from ..engine.kv_flows import SeqNode
from .kv_layout import MapLayout

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#393b79"]
EMPTY = "#d4d4d4"
UNREPORTED = ("#6e6e6e", "#f4f4f4")  # striped: a used cell whose owners are not reported
BACKGROUND = "#ffffff"


def cell_colours(owners: np.ndarray, pos: np.ndarray,
                 nodes: dict[int, SeqNode]) -> tuple[np.ndarray, np.ndarray]:
    """(primary, secondary) sequence per cell, -1 for none: the primary is the node holding
    the cell's position in its own range, else the lowest owner; the secondary, for hatching,
    the lowest other owner that holds no node."""
    primary = np.full(owners.shape, -1, dtype=np.int64)
    used = owners != 0
    if used.any():
        primary[used] = lowest_bit(owners[used])
    node_bits = np.uint64(0)
    for s in nodes:
        node_bits |= np.uint64(1) << np.uint64(s)
    # a cell of one owner is that owner's already: only shared cells can be a node's instead
    shared = np.flatnonzero(is_shared(owners))
    if len(shared) and nodes:
        own, at = owners[shared], pos[shared]
        for s, n in nodes.items():
            mine = ((own & (np.uint64(1) << np.uint64(s))) != 0) & (at >= n.start) & (at < n.end)
            primary[shared[mine]] = s
    others = owners & ~node_bits
    has = primary >= 0
    others[has] &= ~(np.uint64(1) << primary[has].astype(np.uint64))
    secondary = np.full(owners.shape, -1, dtype=np.int64)
    rest = others != 0
    if rest.any():
        secondary[rest] = lowest_bit(others[rest])
    return primary, secondary


def seq_color(seq: int) -> QColor:
    if seq < len(PALETTE):
        return QColor(PALETTE[seq])
    return QColor.fromHsvF((seq * 0.618034) % 1.0, 0.65, 0.85)


def _rgb(c: QColor | str) -> int:
    return QColor(c).rgb() & 0xFFFFFFFF


def _block_colours(blocks: CellBlocks, lo: int, hi: int):
    """Of blocks ``lo``..``hi`` - 1: their colour, their corner's (a mixed block's next most
    common occupant), their stripes' (hatched), the corner's share of the block, and which
    are mixed."""
    table = np.array([_rgb(UNREPORTED[0]), _rgb(EMPTY)]
                     + [_rgb(seq_color(s)) for s in range(64)], dtype=np.uint32)
    first, second = blocks.first[lo:hi], blocks.second[lo:hi]
    fill = table[first + 2]
    mixed = second != cell_blocks.NONE
    corner = np.where(mixed, table[np.where(mixed, second, 0) + 2], fill)
    hatch = blocks.hatch[lo:hi]
    stripe = np.where(hatch >= 0, table[np.maximum(hatch, 0) + 2], fill)
    stripe[first == cell_blocks.UNREPORTED] = _rgb(UNREPORTED[1])
    share = blocks.second_count[lo:hi] / blocks.k
    return fill, corner, stripe, share, mixed


def block_image(blocks: CellBlocks, lay: MapLayout, r0: int, r1: int) -> QImage:
    """The rows ``r0``..``r1`` - 1 of ``blocks`` laid out as ``lay``, as one image."""
    cs, cols = lay.px, lay.cols
    lo, hi = r0 * cols, min(r1 * cols, len(blocks))
    n = r1 * cols - lo
    fill, corner, stripe, share, mixed = _block_colours(blocks, lo, hi)
    bg = np.uint32(_rgb(BACKGROUND))

    def grid(a, pad):
        out = np.full(n, pad, dtype=a.dtype)
        out[:len(a)] = a
        return np.repeat(np.repeat(out.reshape(r1 - r0, cols), cs, 0), cs, 1)

    px = grid(fill, bg)
    # per-pixel patterns from one row and one column of coordinates, broadcast
    xs = np.arange(px.shape[1])
    ys = np.arange(px.shape[0]) + r0 * cs  # the hatching lines up across rows painted apart
    if (stripe != fill).any():
        hatch = ((xs[None, :] + ys[:, None]) % 4 < 2) if cs >= 4 else \
            ((xs[None, :] + ys[:, None]) % 2 == 0)
        px = np.where(hatch, grid(stripe, bg), px)
    if mixed.any():
        # the corner's area is the runner-up's share of the block: a right triangle of legs
        # L holds L^2 / 2 of the drawn square's d^2 pixels (2 pixels at least, to be seen)
        drawn = cs - 1 if cs >= 4 else cs
        legs = np.where(mixed, np.maximum(np.ceil(drawn * np.sqrt(2 * share)), 2), 0)
        from_corner = (drawn - 1 - xs % cs)[None, :] + (drawn - 1 - ys % cs)[:, None]
        px = np.where(from_corner < grid(legs.astype(np.int64), 0), grid(corner, bg), px)
    if cs >= 4:  # a one-pixel gap between blocks
        px[:, cs - 1::cs] = bg
        px[cs - 1::cs, :] = bg
    px = np.ascontiguousarray(px)
    img = QImage(px.data, px.shape[1], px.shape[0], px.shape[1] * 4, QImage.Format_RGB32)
    return img.copy()  # own the pixels: px goes away
