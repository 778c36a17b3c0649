"""The KV cache's cells drawn as a grid, coloured by the radix-cache node each belongs to.

A cell takes the colour of the cached prompt (radix node) whose own tokens it holds; the cells a
node shares with its ancestors keep the ancestors' colours, so a chain of cached prompts reads
as segments (static prefix, then each cached value). Cells of other sequences (the user's
sequence 0, a run's working sequence) take their sequence's colour; a cell also held by such a
sequence is hatched. A used cell whose owners llama.cpp's report does not tell (kv_view.py) is
striped grey and white, and a line under the grid says how many there are: never a guessed
colour. The image is built with numpy (8,192 cells redraw in about a millisecond),
not one widget per cell.

On a hybrid or recurrent model, a strip above the cells holds one slot per sequence: its
recurrent state, which has taken in every token up to a position and has the same size at any
length (a recurrent model has that strip only).
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from ..engine.kv.cell_ledger import lowest_bit
from ..engine.kv.kv_view import KvCacheView, RecurrentSlot
from ..engine.kv_flows import SeqNode
from .byte_sizes import size_text

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#393b79"]
EMPTY = "#d4d4d4"
UNREPORTED = ("#6e6e6e", "#f4f4f4")  # striped: a used cell whose owners are not reported
BACKGROUND = "#ffffff"
SLOT_H, SLOT_W, SLOT_GAP = 22, 150, 4  # the recurrent states' strip: pixels


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
    for s, n in nodes.items():
        bit = np.uint64(1) << np.uint64(s)
        node_bits |= bit
        mine = ((owners & bit) != 0) & (pos >= n.start) & (pos < n.end)
        primary[mine] = s
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


class KvGrid(QWidget):
    """One small square per cell: the colour of its radix node (else of its lowest owner),
    hatched when a sequence outside the cache also holds it, grey when empty."""
    cell_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.view: KvCacheView | None = None
        self.nodes: dict[int, SeqNode] = {}
        self._image: QImage | None = None
        self._layout = (0, 1, 0)  # cell size, columns, rows
        self.setMouseTracking(True)
        self.setMinimumSize(200, 120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(420, 300)

    def set_view(self, view: KvCacheView | None, nodes: dict[int, SeqNode] | None = None) -> None:
        self.view = view
        self.nodes = nodes or {}
        self._image = None
        self.update()

    # ---- geometry
    def bottom(self) -> int:
        """Pixels below the cells: the legend line of cells whose owners are not reported."""
        return self.fontMetrics().lineSpacing() + 4 if self.unreported_line() else 0

    def unreported_line(self) -> str:
        n = self.view.unreported_cells if self.view is not None else 0
        return (f"▨ owner not reported: {n:,} used cell{'s' if n != 1 else ''} whose owners "
                "llama.cpp's map does not tell apart") if n else ""

    def top(self) -> int:
        """Pixels above the cells: the recurrent states' strip, on models that have them."""
        return SLOT_H + SLOT_GAP if self.view is not None and self.view.recurrent else 0

    def slot_rects(self) -> list[tuple[RecurrentSlot, int, int]]:
        """(slot, x, width) of each recurrent state shown in the strip (those that fit)."""
        slots = self.view.recurrent if self.view is not None else ()
        if not slots:
            return []
        w = max(40, min(SLOT_W, (self.width() - SLOT_GAP * (len(slots) - 1)) // len(slots)))
        return [(r, i * (w + SLOT_GAP), w) for i, r in enumerate(slots)
                if i * (w + SLOT_GAP) + w <= max(self.width(), w)]

    def slot_at(self, p: QPoint) -> RecurrentSlot | None:
        if not 0 <= p.y() < SLOT_H:
            return None
        return next((r for r, x, w in self.slot_rects() if x <= p.x() < x + w), None)

    def slot_tooltip(self, r: RecurrentSlot) -> str:
        node = self.nodes.get(r.seq)
        who = node.describe() if node else f"sequence {r.seq}"
        return (f"{who}: recurrent state ({self.view.layers}) of {r.bytes:,} bytes, which has "
                f"taken in positions 0–{r.pos:,}; it has this size at any length")

    def cell_size(self) -> tuple[int, int, int]:
        """(pixels per cell, columns, rows): the largest cells with which all fit."""
        n = self.view.n_cells if self.view else 0
        w, h = max(self.width(), 1), max(self.height() - self.top() - self.bottom(), 1)
        for cs in range(16, 1, -1):
            cols = max(1, w // cs)
            rows = -(-n // cols)
            if rows * cs <= h:
                return cs, cols, rows
        cols = max(1, w // 2)
        return 2, cols, -(-n // cols)

    def cell_at(self, p: QPoint) -> int | None:
        if not self.view or not self.view.has_cells:
            return None
        cs, cols, _rows = self.cell_size()
        y = p.y() - self.top()
        col, row = p.x() // cs, y // cs
        if p.x() < 0 or y < 0 or col >= cols:
            return None
        i = row * cols + col
        return i if i < self.view.n_cells else None

    def cell_rect_center(self, cell: int) -> QPoint:
        cs, cols, _rows = self.cell_size()
        return QPoint((cell % cols) * cs + (cs - 1) // 2,
                      self.top() + (cell // cols) * cs + (cs - 1) // 2)

    def tooltip_for(self, cell: int) -> str:
        v = self.view
        if v is None or not v.has_cells:
            return ""
        owners = v.owners(cell)
        if v.cell_unreported is not None and v.cell_unreported[cell]:
            maybe = int(v.cell_possible[cell]) if v.cell_possible is not None else 0
            among = [s for s in range(64) if maybe >> s & 1]
            hint = (f"; one of the owner sets of sequences {', '.join(map(str, among))} at this "
                    "position" if among else "")
            return (f"cell {cell:,}: position {int(v.cell_pos[cell]):,}, owners not reported "
                    "(llama.cpp's map prints \"M\" for every shared cell and runs sequence ids "
                    f"above 9 together){hint}")
        if not owners:
            return f"cell {cell:,}: empty"
        pos = int(v.cell_pos[cell])
        where = f"cell {cell:,}: position {pos:,}"
        node = next((n for s, n in self.nodes.items() if s in owners and n.start <= pos < n.end),
                    None)
        if node is None:
            who = ", ".join(map(str, owners))
            kind = f"shared by sequences {who}" if len(owners) > 1 else f"sequence {who}"
            return f"{where}, {kind}"
        longer = sum(1 for s in owners if s in self.nodes and s != node.seq)
        others = [s for s in owners if s not in self.nodes]
        extra = (f"; shared by {longer} longer cached prompt{'s' if longer > 1 else ''}"
                 if longer else "")
        if others:
            extra += "; also in sequence" + ("s " if len(others) > 1 else " ") + \
                ", ".join(map(str, others))
        return f"{where}, {node.describe()}{extra}"

    # ---- drawing
    def _build_image(self) -> QImage:
        v = self.view
        cs, cols, rows = self.cell_size()
        n = v.n_cells
        primary, secondary = cell_colours(v.cell_owners, v.cell_pos, self.nodes)
        colour = np.full(rows * cols, _rgb(BACKGROUND), dtype=np.uint32)
        colour[:n] = _rgb(EMPTY)
        table = np.array([_rgb(seq_color(s)) for s in range(64)], dtype=np.uint32)
        used = primary >= 0
        colour[:n][used] = table[primary[used]]
        # a cell also held by a sequence outside the cache: striped with that sequence's colour
        stripe = colour.copy()
        hatched = secondary >= 0
        stripe[:n][hatched] = table[secondary[hatched]]
        if v.cell_unreported is not None:
            colour[:n][v.cell_unreported] = _rgb(UNREPORTED[0])
            stripe[:n][v.cell_unreported] = _rgb(UNREPORTED[1])
        px = np.repeat(np.repeat(colour.reshape(rows, cols), cs, 0), cs, 1)
        stripes = np.repeat(np.repeat(stripe.reshape(rows, cols), cs, 0), cs, 1)
        ys, xs = np.indices(px.shape)
        hatch = ((xs + ys) % 4 < 2) if cs >= 4 else ((xs + ys) % 2 == 0)
        px[hatch] = stripes[hatch]
        if cs >= 4:  # a one-pixel gap between cells
            px[(xs % cs == cs - 1) | (ys % cs == cs - 1)] = _rgb(BACKGROUND)
        px = np.ascontiguousarray(px)
        img = QImage(px.data, px.shape[1], px.shape[0], px.shape[1] * 4, QImage.Format_RGB32)
        return img.copy()  # own the pixels: px goes away

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), QColor(BACKGROUND))
        v = self.view
        if v is not None and v.recurrent:
            self._draw_slots(p)
            p.setPen(self.palette().text().color())
        below = self.rect().adjusted(8, 8 + self.top(), -8, -8)
        if v is None:
            p.drawText(self.rect(), Qt.AlignCenter, "no model loaded")
        elif v.source == "recurrent":
            p.drawText(below, Qt.AlignCenter | Qt.TextWordWrap,
                       f"No cells: this model's layers ({v.layers.removeprefix('no attention, ')})"
                       " keep one recurrent state per sequence, shown above.")
        elif not v.has_cells:
            p.drawText(below, Qt.AlignCenter | Qt.TextWordWrap,
                       f"No cell map to draw: llama.cpp could not be asked for its own ({v.note})."
                       " The legend shows each sequence's position range only.")
        else:
            if self._image is None or self._layout != self.cell_size():
                self._layout = self.cell_size()
                self._image = self._build_image()
            p.drawImage(0, self.top(), self._image)
            line = self.unreported_line()
            if line:
                p.setPen(self.palette().text().color())
                # a narrow dock elides it; the bottom strip's tooltip holds the whole line
                room = self.rect().adjusted(4, 0, -4, -2)
                line = self.fontMetrics().elidedText(line, Qt.ElideRight, room.width())
                p.drawText(room, Qt.AlignBottom | Qt.AlignLeft, line)
        p.end()

    def _draw_slots(self, p: QPainter) -> None:
        for r, x, w in self.slot_rects():
            colour = seq_color(r.seq)
            p.fillRect(x, 0, w, SLOT_H, colour)
            p.setPen(QColor("#000000") if colour.lightnessF() > 0.6 else QColor("#ffffff"))
            p.drawText(x + 4, 0, w - 8, SLOT_H, Qt.AlignVCenter | Qt.AlignLeft,
                       f"seq {r.seq} · at {r.pos:,} · {size_text(r.bytes)}")

    def resizeEvent(self, event) -> None:
        self._image = None
        super().resizeEvent(event)

    def event(self, e) -> bool:
        if e.type() == QEvent.ToolTip:
            slot = self.slot_at(e.pos())
            if slot is not None:
                QToolTip.showText(e.globalPos(), self.slot_tooltip(slot), self)
                return True
            cell = self.cell_at(e.pos())
            line = self.unreported_line()
            if cell is None and line and e.pos().y() >= self.height() - self.bottom():
                QToolTip.showText(e.globalPos(), line, self)
            elif cell is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(e.globalPos(), self.tooltip_for(cell), self)
            return True
        return super().event(e)

    def mousePressEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is not None:
            self.cell_clicked.emit(cell)
        super().mousePressEvent(e)
