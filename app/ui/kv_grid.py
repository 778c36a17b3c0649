"""The KV cache's cells drawn as a grid, coloured by the radix-cache node each belongs to.

A cell takes the colour of the cached prompt (radix node) whose own tokens it holds; the cells a
node shares with its ancestors keep the ancestors' colours, so a chain of cached prompts reads
as segments (static prefix, then each cached value). Cells of other sequences (the user's
sequence 0, a run's working sequence) take their sequence's colour; a cell also held by such a
sequence is hatched. A used cell whose owners llama.cpp's report does not tell (kv_view.py) is
striped grey and white, and a line under the grid says how many there are: never a guessed
colour.

When the context has more cells than the map has room for (32k cells in a dock), consecutive
cells are gathered into blocks (app/engine/kv/cell_blocks.py): a block takes its most common
occupant's colour, and a mixed block shows the next most common in its lower-right corner, as
large as that one's share; its tooltip gives its cells and who holds them. Zooming in
(``zoom_steps``, kv_map.py) halves the cells per block down to one, then enlarges the cells; the
map then grows taller than its room and scrolls. The picture is built with numpy from one entry
per block and only for the rows being painted, and drawn as one image: its cost follows the
blocks shown, never the context's cells (beyond one numpy pass to count them).

On a hybrid or recurrent model, a strip above the cells holds one slot per sequence: its
recurrent state, which has taken in every token up to a position and has the same size at any
length (a recurrent model has that strip only).
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from ..engine.kv import cell_blocks
from ..engine.kv.cell_blocks import CellBlocks
from ..engine.kv.kv_view import KvCacheView, RecurrentSlot
from ..engine.kv_flows import SeqNode
from .byte_sizes import size_text
from .kv_layout import MapLayout, fit_layout, max_zoom_steps, zoomed
from .kv_picture import (BACKGROUND, EMPTY, PALETTE, UNREPORTED, block_image, cell_colours,
                         seq_color)

__all__ = ["BACKGROUND", "EMPTY", "PALETTE", "UNREPORTED", "KvGrid", "cell_colours", "seq_color"]
SLOT_H, SLOT_W, SLOT_GAP = 22, 150, 4  # the recurrent states' strip: pixels


class KvGrid(QWidget):
    """One small square per cell, or per block of cells when they do not fit: the colour of its
    radix node (else of its lowest owner), hatched when a sequence outside the cache also holds
    it, grey when empty."""
    cell_clicked = Signal(int)
    layout_changed = Signal()  # cells per block or block size changed (zoom, room, a new view)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.view: KvCacheView | None = None
        self.nodes: dict[int, SeqNode] = {}
        self.zoom_steps = 0  # 0: the whole context fits the room
        self.room: QSize | None = None  # the scroll area's viewport, when the map is in one
        self._keys: np.ndarray | None = None  # per cell: cell_blocks key
        self._secondary: np.ndarray | None = None
        self._blocks: CellBlocks | None = None
        self._image: tuple | None = None  # ((layout, first row, end row), QImage) last painted
        self._shown: MapLayout | None = None
        self.images_built = 0  # pictures made (a test counts them)
        self.setMouseTracking(True)
        self.setMinimumSize(200, 120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.setFocusPolicy(Qt.ClickFocus)  # the map's zoom keys work once it is clicked

    def sizeHint(self) -> QSize:
        return QSize(420, 300)

    def set_view(self, view: KvCacheView | None, nodes: dict[int, SeqNode] | None = None) -> None:
        self.view = view
        self.nodes = nodes or {}
        self._keys = self._secondary = self._blocks = None
        self._image = None
        self.zoom_steps = min(self.zoom_steps, self.max_zoom())  # another context's size
        self._relayout()
        self.update()

    def set_room(self, room: QSize) -> None:
        """The scroll area's viewport: the whole context fits it when not zoomed."""
        if room != self.room:
            self.room = room
            self._image = None
            self._relayout()

    def set_zoom(self, steps: int) -> None:
        """Zoom ``steps`` in from the whole context (0), within what the view allows."""
        steps = max(0, min(steps, self.max_zoom()))
        if steps != self.zoom_steps:
            self.zoom_steps = steps
            self._relayout()
            self.update()

    def max_zoom(self) -> int:
        return max_zoom_steps(self.fit()) if self._draws_cells() else 0

    def _draws_cells(self) -> bool:
        return self.view is not None and self.view.has_cells

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

    def fit(self) -> MapLayout:
        """The layout with which every cell fits the room (the viewport, else the widget)."""
        n = self.view.n_cells if self.view else 0
        room_h = self.room.height() if self.room is not None else self.height()
        w, h = max(self.width(), 1), max(room_h - self.top() - self.bottom(), 1)
        return fit_layout(n, w, h)

    def map_layout(self) -> MapLayout:
        n = self.view.n_cells if self.view else 0
        return zoomed(self.fit(), self.zoom_steps, n, max(self.width(), 1))

    def cell_size(self) -> tuple[int, int, int]:
        """(pixels per block, columns, rows); a block is one cell unless ``cells_per_block``."""
        lay = self.map_layout()
        return lay.px, lay.cols, lay.rows

    @property
    def cells_per_block(self) -> int:
        return self.map_layout().k

    def _relayout(self) -> None:
        """A zoomed map is taller than its room: the scroll area scrolls it."""
        lay = self.map_layout() if self._draws_cells() else None
        want = (self.top() + lay.height + self.bottom()) if lay and self.zoom_steps else 120
        if self.minimumHeight() != want:
            self.setMinimumHeight(want)
        if lay != self._shown:
            self._shown = lay
            self.layout_changed.emit()

    def blocks(self) -> CellBlocks | None:
        """The cells gathered as the map shows them now (None: no cell map)."""
        if not self._draws_cells():
            return None
        k = self.cells_per_block
        if self._blocks is None or self._blocks.k != k:
            if self._keys is None:
                v = self.view
                primary, self._secondary = cell_colours(v.cell_owners, v.cell_pos, self.nodes)
                self._keys = cell_blocks.cell_keys(primary, v.cell_unreported)
            self._blocks = cell_blocks.aggregate(self._keys, self._secondary, k)
        return self._blocks

    def block_at(self, p: QPoint) -> int | None:
        if not self._draws_cells():
            return None
        lay = self.map_layout()
        y = p.y() - self.top()
        col, row = p.x() // lay.px, y // lay.px
        if p.x() < 0 or y < 0 or col >= lay.cols:
            return None
        b = row * lay.cols + col
        return b if b * lay.k < self.view.n_cells else None

    def cell_at(self, p: QPoint) -> int | None:
        """The cell under ``p``; in a block, the first of its most common occupant's."""
        b = self.block_at(p)
        if b is None:
            return None
        blocks = self.blocks()
        a, end = blocks.cells(b)
        if blocks.k == 1:
            return a
        first = np.flatnonzero(self._keys[a:end] == blocks.first[b])
        return a + int(first[0]) if len(first) else a

    def cell_rect_center(self, cell: int) -> QPoint:
        lay = self.map_layout()
        b = cell // lay.k
        return QPoint((b % lay.cols) * lay.px + (lay.px - 1) // 2,
                      self.top() + (b // lay.cols) * lay.px + (lay.px - 1) // 2)

    def tooltip_at(self, p: QPoint) -> str:
        b = self.block_at(p)
        if b is None:
            return ""
        return self.tooltip_for(b) if self.cells_per_block == 1 else self.block_tooltip(b)

    def who(self, key: int) -> str:
        if key == cell_blocks.EMPTY:
            return "empty"
        if key == cell_blocks.UNREPORTED:
            return "owners not reported"
        node = self.nodes.get(key)
        return node.describe() if node else f"sequence {key}"

    def block_tooltip(self, block: int) -> str:
        """A block's cells, positions and who holds them, the most cells first."""
        v, blocks = self.view, self.blocks()
        a, b = blocks.cells(block)
        head = f"cells {a:,}–{b - 1:,} ({b - a:,} cells)"
        pos = v.cell_pos[a:b]
        pos = pos[pos >= 0]
        if len(pos):
            head += f", positions {int(pos.min()):,}–{int(pos.max()):,}"
        parts = [f"{self.who(key)}: {n:,} cell{'s' if n != 1 else ''}"
                 for key, n in cell_blocks.occupants(self._keys, a, b)]
        mask = int(np.bitwise_or.reduce(v.cell_owners[a:b])) if b > a else 0
        seqs = [s for s in range(64) if mask >> s & 1]
        held = (f"; held by sequence{'s' if len(seqs) > 1 else ''} {', '.join(map(str, seqs))}"
                if seqs else "")
        more = "" if len(parts) <= 6 else f"; and {len(parts) - 6} more"
        return f"{head}: {'; '.join(parts[:6])}{more}{held}"

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
    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(event.rect(), QColor(BACKGROUND))
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
            lay = self.map_layout()
            # only the rows being painted: a zoomed map is far taller than what shows of it
            y0, y1 = event.rect().top() - self.top(), event.rect().bottom() + 1 - self.top()
            r0 = max(0, y0 // lay.px)
            r1 = min(lay.rows, -(-max(y1, 0) // lay.px))
            if r1 > r0:
                key = (lay, r0, r1)
                if self._image is None or self._image[0] != key:
                    self.images_built += 1
                    self._image = (key, block_image(self.blocks(), lay, r0, r1))
                p.drawImage(0, self.top() + r0 * lay.px, self._image[1])
            line = self.unreported_line()
            if line:
                p.setPen(self.palette().text().color())
                # a narrow dock elides it; the bottom strip's tooltip holds the whole line
                room = self.rect().adjusted(4, 0, -4, -2)
                line = self.fontMetrics().elidedText(line, Qt.ElideRight, room.width())
                p.drawText(room, Qt.AlignBottom | Qt.AlignLeft, line)
        p.end()

    def slot_text(self, r: RecurrentSlot, width: int) -> str:
        """The longest of a chip's forms that fits ``width`` pixels, whole (its tooltip has
        the rest); the sequence's number alone, elided, when none does."""
        fm = self.fontMetrics()
        forms = (f"seq {r.seq} · at {r.pos:,} · {size_text(r.bytes)}", f"seq {r.seq} · at {r.pos:,}",
                 f"{r.seq} · {r.pos:,}", f"seq {r.seq}")
        return next((t for t in forms if fm.horizontalAdvance(t) <= width),
                    fm.elidedText(str(r.seq), Qt.ElideRight, width))

    def _draw_slots(self, p: QPainter) -> None:
        for r, x, w in self.slot_rects():
            colour = seq_color(r.seq)
            p.fillRect(x, 0, w, SLOT_H, colour)
            p.setPen(QColor("#000000") if colour.lightnessF() > 0.6 else QColor("#ffffff"))
            p.drawText(x + 4, 0, w - 8, SLOT_H, Qt.AlignVCenter | Qt.AlignLeft,
                       self.slot_text(r, w - 8))

    def resizeEvent(self, event) -> None:
        self._image = None
        super().resizeEvent(event)
        self._relayout()

    def event(self, e) -> bool:
        if e.type() == QEvent.ToolTip:
            slot = self.slot_at(e.pos())
            if slot is not None:
                QToolTip.showText(e.globalPos(), self.slot_tooltip(slot), self)
                return True
            tip = self.tooltip_at(e.pos())
            line = self.unreported_line()
            if not tip and line and e.pos().y() >= self.height() - self.bottom():
                QToolTip.showText(e.globalPos(), line, self)
            elif not tip:
                QToolTip.hideText()
            else:
                QToolTip.showText(e.globalPos(), tip, self)
            return True
        return super().event(e)

    def mousePressEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is not None:
            self.cell_clicked.emit(cell)
        super().mousePressEvent(e)
