"""The Benchmark view: every row cold and warm, repeated; the prefix-length sweep; exports.

It shows the session's benchmark and sweep results (charts from app.ui.charts, a table with
readable headers) and exports them; jobs are started by the window. The repeats box is the
session's option.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton, QSpinBox,
                               QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..engine import BenchResult, BenchRow
from ..engine.session import Session, bench_summary
from .charts import SweepChart, TtftBar, TtftChart, save_chart

# (BenchRow field, header, tooltip)
BENCH_COLUMNS = [
    ("row", "row", "The row's number in the rows table"),
    ("prefix_tokens", "prefix (tokens)", "Tokens in the primed prefix state"),
    ("suffix_tokens", "suffix (tokens)", "Tokens after the reused prefix: evaluated on each warm run"),
    ("cold_ms", "cold (ms)", "Time to first token without the cache (median of the repeats)"),
    ("warm_ms", "warm (ms)", "Time to first token restoring the prefix state (median)"),
    ("restore_ms", "restore (ms)", "Time to copy the prefix state into the KV cache (median)"),
    ("speedup", "speedup (×)", "cold ÷ warm"),
    ("tokens_equal", "same tokens", "The warm run generated exactly the cold run's tokens"),
    ("max_logit_diff", "max |Δlogit|", "Largest logit difference at the first generated token; "
                                       "0 means bit-identical"),
    ("error", "error", "Why the row could not run"),
]


def cell_text(key: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if key == "max_logit_diff":
        return f"{value:.3g}"
    if key == "speedup":
        return f"×{value:.1f}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and key != "row":
        return f"{value:,}"
    return str(value)


class BenchView(QWidget):
    run_requested = Signal()
    sweep_requested = Signal()
    error = Signal(str)

    def __init__(self, session: Session, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.repeat = QSpinBox()
        self.repeat.setRange(1, 50)
        self.repeat.setValue(session.options.repeat)
        self.repeat.setPrefix("repeats: ")
        self.repeat.valueChanged.connect(lambda v: session.set_options(repeat=v))
        self.run_button = QPushButton("Benchmark rows")
        self.run_button.setToolTip("Run every row cold and warm, repeated (Ctrl+B)")
        self.run_button.clicked.connect(self.run_requested)
        self.sweep_button = QPushButton("Prefix-length sweep")
        self.sweep_button.setToolTip("Time to first token against prefix length, on the current row")
        self.sweep_button.clicked.connect(self.sweep_requested)
        exports = [("Export CSV…", self.export_dialog_data), ("Export charts…", self.export_dialog_charts)]
        top = QHBoxLayout()
        top.addWidget(self.repeat)
        top.addWidget(self.run_button)
        top.addWidget(self.sweep_button)
        top.addStretch(1)
        self.summary = QLabel("No benchmark yet: press “Benchmark rows”.")
        self.summary.setWordWrap(True)
        for text, slot in exports:
            b = QPushButton(text)
            b.clicked.connect(slot)
            top.addWidget(b)
        self.chart = TtftChart()
        self.sweep = SweepChart()
        self.table = QTableWidget(0, len(BENCH_COLUMNS))
        self.table.setObjectName("benchTable")
        for c, (_key, header, tip) in enumerate(BENCH_COLUMNS):
            item = QTableWidgetItem(header)
            item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(c, item)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        charts = QSplitter(Qt.Horizontal)
        charts.addWidget(self.chart)
        charts.addWidget(self.sweep)
        split = QSplitter(Qt.Vertical)
        split.addWidget(charts)
        split.addWidget(self.table)
        split.setSizes([300, 120])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)
        session.events.bench.connect(self._show_result)
        session.events.sweep.connect(self.sweep.set_points)
        session.events.options.connect(lambda o: self.repeat.setValue(o.repeat))
        self._show_result(session.bench)
        self.sweep.set_points(session.sweep)

    def set_can_run(self, on: bool) -> None:
        self.run_button.setEnabled(on)
        self.sweep_button.setEnabled(on)

    def _show_result(self, result: BenchResult | None) -> None:
        rows = result.rows if result else []
        self.chart.set_bars([TtftBar.from_bench(r) for r in rows if r.error is None])
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            d = asdict(r)
            for c, (key, _header, _tip) in enumerate(BENCH_COLUMNS):
                item = QTableWidgetItem(cell_text(key, d[key]))
                if key != "error":
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(i, c, item)
        self.summary.setText(bench_summary(result) if result else
                             "No benchmark yet: press “Benchmark rows”.")

    # ---- export
    def export_data(self, path: str | Path) -> None:
        path = Path(path)
        bench, sweep = self.session.bench, self.session.sweep
        if bench is None and not sweep:
            raise ValueError("nothing to export yet; run a benchmark first")
        data = bench.as_dict() if bench else {}
        data["sweep"] = [p.as_dict() for p in sweep]
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(data, indent=1))
            return
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(BenchRow.__dataclass_fields__), extrasaction="ignore")
        w.writeheader()
        for r in data.get("rows", []):
            w.writerow(r)
        path.write_text(out.getvalue())

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
        path, _ = QFileDialog.getSaveFileName(self, "Export results", "bench.csv",
                                              "CSV (*.csv);;JSON (*.json)")
        if path:
            try:
                self.export_data(path)
            except (OSError, ValueError) as e:
                self.error.emit(f"cannot export results: {e}")

    def export_dialog_charts(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export charts", "bench.png",
                                              "PNG image (*.png);;SVG drawing (*.svg)")
        if path:
            try:
                self.export_charts(path)
            except OSError as e:
                self.error.emit(f"cannot export charts: {e}")
