"""The KV cell map with its zoom: the grid (kv_grid.py) in a scroll area, a row of zoom buttons,
and a line that says how many cells a block holds.

The whole context fits at first (32k cells gathered into blocks of 8 or more); Ctrl+wheel,
Ctrl+= / Ctrl+- and the buttons zoom in and out, Ctrl+0 and Fit show the whole again. A zoomed
map is taller than the dock and scrolls (the wheel alone scrolls it); zooming keeps the cells
under the mouse, or at the middle, where they were.
"""
from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QFrame, QHBoxLayout, QScrollArea, QToolButton, QVBoxLayout, QWidget

from .kv_grid import KvGrid
from .narrow_widgets import ElidedLabel

SCALE_TIP = ("\nA block shows its most common occupant; a mixed block shows the next most "
             "common in its lower-right corner, as large as its share. Hover a block for its "
             "cells and sequences; Ctrl+wheel, Ctrl+= and Ctrl+- zoom, Ctrl+0 fits.")


class MapScroll(QScrollArea):
    """The grid's scroll area: the viewport is the grid's room; Ctrl+wheel zooms."""

    def __init__(self, grid: KvGrid, zoom, parent: QWidget | None = None):
        super().__init__(parent)
        self.grid, self._zoom = grid, zoom
        self.setObjectName("kvMapScroll")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setWidget(grid)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self.grid.set_room(self.viewport().size())

    def wheelEvent(self, e) -> None:
        if e.modifiers() & Qt.ControlModifier:
            dy = e.angleDelta().y()
            if dy:
                self._zoom(1 if dy > 0 else -1, e.position().toPoint())
            e.accept()
            return
        super().wheelEvent(e)


class KvMap(QWidget):
    def __init__(self, grid: KvGrid | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("kvMap")
        self.grid = grid or KvGrid()
        self.scroll = MapScroll(self.grid, self.zoom_by)
        self.scale = ElidedLabel("")  # a narrow dock elides it, never widens for it
        self.scale.setObjectName("kvScale")
        self.zoom_in = self._button("+", "Zoom in (Ctrl+= or Ctrl+wheel)", lambda: self.zoom_by(1))
        self.zoom_out = self._button("−", "Zoom out (Ctrl+- or Ctrl+wheel)",
                                     lambda: self.zoom_by(-1))
        self.zoom_fit = self._button("Fit", "The whole context (Ctrl+0)", self.reset_zoom)
        self.zoom_in.setObjectName("kvZoomIn")
        self.zoom_out.setObjectName("kvZoomOut")
        self.zoom_fit.setObjectName("kvZoomFit")
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.scale, 1)
        for b in (self.zoom_out, self.zoom_in, self.zoom_fit):
            row.addWidget(b)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(row)
        lay.addWidget(self.scroll, 1)
        seen = set()  # a key bound twice fires neither (the platform's ZoomOut is Ctrl+-)
        for keys, step in ((("Ctrl+=", "Ctrl++", QKeySequence.ZoomIn), 1),
                           (("Ctrl+-", QKeySequence.ZoomOut), -1), (("Ctrl+0",), 0)):
            for k in keys:
                seq = QKeySequence(k)
                if seq.isEmpty() or seq.toString() in seen:
                    continue
                seen.add(seq.toString())
                sc = QShortcut(seq, self)
                sc.setContext(Qt.WidgetWithChildrenShortcut)
                sc.activated.connect(self.reset_zoom if step == 0 else
                                     lambda s=step: self.zoom_by(s))
        self.grid.layout_changed.connect(self.show_scale)
        self.show_scale()

    def _button(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def zoom_by(self, steps: int, at: QPoint | None = None) -> None:
        """Zoom ``steps`` in (or out), keeping the cell at ``at`` (viewport pixels; default the
        middle) where it is."""
        g = self.grid
        vp = self.scroll.viewport()
        at = at if at is not None else QPoint(vp.width() // 2, vp.height() // 2)
        bar = self.scroll.verticalScrollBar()
        cell = g.cell_at(QPoint(at.x(), at.y() + bar.value()))
        g.set_zoom(g.zoom_steps + steps)
        self.show_scale()
        if cell is not None:
            # the scroll area takes the grid's new height when it next lays out
            QTimer.singleShot(0, lambda: bar.setValue(g.cell_rect_center(cell).y() - at.y()))

    def reset_zoom(self) -> None:
        self.grid.set_zoom(0)
        self.scroll.verticalScrollBar().setValue(0)
        self.show_scale()

    def show_scale(self) -> None:
        g = self.grid
        drawn = g.view is not None and g.view.has_cells
        for b in (self.zoom_in, self.zoom_out, self.zoom_fit):
            b.setEnabled(drawn)
        if not drawn:
            self.scale.setText("")
            return
        k = g.cells_per_block
        self.zoom_out.setEnabled(g.zoom_steps > 0)
        self.zoom_fit.setEnabled(g.zoom_steps > 0)
        self.zoom_in.setEnabled(g.zoom_steps < g.max_zoom())
        what = ("1 cell per square" if k == 1 else
                f"1 block = {k:,} cells · ◪ corner: next most common")
        self.scale.setText(what + ("" if g.zoom_steps else " · whole context"))
        self.scale.setToolTip(self.scale.text() + SCALE_TIP)
