"""The Benchmark view: every row cold and warm per reuse mode, repeated; the prefix-length
sweep; exports.

It shows the session's benchmark and sweep results: time to first token per row grouped by
mode (charts from app.ui.charts), each mode's accuracy (verdict counts, KL divergence, top-1
agreement), a table with readable headers; and exports them. Jobs are started by the window;
while one of its jobs runs, a line above the results says where the whole job is (the status
bar's words, app.engine.task_state.progress_line), and until a benchmark's first row is done its
summary says it runs. The tables' columns and cells are bench_cells.py's.
The repeats, the modes compared and compose's recompute share are the session's options, changed
through SessionEdits (undoable).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
                               QTabWidget, QVBoxLayout, QWidget)

from ..engine import REUSE_MODES, BenchResult, KvPrimerError
from ..engine.benchmarks.bench_export import write_results
from ..engine.session import Session, bench_summary
from ..engine.task_state import Progress, progress_line
from .bench_cells import (ACCURACY_COLUMNS, BENCH_COLUMNS, Cell, cell_text, load_cell,
                          show_cells)
from .charts import COLD, MODE_COLORS, BarSeries, SweepChart, TtftChart, save_chart
from .engine_worker import EngineWorker, Job, JobKind
from .file_folders import FileFolders
from .model_events import follow
from .narrow_widgets import ElidedLabel
from .result_marks import EarlierNote
from .status_bar import one_line
from .compose_columns import recompute_box
from .run_panel import MODE_TIPS, VERDICT_COLORS
from .session_edits import SessionEdits

NO_BENCH = "No benchmark yet: press “Benchmark rows”."
RUNNING = "Benchmarking: each row shows here once it has run in every mode."


class BenchView(QWidget):
    run_requested = Signal()
    sweep_requested = Signal()
    error = Signal(str)

    def __init__(self, session: Session, edits: SessionEdits | None = None,
                 parent: QWidget | None = None, folders: FileFolders | None = None,
                 worker: EngineWorker | None = None):
        super().__init__(parent)
        self.session = session
        self.edits = edits or SessionEdits(session, self)
        self.folders = folders or FileFolders(QSettings("kvprimer", "KV Primer"))
        self.repeat = QSpinBox()
        self.repeat.setRange(1, 50)
        self.repeat.setValue(session.options.repeat)
        self.repeat.setPrefix("repeats: ")
        self.repeat.valueChanged.connect(lambda v: self.edits.set_option("repeat", v, merge=True))
        self.mode_boxes: dict[str, QCheckBox] = {}
        for m in REUSE_MODES:
            box = QCheckBox(m)
            box.setObjectName(f"benchMode_{m}")
            box.setToolTip(MODE_TIPS[m])
            box.toggled.connect(self._modes_toggled)
            self.mode_boxes[m] = box
        self.recompute = recompute_box(session, self.edits, self, bench=True)
        self.run_button = QPushButton("Benchmark rows")
        self.run_button.setToolTip("Run every row cold and warm, repeated (Ctrl+B)")
        self.run_button.clicked.connect(self.run_requested)
        self.sweep_button = QPushButton("Prefix-length sweep")
        self.sweep_button.setToolTip("Time to first token against prefix length, on the current row")
        self.sweep_button.clicked.connect(self.sweep_requested)
        exports = [("Export CSV…", self.export_dialog_data), ("Export charts…", self.export_dialog_charts)]
        top = QHBoxLayout()
        top.addWidget(self.repeat)
        top.addWidget(QLabel("modes:"))
        for box in self.mode_boxes.values():
            top.addWidget(box)
        top.addWidget(self.recompute)
        top.addWidget(self.run_button)
        top.addWidget(self.sweep_button)
        top.addStretch(1)
        self.summary = QLabel(NO_BENCH)
        self.summary.setObjectName("benchSummary")
        self._benching = False  # a benchmark job runs: its summary comes with its first row
        self.summary.setWordWrap(True)
        self.progress = ElidedLabel("")  # one line: the whole of it in its tooltip
        self.progress.setObjectName("benchProgress")
        self.progress.hide()
        below = QHBoxLayout()  # the exports beside the summary: the row above stays narrow
        below.addWidget(self.summary, 1)
        for text, slot in exports:
            b = QPushButton(text)
            b.clicked.connect(slot)
            below.addWidget(b)
        self.chart = TtftChart("Time to first token per row and mode (ms)")
        self.sweep = SweepChart()
        self._table_cells: list[list[Cell]] = []  # what the tables show (see show_cells)
        self._accuracy_cells: list[list[Cell]] = []
        self.accuracy = QTableWidget(0, len(ACCURACY_COLUMNS))
        self.accuracy.setObjectName("accuracyTable")
        self.accuracy.setHorizontalHeaderLabels(ACCURACY_COLUMNS)
        self.accuracy.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.accuracy.horizontalHeader().setStretchLastSection(True)
        self.accuracy.verticalHeader().setVisible(False)
        self.accuracy.setEditTriggers(QTableWidget.NoEditTriggers)
        self.accuracy.setToolTip("Each mode's warm runs against the cold runs: how many were "
                                 "bit-identical, within the model's own noise, or diverged")
        self.table = QTableWidget(0, len(BENCH_COLUMNS))
        self.table.setObjectName("benchTable")
        for c, (_key, header, tip) in enumerate(BENCH_COLUMNS):
            item = QTableWidgetItem(header)
            item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(c, item)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.accuracy.verticalHeader().setDefaultSectionSize(22)
        # tables beside the charts, not above them: on a short screen the rows stay readable
        self.charts = QTabWidget()
        self.charts.setObjectName("benchCharts")
        self.charts.addTab(self.chart, "per row")
        self.charts.addTab(self.sweep, "prefix-length sweep")
        tables = QSplitter(Qt.Vertical)
        tables.addWidget(self.table)
        tables.addWidget(self.accuracy)
        tables.setStretchFactor(0, 2)
        tables.setStretchFactor(1, 1)
        split = QSplitter(Qt.Horizontal)
        split.addWidget(tables)
        split.addWidget(self.charts)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.progress)
        lay.addLayout(below)
        self.earlier = EarlierNote("benchmark")
        lay.addWidget(self.earlier)
        lay.addWidget(split, 1)
        session.events.template.connect(self._mark_earlier)
        session.events.model.connect(lambda _info: self._mark_earlier())
        session.events.bench.connect(self._show_result)
        session.events.sweep.connect(self._show_sweep)
        session.events.options.connect(self._show_options)
        self._show_options(session.options)
        self._show_result(session.bench)
        self.sweep.set_points(session.sweep)
        if worker is not None:
            worker.progress.connect(self.show_progress)
            follow(self, worker.engine_status.events.job, self._job_changed)

    def show_progress(self, job: Job, p: Progress) -> None:
        """A benchmark or sweep in progress: the whole job and the current pass."""
        if job.kind in (JobKind.BENCH, JobKind.SWEEP) and p.stage != "generate":
            self.progress.setText(one_line(job.label, progress_line(job.label, p)))
            self.progress.show()
        if job.kind is JobKind.BENCH and not self._benching:
            self._benching = True
            self._show_summary()

    def _job_changed(self, label: str) -> None:
        if not label:  # no job of the user's runs: the results below are the whole story
            self.progress.hide()
            self._benching = False
            self._show_summary()

    def _show_summary(self) -> None:
        """The benchmark in words; until its first row ends, that one runs (not "No
        benchmark yet" under its progress line)."""
        bench = self.session.bench
        self.summary.setText(bench_summary(bench) if bench else
                             RUNNING if self._benching else NO_BENCH)

    def _show_sweep(self, points) -> None:
        self.sweep.set_points(points)
        if points:  # a new sweep: its chart in front
            self.charts.setCurrentWidget(self.sweep)

    def set_can_run(self, on: bool) -> None:
        self.run_button.setEnabled(on)
        self.sweep_button.setEnabled(on)

    def _show_options(self, o) -> None:
        self.repeat.setValue(o.repeat)
        for m, box in self.mode_boxes.items():
            if box.isChecked() != (m in o.bench_modes):
                box.blockSignals(True)
                box.setChecked(m in o.bench_modes)
                box.blockSignals(False)

    def _modes_toggled(self) -> None:
        modes = tuple(m for m, box in self.mode_boxes.items() if box.isChecked())
        if not modes:  # at least one mode: the box just unticked comes back
            self._show_options(self.session.options)
            self.error.emit("a benchmark needs at least one reuse mode")
            return
        self.edits.set_option("bench_modes", modes, text="choose the benchmark's modes")

    def _mark_earlier(self) -> None:
        """A benchmark of an earlier template, model or settings stays, marked as such."""
        bench = self.session.bench
        self.earlier.show_for([bench.origin] if bench else [], self.session.origin())

    def _show_result(self, result: BenchResult | None) -> None:
        rows = result.rows if result else []
        self._mark_earlier()
        # chain reuses cells in place or copies them: a benchmark of chain alone forks nothing
        self.table.setColumnHidden([k for k, _h, _t in BENCH_COLUMNS].index("restore_ms"),
                                   bool(result) and tuple(result.modes) == ("chain",))
        self._show_chart(result)
        if rows:
            self.charts.setCurrentWidget(self.chart)
        cells = []
        for r in rows:
            color = VERDICT_COLORS.get(r.equivalence, "")
            cells.append([Cell(cell_text(key, getattr(r, key)),
                               key not in ("error", "reuse", "equivalence"),
                               color if key == "equivalence" else "",
                               (r.note or "") if key == "equivalence" and color else "")
                          if key != "load" else load_cell(r)
                          for key, _header, _tip in BENCH_COLUMNS])
        self._table_cells = show_cells(self.table, cells, self._table_cells)
        self._show_accuracy(result)
        self._show_summary()

    def _show_chart(self, result: BenchResult | None) -> None:
        ok = [r for r in (result.rows if result else []) if r.error is None]
        numbers = list(dict.fromkeys(r.row for r in ok))
        if not numbers:
            self.chart.set_series([], [])
            return
        by = {(r.reuse, r.row): r for r in ok}
        cold = {}
        for r in ok:
            cold.setdefault(r.row, r)
        series = [BarSeries("cold", COLD, [cold[n].cold_ms for n in numbers],
                            [cold[n].cold_ms_min for n in numbers],
                            [cold[n].cold_ms_max for n in numbers])]
        for m in result.modes:
            got = [by.get((m, n)) for n in numbers]
            if not any(got):
                continue
            series.append(BarSeries(f"warm: {m}", MODE_COLORS.get(m, COLD),
                                    [g.warm_ms if g else 0.0 for g in got],
                                    [g.warm_ms_min if g else 0.0 for g in got],
                                    [g.warm_ms_max if g else 0.0 for g in got]))
        self.chart.set_series([(f"row {n}", f"{n}") for n in numbers], series, "row")

    def _show_accuracy(self, result: BenchResult | None) -> None:
        modes = list(result.modes) if result else []
        summary = result.summary() if result else {}
        paired = {f.mode: f.ratio for f in result.paired()} if result else {}
        if any(r is not None for r in paired.values()):
            paired["prefix"] = 1.0  # the base of the pairs
        table = []
        for m in modes:
            s = summary.get(m) or {}
            counts = s.get("equivalence", {})

            def num(v, fmt):
                return "—" if v is None else format(v, fmt)

            # compose's trade beside the exact modes: greedy-equal rows, KL, what it recomputed
            # and its time against prefix mode's, from the rows measured side by side
            cells = [m, str(s.get("rows", 0)),
                     *(str(counts.get(w, 0)) for w in ("bit-identical", "within-noise", "diverged")),
                     f"{s.get('tokens_equal_rows', 0)} of {s.get('rows', 0)}",
                     num(s.get("kl_divergence_median"), ".3g"),
                     num(s.get("kl_divergence_max"), ".3g"), num(s.get("top1_agree_mean"), ".0%"),
                     num(s.get("max_logit_diff"), ".3g"),
                     num(s.get("recompute_share_median"), ".0%") if m == "compose" else "—",
                     num(s.get("warm_ms_median"), ",.1f"), num(paired.get(m), ".2f")]
            table.append([Cell(text, c > 0, VERDICT_COLORS[ACCURACY_COLUMNS[c]]
                               if ACCURACY_COLUMNS[c] in VERDICT_COLORS and text != "0" else "")
                          for c, text in enumerate(cells)])
        self._accuracy_cells = show_cells(self.accuracy, table, self._accuracy_cells)

    # ---- export
    def export_data(self, path: str | Path) -> None:
        """The benchmark (and sweep) as CSV or JSON, by the path's suffix (bench_export.py)."""
        write_results(path, self.session.bench, self.session.sweep)

    def export_charts(self, stem: str | Path) -> list[Path]:
        """``stem``.png → stem-rows.png and stem-sweep.png (same for .svg)."""
        stem = Path(stem)
        suffix = stem.suffix.lower() if stem.suffix.lower() in (".png", ".svg") else ".png"
        base = stem.with_suffix("")
        out = []
        for name, view in (("rows", self.chart), ("sweep", self.sweep)):
            p = base.with_name(f"{base.name}-{name}{suffix}")
            save_chart(view, p)
            out.append(p)
        return out

    def export_dialog_data(self) -> None:
        path, _ = self.folders.save_file(self, "export", "Export results", "bench.csv",
                                         "CSV (*.csv);;JSON (*.json)")
        if path:
            try:
                self.export_data(path)
            except KvPrimerError as e:
                self.error.emit(f"cannot export results: {e}")

    def export_dialog_charts(self) -> None:
        path, _ = self.folders.save_file(self, "export", "Export charts", "bench.png",
                                         "PNG image (*.png);;SVG drawing (*.svg)")
        if path:
            try:
                self.export_charts(path)
            except OSError as e:
                self.error.emit(f"cannot export charts: {e}")
