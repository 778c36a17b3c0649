"""The KV Cache dock: every cell of the KV cache, coloured by the radix-cache node it belongs to,
and the sequence operations on the user's sequence.

The grid (kv_grid.py) colours each cell by the radix node it belongs to, gathering cells into
blocks when the context has more than the dock has room for; the map (kv_map.py) zooms and
scrolls it. Sequences that hold radix nodes belong to the cache: the Cache panel evicts them,
and this dock's operations refuse to change them (they can be forked into the user's
sequence 0).

What it draws comes from the cache watch (cache_watch.py), the same pictures the Cache panel
draws: read after every job that can change cells (a model load included) and published by
the engine while jobs run, at most ~20 times a second. When the engine has only position
ranges (source "ranges"), the dock says so and draws no cell map. The legend lists every
sequence in use and scrolls; a splitter between it and the map sets their shares.
"""
from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QDockWidget, QFrame, QGridLayout, QHBoxLayout, QLabel,
                               QPushButton, QScrollArea, QSpinBox, QSplitter, QVBoxLayout,
                               QWidget)

from .byte_sizes import size_text
from ..engine import kv_flows
from ..engine.kv.kv_view import KvCacheView
from ..engine.kv_flows import SeqNode
from .cache_watch import CachePicture, CacheWatch
from .engine_worker import EngineWorker, JobKind
from .kv_grid import EMPTY, KvGrid, seq_color
from .kv_map import KvMap
from .model_events import follow
from .setting_boxes import grouped

__all__ = ["EMPTY", "KvCacheDock", "seq_color"]
LEGEND_LINES = 5


class KvCacheDock(QDockWidget):
    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__("KV Cache", parent)
        self.setObjectName("kvCacheDock")
        self.worker = worker  # to act: reads and operations are its jobs
        self.engine_status = worker.engine_status  # to know: a model loaded
        self.watch = CacheWatch.of(worker)  # the pictures of the cells, shared with the Cache panel
        self.view: KvCacheView | None = None
        self.nodes: dict[int, SeqNode] = {}
        self._noted = False  # the status line shows a note on the selected sequence
        self._build()
        self.watch.arrived.connect(self.show_picture)
        follow(self, self.engine_status.events.info, self._model_changed)
        if self.engine_status.info is not None:
            self._model_changed(self.engine_status.info)
            self.refresh()

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
        self.map = KvMap(self.grid)  # zoom and scroll: 32k cells are gathered into blocks
        self.legend = QLabel("")
        self.legend.setObjectName("kvLegend")
        self.legend.setTextFormat(Qt.RichText)
        self.legend.setWordWrap(True)
        self.legend.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.legend.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # every sequence is listed: the legend scrolls rather than cutting the list short
        self.legend_area = QScrollArea()
        self.legend_area.setObjectName("kvLegendArea")
        self.legend_area.setWidgetResizable(True)
        self.legend_area.setFrameShape(QFrame.NoFrame)
        self.legend_area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.legend_area.setWidget(self.legend)
        # room for a few entries whole (each may wrap onto a second line); the map zooms
        self.legend_area.setMinimumHeight(LEGEND_LINES * self.fontMetrics().lineSpacing() + 4)
        self.map_split = QSplitter(Qt.Vertical)
        self.map_split.setObjectName("kvMapSplit")
        self.map_split.addWidget(self.map)
        self.map_split.addWidget(self.legend_area)
        self.map_split.setStretchFactor(0, 1)
        self.map_split.setStretchFactor(1, 1)
        self.map_split.setSizes([250, 250])  # shares, not pixels: half each
        self.map_split.setCollapsible(0, False)
        lay.addWidget(self.summary)
        lay.addWidget(self.note)
        lay.addWidget(self.map_split, 1)

        ops = QGridLayout()
        self.seq_box = QComboBox()
        self.seq_box.setObjectName("kvSequence")
        self.seq_box.setToolTip("The sequence the operations below act on (or click a cell)")
        self.seq_box.currentIndexChanged.connect(lambda _i: self._enable_for_seq())
        ops.addWidget(QLabel("Sequence"), 0, 0)
        ops.addWidget(self.seq_box, 0, 1)

        def spin(lo, hi, val, tip):
            s = grouped(QSpinBox())
            s.setRange(lo, hi)
            s.setValue(val)
            s.setToolTip(tip)
            return s

        self.fork_btn = self._button("Fork to sequence 0", "Share this sequence's cells with "
                                     "your sequence 0, if it is empty (seq_cp: nothing is copied)")
        self.keep_btn = self._button("Keep only this", "Sequence 0 only: drop every other "
                                     "sequence (seq_keep), which empties the radix cache")
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
        # three columns, so that the dock fits the window's right-hand column (about 450 pixels)
        ops.addWidget(self.fork_btn, 0, 2)
        ops.addWidget(self.keep_btn, 1, 0)
        ops.addWidget(self.clear_btn, 1, 1)
        ops.addWidget(self.trim_btn, 2, 0)
        ops.addWidget(self.trim_pos, 2, 1)
        for r, (button, start, amount) in enumerate(((self.shift_btn, self.shift_from, self.shift_delta),
                                                     (self.div_btn, self.div_from, self.div_by)), 3):
            ops.addWidget(button, r, 0)
            row = QHBoxLayout()
            for w in (QLabel("from p"), start, QLabel("by"), amount):
                row.addWidget(w)
            row.addStretch(1)
            ops.addLayout(row, r, 1, 1, 2)
        lay.addLayout(ops)
        self.status = QLabel("")
        self.status.setObjectName("kvStatus")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.setWidget(box)

        self.fork_btn.clicked.connect(self.fork_selected)
        self.keep_btn.clicked.connect(lambda: self._op("keep only", kv_flows.keep_only))
        self.clear_btn.clicked.connect(lambda: self._op("clear", kv_flows.clear_sequence))
        self.trim_btn.clicked.connect(lambda: self._op("trim", kv_flows.trim, self.trim_pos.value()))
        self.shift_btn.clicked.connect(lambda: self._op(
            "shift", kv_flows.shift, self.shift_from.value(), self.shift_delta.value()))
        self.div_btn.clicked.connect(lambda: self._op(
            "divide", kv_flows.divide, self.div_from.value(), self.div_by.value()))
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
        seq = self.seq_box.currentData()
        return 0 if seq is None else seq

    def select_seq(self, seq: int) -> None:
        i = self.seq_box.findData(seq)
        if i < 0:  # not in use yet: listed until the next view says otherwise
            self._list_sequences(sorted({*self._listed(), seq}))
            i = self.seq_box.findData(seq)
        self.seq_box.setCurrentIndex(i)
        self._enable_for_seq()

    def _listed(self) -> list[int]:
        return [self.seq_box.itemData(i) for i in range(self.seq_box.count())]

    def _list_sequences(self, seqs: list[int]) -> None:
        """The box lists these sequences (0, the user's, always), the selected one kept."""
        if seqs == self._listed():
            return
        keep = self.selected_seq
        was = self.seq_box.blockSignals(True)
        try:
            self.seq_box.clear()
            for s in seqs:
                self.seq_box.addItem(str(s), s)
            self.seq_box.setCurrentIndex(max(self.seq_box.findData(keep), 0))
        finally:
            self.seq_box.blockSignals(was)

    def _enable_for_seq(self) -> None:
        """The radix cache's sequences can be forked, not changed; keep-only is sequence 0's."""
        if self.view is None:
            return
        seq = self.selected_seq
        cached = seq in self.nodes
        for b in (self.clear_btn, self.trim_btn, self.shift_btn, self.div_btn):
            b.setEnabled(not cached)
        self.keep_btn.setEnabled(seq == 0)
        self.fork_btn.setEnabled(seq != 0 and self.view.seq(seq) is not None)
        note = (f"sequence {seq} holds the radix cache's “{self.nodes[seq].label}”: fork it, "
                "or evict it in the Cache panel" if cached else "")
        # a note replaces a note; an operation's message stays through the refreshes after it
        if note or self._noted:
            self.status.setText(note)
        self._noted = bool(note)

    def _say(self, text: str) -> None:
        """An operation's message, in the place of the selected sequence's note."""
        self.status.setText(text)
        self._noted = False

    # ---- pictures arriving
    def _model_changed(self, info) -> None:
        # the load's revision bump brings the new engine's picture; the watch sends None on unload
        if info is not None:
            self._list_sequences([0])

    def refresh(self) -> None:
        """Ask for a fresh picture (after the jobs already queued); the Cache panel gets it too."""
        self.watch.refresh()

    def show_picture(self, picture: CachePicture) -> None:
        self.set_view(picture.view, picture.nodes)

    def set_view(self, view: KvCacheView | None, nodes: dict[int, SeqNode] | None = None) -> None:
        self.view = view
        self.nodes = nodes or {}
        if view is not None:  # the sequences in use (and the user's 0), not all the context has
            self._list_sequences(sorted({0, *(u.seq for u in view.sequences),
                                         *(r.seq for r in view.recurrent), *self.nodes}))
        self.grid.set_view(view, self.nodes)
        self.map.show_scale()
        self._set_enabled(view is not None)
        self._enable_for_seq()
        if view is None:
            self.summary.setText("no model loaded")
            self.legend.setText("")
            self.note.setText("")
            return
        used = "?" if view.used_cells is None else f"{view.used_cells:,}"
        used_b = "?" if view.used_bytes is None else size_text(view.used_bytes)
        states = (f"{len(view.recurrent)} recurrent state{'s' if len(view.recurrent) != 1 else ''}"
                  f" ({size_text(sum(r.bytes for r in view.recurrent))})")
        if view.source == "recurrent":  # no attention layers: the states are all there is
            self.summary.setText(f"{states} · no attention cells · source: {view.source}")
        else:
            self.summary.setText(f"{used} / {view.n_cells:,} cells used · {used_b} of "
                                 f"{size_text(view.total_bytes)}"
                                 + (f" · recurrent {size_text(sum(r.bytes for r in view.recurrent))}"
                                    if view.stateful else "")
                                 + f" · source: {view.source}")
        ranges = view.source == "ranges"
        self.note.setText(f"Position ranges only, no cell map: {view.note}. Cells are counted "
                          "from each range; shared and used cells are unknown." if ranges else "")
        self.note.setVisible(ranges)
        rows = []
        usage = {u.seq: u for u in view.sequences}  # 64 sequences: no search per row
        slots = {r.seq: r for r in view.recurrent}
        for s in sorted({*usage, *slots}):
            u, slot = usage.get(s), slots.get(s)
            mark = " ◀" if s == self.selected_seq else ""
            node = self.nodes.get(s)
            what = node.describe() if node else f"seq {s}"
            parts = []
            if u is not None:
                shared = "? shared" if u.shared_cells is None else f"{u.shared_cells:,} shared"
                parts.append(f"{u.cells:,} cells · positions {u.pos_min:,}–{u.pos_max:,} · {shared}")
            if slot is not None:  # a hybrid's or recurrent model's state of this sequence
                parts.append(f"recurrent state at {slot.pos:,} ({size_text(slot.bytes)})")
            rows.append(f"<span style='color:{seq_color(s).name()}'>■</span> {escape(what)}: "
                        f"{' · '.join(parts)}{mark}")
        if view.has_cells and view.used_cells is not None:
            free = view.n_cells - view.used_cells
            rows.insert(0, f"<span style='color:{EMPTY}'>■</span> empty: {free:,} free "
                        f"cell{'s' if free != 1 else ''}")
        if view.stateful:
            rows.insert(0, f"layers: {escape(view.layers)}")
        legend = "<br>".join(rows) or "all sequences are empty"
        if legend != self.legend.text():  # live pictures: lay out 64 rows only when they change
            self.legend.setText(legend)
        for i, s in enumerate(self._listed()):
            u, node = usage.get(s) or slots.get(s), self.nodes.get(s)
            text = f"{s}" + (f" · {node.label}" if node else "" if u else " (empty)")
            if self.seq_box.itemText(i) != text:
                self.seq_box.setItemText(i, text)

    # ---- operations on the selected sequence (run on the worker, queued after running jobs)
    def _cell_clicked(self, cell: int) -> None:
        owners = self.view.owners(cell) if self.view else []
        if owners:
            pos = int(self.view.cell_pos[cell])
            node = [s for s in owners if s in self.nodes and
                    self.nodes[s].start <= pos < self.nodes[s].end]
            self.select_seq((node or owners)[0])
            self.set_view(self.view, self.nodes)

    def fork_selected(self) -> None:
        if self.view and self.view.seq(0) is not None:
            self._say("Sequence 0 is in use: clear it first, then fork into it.")
            return
        self._op("fork to 0", kv_flows.fork_to_user)

    def _op(self, name: str, flow, *args) -> None:
        """Run ``flow(engine, seq, *args)`` on the selected sequence; the flow decides, when
        the job runs, whether that sequence may change (the view the buttons followed may be
        old)."""
        seq = self.selected_seq
        self._say(f"{name} sequence {seq}…")
        self.watch.submit(lambda engine: flow(engine, seq, *args), kind=JobKind.KV_OP,
                          label=f"KV {name}", on_done=lambda _picture: self._say(f"{name}: done"),
                          on_error=self._say)
