"""The KV Cache dock: every cell of the KV cache, coloured by owner, and the sequence operations.

The engine publishes a KvCacheView from its own thread while jobs run (Engine.add_kv_listener,
throttled there) and the dock asks for a fresh one after each job; views reach this thread as a
queued signal and are drawn at most ~20 times a second. The grid is one QImage built with numpy
(8,192 cells redraw in about a millisecond), not one widget per cell. When the engine has only
position ranges (source "ranges"), the dock says so and draws no cell map.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import (QComboBox, QDockWidget, QGridLayout, QHBoxLayout, QLabel,
                               QPushButton, QSizePolicy, QSpinBox, QToolTip, QVBoxLayout, QWidget)

from ..engine.kv_cells import _lowest_bit
from ..engine.kv_view import KvCacheView
from .engine_worker import EngineWorker, JobKind

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#393b79"]
EMPTY = "#d4d4d4"
BACKGROUND = "#ffffff"
REDRAW_MS = 50  # at most ~20 redraws a second
OWN_KINDS = (JobKind.KV_VIEW, JobKind.KV_OP, JobKind.LOAD_MODEL)  # return a view, or get one


def seq_color(seq: int) -> QColor:
    if seq < len(PALETTE):
        return QColor(PALETTE[seq])
    return QColor.fromHsvF((seq * 0.618034) % 1.0, 0.65, 0.85)


def _rgb(c: QColor | str) -> int:
    return QColor(c).rgb() & 0xFFFFFFFF


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class KvGrid(QWidget):
    """One small square per cell: colour of its (lowest) owner, hatched when shared, grey empty."""
    cell_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.view: KvCacheView | None = None
        self._image: QImage | None = None
        self._layout = (0, 1, 0)  # cell size, columns, rows
        self.setMouseTracking(True)
        self.setMinimumSize(200, 120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(420, 300)

    def set_view(self, view: KvCacheView | None) -> None:
        self.view = view
        self._image = None
        self.update()

    # ---- geometry
    def cell_size(self) -> tuple[int, int, int]:
        """(pixels per cell, columns, rows): the largest cells with which all fit."""
        n = self.view.n_cells if self.view else 0
        w, h = max(self.width(), 1), max(self.height(), 1)
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
        col, row = p.x() // cs, p.y() // cs
        if p.x() < 0 or p.y() < 0 or col >= cols:
            return None
        i = row * cols + col
        return i if i < self.view.n_cells else None

    def cell_rect_center(self, cell: int) -> QPoint:
        cs, cols, _rows = self.cell_size()
        return QPoint((cell % cols) * cs + (cs - 1) // 2, (cell // cols) * cs + (cs - 1) // 2)

    def tooltip_for(self, cell: int) -> str:
        v = self.view
        if v is None or not v.has_cells:
            return ""
        owners = v.owners(cell)
        if not owners:
            return f"cell {cell:,}: empty"
        who = ", ".join(map(str, owners))
        kind = f"shared by sequences {who}" if len(owners) > 1 else f"sequence {who}"
        return f"cell {cell:,}: position {int(v.cell_pos[cell]):,}, {kind}"

    # ---- drawing
    def _build_image(self) -> QImage:
        v = self.view
        cs, cols, rows = self.cell_size()
        n = v.n_cells
        owners = v.cell_owners
        used = owners != 0
        colour = np.full(rows * cols, _rgb(BACKGROUND), dtype=np.uint32)
        colour[:n] = _rgb(EMPTY)
        table = np.array([_rgb(seq_color(s)) for s in range(64)], dtype=np.uint32)
        if used.any():
            colour[:n][used] = table[_lowest_bit(owners[used])]
        shared = np.zeros(rows * cols, dtype=bool)
        shared[:n] = used & ((owners & (owners - np.uint64(1))) != 0)
        # a shared cell: the lowest owner's colour striped with the next owner's
        stripe = colour.copy()
        if shared.any():
            rest = owners[shared[:n]] & (owners[shared[:n]] - np.uint64(1))
            stripe[:n][shared[:n]] = table[_lowest_bit(rest)]
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
        if v is None:
            p.drawText(self.rect(), Qt.AlignCenter, "no model loaded")
        elif not v.has_cells:
            p.drawText(self.rect().adjusted(8, 8, -8, -8), Qt.AlignCenter | Qt.TextWordWrap,
                       "No cell map to draw: llama.cpp's debug log gives none that can be trusted "
                       f"({v.note}). The legend shows each sequence's position range only.")
        else:
            if self._image is None or self._layout != self.cell_size():
                self._layout = self.cell_size()
                self._image = self._build_image()
            p.drawImage(0, 0, self._image)
        p.end()

    def resizeEvent(self, event) -> None:
        self._image = None
        super().resizeEvent(event)

    def event(self, e) -> bool:
        if e.type() == QEvent.ToolTip:
            cell = self.cell_at(e.pos())
            if cell is None:
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


class KvCacheDock(QDockWidget):
    view_arrived = Signal(object)  # a KvCacheView, emitted from the worker thread (queued)

    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__("KV Cache", parent)
        self.setObjectName("kvCacheDock")
        self.worker = worker
        self.view: KvCacheView | None = None
        self._pending: KvCacheView | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._apply_pending)
        self._build()
        self.view_arrived.connect(self._queue_view)
        worker.engine_changed.connect(self._engine_changed)
        worker.job_finished.connect(self._job_finished)
        if worker.info is not None:
            self._engine_changed(worker.info)

    # ---- widgets
    def _build(self) -> None:
        box = QWidget()
        lay = QVBoxLayout(box)
        self.summary = QLabel("no model loaded")
        self.summary.setObjectName("kvSummary")
        self.note = QLabel("")
        self.note.setObjectName("kvNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #a05a00")
        self.grid = KvGrid()
        self.grid.cell_clicked.connect(self._cell_clicked)
        self.legend = QLabel("")
        self.legend.setObjectName("kvLegend")
        self.legend.setTextFormat(Qt.RichText)
        self.legend.setWordWrap(True)
        lay.addWidget(self.summary)
        lay.addWidget(self.note)
        lay.addWidget(self.grid, 1)
        lay.addWidget(self.legend)

        ops = QGridLayout()
        self.seq_box = QComboBox()
        self.seq_box.setObjectName("kvSequence")
        self.seq_box.setToolTip("The sequence the operations below act on (or click a cell)")
        ops.addWidget(QLabel("Sequence"), 0, 0)
        ops.addWidget(self.seq_box, 0, 1)

        def spin(lo, hi, val, tip):
            s = QSpinBox()
            s.setRange(lo, hi)
            s.setValue(val)
            s.setToolTip(tip)
            return s

        self.fork_btn = self._button("Fork to a free sequence", "Share this sequence's cells with "
                                     "the first empty sequence (seq_cp: nothing is copied)")
        self.keep_btn = self._button("Keep only this", "Drop every other sequence (seq_keep)")
        self.clear_btn = self._button("Clear", "Remove this sequence's cells (seq_rm)")
        self.trim_btn = self._button("Trim from", "Remove this sequence's positions from p on")
        self.trim_pos = spin(0, 1 << 20, 0, "first position removed")
        self.shift_btn = self._button("Shift", "Add delta to positions from p on (seq_add); "
                                      "cells moved below 0 are freed")
        self.shift_from = spin(0, 1 << 20, 0, "p: first position moved")
        self.shift_delta = spin(-(1 << 20), 1 << 20, 0, "delta")
        self.div_btn = self._button("Divide", "Divide positions from p on by d (seq_div)")
        self.div_from = spin(0, 1 << 20, 0, "p: first position divided")
        self.div_by = spin(1, 1 << 16, 2, "d")
        ops.addWidget(self.fork_btn, 0, 2)
        ops.addWidget(self.keep_btn, 0, 3)
        ops.addWidget(self.clear_btn, 0, 4)
        ops.addWidget(self.trim_btn, 1, 0)
        ops.addWidget(self.trim_pos, 1, 1)
        for r, (button, start, amount) in enumerate(((self.shift_btn, self.shift_from, self.shift_delta),
                                                     (self.div_btn, self.div_from, self.div_by)), 2):
            ops.addWidget(button, r, 0)
            row = QHBoxLayout()
            for w in (QLabel("from p"), start, QLabel("by"), amount):
                row.addWidget(w)
            row.addStretch(1)
            ops.addLayout(row, r, 1, 1, 4)
        lay.addLayout(ops)
        self.status = QLabel("")
        self.status.setObjectName("kvStatus")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.setWidget(box)

        self.fork_btn.clicked.connect(self.fork_selected)
        self.keep_btn.clicked.connect(lambda: self._op("keep only", lambda e, s: e.keep_only(s)))
        self.clear_btn.clicked.connect(lambda: self._op("clear", lambda e, s: e.clear_seq(s)))
        self.trim_btn.clicked.connect(
            lambda: self._op("trim", lambda e, s, p=self.trim_pos.value(): e.trim(s, p)))
        self.shift_btn.clicked.connect(lambda: self._op(
            "shift", lambda e, s, p=self.shift_from.value(), d=self.shift_delta.value(): e.shift(s, p, d)))
        self.div_btn.clicked.connect(lambda: self._op(
            "divide", lambda e, s, p=self.div_from.value(), d=self.div_by.value(): e.divide(s, p, d)))
        self._set_enabled(False)

    def _button(self, text: str, tip: str) -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        b.setObjectName("kv" + text.split()[0].capitalize())
        return b

    def _set_enabled(self, on: bool) -> None:
        for w in (self.seq_box, self.fork_btn, self.keep_btn, self.clear_btn, self.trim_btn,
                  self.shift_btn, self.div_btn):
            w.setEnabled(on)

    @property
    def selected_seq(self) -> int:
        return max(self.seq_box.currentIndex(), 0)

    def select_seq(self, seq: int) -> None:
        self.seq_box.setCurrentIndex(seq)

    # ---- views arriving
    def _engine_changed(self, info) -> None:
        if info is None:
            self.set_view(None)
            return
        self.seq_box.clear()
        self.seq_box.addItems([f"{s}" for s in range(info.n_seq_max)])
        def emit(view):  # called on the worker thread; the signal delivers it queued
            try:
                self.view_arrived.emit(view)
            except RuntimeError:  # the dock is gone; the engine outlives it briefly
                pass

        def watch(engine, task):
            engine.add_kv_listener(emit)
            return engine.kv_view()

        self._submit(JobKind.KV_VIEW, watch, on_done=self._show_now)

    def _job_finished(self, job) -> None:
        if job.kind in OWN_KINDS or self.worker.info is None:
            return
        self.refresh()

    def refresh(self) -> None:
        """Ask the worker for a fresh view (after the jobs already queued)."""
        self._submit(JobKind.KV_VIEW, lambda e, t: e.kv_view() if e else None,
                     on_done=self._show_now)

    def _submit(self, kind: JobKind, fn, **kw) -> None:
        """Queue after what runs (never cancel the user's job); nothing once the worker is shut."""
        try:
            self.worker.submit(kind, fn, cancel_running=False, **kw)
        except RuntimeError:
            pass

    def _queue_view(self, view) -> None:
        self._pending = view
        if not self._timer.isActive():
            self._timer.start()

    def _show_now(self, view) -> None:
        self._pending = view
        self._apply_pending()

    def _apply_pending(self) -> None:
        if self._pending is not None:
            self.set_view(self._pending)
            self._pending = None

    def set_view(self, view: KvCacheView | None) -> None:
        self.view = view
        self.grid.set_view(view)
        self._set_enabled(view is not None)
        if view is None:
            self.summary.setText("no model loaded")
            self.legend.setText("")
            self.note.setText("")
            return
        used = "?" if view.used_cells is None else f"{view.used_cells:,}"
        used_b = "?" if view.used_bytes is None else _mb(view.used_bytes)
        self.summary.setText(f"{used} / {view.n_cells:,} cells used · {used_b} of "
                             f"{_mb(view.total_bytes)} · source: {view.source}")
        self.note.setText("" if view.source == "debug-log" else
                          f"Position ranges only, no cell map: {view.note}. Cells are counted "
                          "from each range; shared and used cells are unknown.")
        self.note.setVisible(view.source != "debug-log")
        rows = []
        for u in view.sequences:
            shared = "? shared" if u.shared_cells is None else f"{u.shared_cells:,} shared"
            mark = " ◀" if u.seq == self.selected_seq else ""
            rows.append(f"<span style='color:{seq_color(u.seq).name()}'>■</span> seq {u.seq}: "
                        f"{u.cells:,} cells · positions {u.pos_min:,}–{u.pos_max:,} · {shared}{mark}")
        self.legend.setText("<br>".join(rows) or "all sequences are empty")
        for s in range(self.seq_box.count()):
            u = view.seq(s)
            self.seq_box.setItemText(s, f"{s}" + ("" if u else " (empty)"))

    # ---- operations on the selected sequence (run on the worker, queued after running jobs)
    def _cell_clicked(self, cell: int) -> None:
        owners = self.view.owners(cell) if self.view else []
        if owners:
            self.select_seq(owners[0])
            self.set_view(self.view)

    def fork_selected(self) -> None:
        src = self.selected_seq
        free = [s for s in range(self.seq_box.count()) if self.view and self.view.seq(s) is None]
        if not free:
            self.status.setText("No free sequence to fork into: clear one first.")
            return
        self._op(f"fork to {free[0]}", lambda e, s, d=free[0]: e.fork(s, d), seq=src)

    def _op(self, name: str, fn, seq: int | None = None) -> None:
        seq = self.selected_seq if seq is None else seq

        def job(engine, task):
            fn(engine, seq)
            return engine.kv_view()

        self.status.setText(f"{name} sequence {seq}…")
        self._submit(JobKind.KV_OP, job, label=f"KV {name}",
                     on_done=lambda v: (self.status.setText(f"{name}: done"), self._show_now(v)),
                     on_error=lambda msg: self.status.setText(msg))
