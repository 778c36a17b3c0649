"""The Benchmark view and the charts it shares with the Run panel (QtCharts, PySide6-Addons).

``TtftChart``: cold vs warm time to first token per row, bars at the median with min–max
whiskers, the speedup under each row's label. ``SweepChart``: time to first token against
prefix tokens, cold and warm, the suffix-only evaluation as the floor. Jobs are started by the
main window; this view shows results and exports them.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from PySide6.QtCharts import (QBarCategoryAxis, QBarSeries, QBarSet, QChart, QChartView, QLineSeries,
                              QValueAxis)
from PySide6.QtCore import QMargins, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton, QSpinBox,
                               QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..engine import BenchResult, BenchRow

COLD, WARM, FLOOR = QColor("#d0673b"), QColor("#2e7dd7"), QColor("#7a7a7a")
MAX_BARS = 40  # beyond this a bar chart is unreadable; the table still has every row


def _chart(title: str) -> QChart:
    c = QChart()
    c.setTitle(title)
    c.setAnimationOptions(QChart.NoAnimation)
    c.legend().setAlignment(Qt.AlignBottom)
    c.setMargins(QMargins(4, 4, 4, 4))
    c.setBackgroundRoundness(0)
    return c


class TtftChart(QChartView):
    def __init__(self, title: str = "Time to first token per row (ms): median, min–max",
                 parent: QWidget | None = None):
        super().__init__(_chart(title), parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumHeight(200)
        self.rows: list[BenchRow] = []

    @property
    def bar_count(self) -> int:
        return sum(s.count() for s in self.chart().series() if isinstance(s, QBarSeries)
                   for s in s.barSets())

    def set_rows(self, rows: list[BenchRow]) -> None:
        rows = [r for r in rows if r.error is None][:MAX_BARS]
        self.rows = rows
        chart = self.chart()
        chart.removeAllSeries()
        for ax in chart.axes():
            chart.removeAxis(ax)
        if not rows:
            return
        cold, warm = QBarSet("cold"), QBarSet("warm")
        cold.setColor(COLD)
        warm.setColor(WARM)
        cold.append([r.cold_ms for r in rows])
        warm.append([r.warm_ms for r in rows])
        bars = QBarSeries()
        bars.setBarWidth(0.7)
        bars.append(cold)
        bars.append(warm)
        chart.addSeries(bars)
        cats = QBarCategoryAxis()
        cats.append([f"row {r.row}  ×{r.speedup:.1f}" for r in rows])
        top = max(max(r.cold_ms_max, r.cold_ms, r.warm_ms_max) for r in rows) * 1.1 or 1.0
        y = QValueAxis()
        y.setRange(0, top)
        y.setTitleText("ms")
        y.setLabelFormat("%.0f")
        y.applyNiceNumbers()
        chart.addAxis(cats, Qt.AlignBottom)
        chart.addAxis(y, Qt.AlignLeft)
        bars.attachAxis(cats)
        bars.attachAxis(y)
        # min–max whiskers on a hidden value axis aligned with the categories
        x = QValueAxis()
        x.setRange(-0.5, len(rows) - 0.5)
        x.setVisible(False)
        chart.addAxis(x, Qt.AlignBottom)
        offset = 0.7 / 4
        for i, r in enumerate(rows):
            for dx, lo, hi in ((-offset, r.cold_ms_min, r.cold_ms_max),
                               (offset, r.warm_ms_min, r.warm_ms_max)):
                if hi <= lo:
                    continue
                w = QLineSeries()
                w.setPen(QPen(QColor("#222222"), 1.5))
                w.append(i + dx, lo)
                w.append(i + dx, hi)
                chart.addSeries(w)
                w.attachAxis(x)
                w.attachAxis(y)
                chart.legend().markers(w)[0].setVisible(False)


class SweepChart(QChartView):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(_chart("Time to first token vs prefix length (ms)"), parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumHeight(200)
        self.points = []

    def set_points(self, points) -> None:
        self.points = list(points)
        chart = self.chart()
        chart.removeAllSeries()
        for ax in chart.axes():
            chart.removeAxis(ax)
        if not points:
            return
        x, y = QValueAxis(), QValueAxis()
        x.setTitleText("prefix tokens")
        x.setLabelFormat("%d")
        y.setTitleText("ms")
        y.setLabelFormat("%.0f")
        x.setRange(0, max(p.prefix_tokens for p in points) * 1.05)
        y.setRange(0, max(max(p.cold_ms, p.warm_ms) for p in points) * 1.1 or 1.0)
        y.applyNiceNumbers()
        chart.addAxis(x, Qt.AlignBottom)
        chart.addAxis(y, Qt.AlignLeft)
        for name, color, attr, style in (("cold", COLD, "cold_ms", Qt.SolidLine),
                                         ("warm", WARM, "warm_ms", Qt.SolidLine),
                                         ("suffix only (floor)", FLOOR, "floor_ms", Qt.DashLine)):
            s = QLineSeries()
            s.setName(name)
            s.setPen(QPen(color, 2, style))
            s.setPointsVisible(True)
            for p in points:
                s.append(p.prefix_tokens, getattr(p, attr))
            chart.addSeries(s)
            s.attachAxis(x)
            s.attachAxis(y)


def save_chart(view: QChartView, path: str | Path) -> None:
    """PNG (or any raster type Qt knows) from the widget; SVG through QSvgGenerator."""
    path = Path(path)
    if path.suffix.lower() == ".svg":
        size = view.size() if view.width() > 10 else QSize(800, 400)
        gen = QSvgGenerator()
        gen.setFileName(str(path))
        gen.setSize(size)
        gen.setViewBox(QRectF(0, 0, size.width(), size.height()))
        gen.setTitle(view.chart().title())
        p = QPainter(gen)
        try:
            view.render(p)
        finally:
            p.end()
    else:
        view.grab().save(str(path))


BENCH_COLUMNS = ["row", "prefix_tokens", "suffix_tokens", "cold_ms", "warm_ms", "restore_ms",
                 "speedup", "tokens_equal", "max_logit_diff", "error"]


class BenchView(QWidget):
    run_requested = Signal(int)  # repeats
    sweep_requested = Signal()
    error = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.result: BenchResult | None = None
        self.repeat = QSpinBox()
        self.repeat.setRange(1, 50)
        self.repeat.setValue(3)
        self.repeat.setPrefix("repeats: ")
        run = QPushButton("Benchmark rows")
        run.setToolTip("Run every row cold and warm, repeated (Ctrl+B)")
        run.clicked.connect(lambda: self.run_requested.emit(self.repeat.value()))
        sweep = QPushButton("Prefix-length sweep")
        sweep.setToolTip("Time to first token against prefix length, on the current row")
        sweep.clicked.connect(self.sweep_requested)
        exports = [("Export CSV…", self.export_dialog_data), ("Export charts…", self.export_dialog_charts)]
        top = QHBoxLayout()
        top.addWidget(self.repeat)
        top.addWidget(run)
        top.addWidget(sweep)
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
        self.table.setHorizontalHeaderLabels(BENCH_COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
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

    def show_result(self, result: BenchResult) -> None:
        self.result = result
        self.chart.set_rows(result.rows)
        self.table.setRowCount(len(result.rows))
        for i, r in enumerate(result.rows):
            d = asdict(r)
            for c, k in enumerate(BENCH_COLUMNS):
                v = d[k]
                text = f"{v:.1f}" if isinstance(v, float) and k != "max_logit_diff" else \
                    ("" if v is None else str(v))
                self.table.setItem(i, c, QTableWidgetItem(text))
        s = result.summary()
        if s["speedup_median"]:
            eq = "all outputs equal" if s["all_tokens_equal"] else "OUTPUTS DIFFER"
            self.summary.setText(f"median speedup ×{s['speedup_median']:.1f} · cold "
                                 f"{s['cold_ms_median']:.0f} ms · warm {s['warm_ms_median']:.0f} ms · {eq}"
                                 + (" · cancelled" if result.cancelled else ""))

    def show_sweep(self, points) -> None:
        self.sweep.set_points(points)

    # ---- export
    def export_data(self, path: str | Path) -> None:
        path = Path(path)
        if self.result is None and not self.sweep.points:
            raise ValueError("nothing to export yet; run a benchmark first")
        data = self.result.as_dict() if self.result else {}
        data["sweep"] = [p.as_dict() for p in self.sweep.points]
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
