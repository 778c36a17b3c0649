"""Charts of the Run panel and the Benchmark view (QtCharts, part of PySide6).

``TtftChart``: cold vs warm time to first token per row, bars at the median with min–max
whiskers. Each row's label says as much as its width allows ("row 3 ×12.9", "3 ×12.9", "3"),
recomputed on resize, so labels are never cut to "row…". ``SweepChart``: time to first token
against prefix tokens, cold and warm, the suffix-only evaluation as the floor. Axis numbers are
written as the tables write them ("80,000").

Every chart has a legend below its plot (chart_legend.py: entries shown whole, wrapping),
one entry per named series and one "min–max" for the whiskers when there are any.
``legend_entries`` lists what a chart's legend shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCharts import (QBarCategoryAxis, QBarSeries, QBarSet, QChart, QChartView, QLineSeries,
                              QLogValueAxis, QValueAxis)
from PySide6.QtCore import QMargins, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPen
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QWidget

from .chart_legend import ChartLegend
from .number_text import NUMBERS

COLD, WARM, FLOOR = QColor("#d0673b"), QColor("#2e7dd7"), QColor("#7a7a7a")
MODE_COLORS = {"prefix": QColor("#2e7dd7"), "chain": QColor("#2e9d5b"), "compose": QColor("#8e5bc4")}
MAX_BARS = 40  # beyond this a bar chart is unreadable; the table still has every row
# a chart's floor: its title, a plot and its legend still readable, and low enough that the
# Run tab leaves the template 15 lines on a 768-pixel screen (drag the splitter for more)
MIN_HEIGHT = 130
WHISKERS = "min–max"  # the legend's name for the whiskers (bars are at the median)
LOG_ABOVE = 30  # bars whose largest is over 30x their smallest get a log scale (a warm run at
# x280 of its cold run is a hairline on a linear one)
COMPACT_BELOW = 240  # pixels: a shorter chart drops its axis titles to keep its plot and labels
WHISKER_COLOR = QColor("#222222")


@dataclass(frozen=True)
class BarSeries:
    """One bar per row: the median, and the min–max whisker (equal to it: none drawn)."""
    name: str
    color: QColor
    values: list[float]
    lows: list[float]
    highs: list[float]


@dataclass(frozen=True)
class TtftBar:
    row: int
    cold_ms: float
    warm_ms: float
    cold_min: float
    cold_max: float
    warm_min: float
    warm_max: float

    @property
    def speedup(self) -> float:
        return self.cold_ms / self.warm_ms if self.warm_ms > 0 else 0.0

    @classmethod
    def single(cls, row: int, cold_ms: float, warm_ms: float) -> "TtftBar":
        return cls(row, cold_ms, warm_ms, cold_ms, cold_ms, warm_ms, warm_ms)




def _chart(title: str) -> QChart:
    c = QChart()
    c.setTitle(title)
    c.setLocalizeNumbers(True)
    c.setLocale(NUMBERS)
    c.setAnimationOptions(QChart.NoAnimation)
    c.legend().setVisible(False)  # ChartLegend draws it, whole
    c.setMargins(QMargins(4, 4, 4, 4))
    c.setBackgroundRoundness(0)
    return c


def legend_entries(view: QChartView) -> list[str]:
    """The labels the chart's legend shows (none when the legend is hidden)."""
    legend = getattr(view, "legend_row", None)
    if legend is not None:
        return legend.names()
    legend = view.chart().legend()
    if not legend.isVisible():
        return []
    return [m.label() for m in legend.markers() if m.isVisible()]


def clear_chart(chart: QChart) -> None:
    """Remove every series and axis. removeAllSeries deletes the series, but removeAxis only
    hands the axis back ("the chart releases its ownership"): delete it too, or every redraw
    (one per benchmark row) leaks its axes."""
    chart.removeAllSeries()
    for ax in chart.axes():
        chart.removeAxis(ax)
        ax.deleteLater()


def bar_labels(bars: list[TtftBar], width_px: float, metrics: QFontMetrics) -> list[str]:
    """Cold vs warm bars' labels: "row 3 ×12.9", "3 ×12.9" or "3", whichever fits."""
    forms = [(f"row {b.row} ×{b.speedup:.1f}", f"{b.row} ×{b.speedup:.1f}", f"{b.row}")
             for b in bars]
    return fit_labels(forms, width_px, metrics)


def fit_labels(forms: list[tuple[str, ...]], width_px: float, metrics: QFontMetrics) -> list[str]:
    """Per category its label forms, longest first: the longest form that fits every
    category's width; unique (repeated rows differ by invisible zero-width spaces, since a
    category axis merges equal names)."""
    # a label has its category's width (the axis's over n); n + 1 and the padding keep a gap
    # between neighbours. QtCharts' own eliding is off (TtftChart): it measured less room than
    # a label has, and cut "row 1 ×27.7" to "row 1 ×2..." in a chart 270 pixels wide
    per = width_px / (len(forms) + 1) - 20
    labels = [f[-1] for f in forms]
    for i in range(max((len(f) for f in forms), default=0)):
        texts = [f[min(i, len(f) - 1)] for f in forms]
        if all(metrics.horizontalAdvance(t) <= per for t in texts):
            labels = texts
            break
    seen: set[str] = set()
    out = []
    for t in labels:
        while t in seen:
            t += "\u200b"
        seen.add(t)
        out.append(t)
    return out


def value_axis(series: list[BarSeries], n: int, unit: str) -> QValueAxis | QLogValueAxis:
    """The bars' value axis: linear from 0, or logarithmic when the largest value is over
    ``LOG_ABOVE`` times the smallest, from a decade under the smallest so that its bar shows."""
    vals = [v for s in series for v in (*s.values[:n], *s.lows[:n], *s.highs[:n])]
    top = max(vals, default=0) * 1.1 or 1.0
    low = min(vals, default=0)
    if low > 0 and max(vals) / low > LOG_ABOVE:
        y = QLogValueAxis()
        y.setBase(10)
        y.setRange(10 ** (math.floor(math.log10(low)) - 1), 10 ** math.ceil(math.log10(top)))
        y.setTitleText(f"{unit}, log scale")
        y.setLabelFormat("%.0f")
        return y
    y = QValueAxis()
    y.setRange(0, top)
    y.setTitleText(unit)
    y.setLabelFormat("%.0f")
    y.applyNiceNumbers()
    return y


class TtftChart(QChartView):
    def __init__(self, title: str = "Time to first token per row (ms)",
                 parent: QWidget | None = None):
        super().__init__(_chart(title), parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumHeight(MIN_HEIGHT)
        self.legend_row = ChartLegend(self)
        self.bars: list[TtftBar] = []
        self.forms: list[tuple[str, ...]] = []  # per row, its label forms, longest first
        self.axis_title = "row · ×speedup"
        self._cats: QBarCategoryAxis | None = None
        self._relabel_timer = QTimer(self, singleShot=True, interval=0)
        self._relabel_timer.timeout.connect(self._relabel)

    @property
    def bar_count(self) -> int:
        return sum(s.count() for s in self.chart().series() if isinstance(s, QBarSeries)
                   for s in s.barSets())

    def series_names(self) -> list[str]:
        return [b.label() for s in self.chart().series() if isinstance(s, QBarSeries)
                for b in s.barSets()]

    def labels(self) -> list[str]:
        return self._cats.categories() if self._cats else []

    def set_bars(self, bars: list[TtftBar]) -> None:
        """Cold vs warm, one pair per row."""
        bars = bars[:MAX_BARS]
        self.bars = bars
        self.set_series([(f"row {b.row} ×{b.speedup:.1f}", f"{b.row} ×{b.speedup:.1f}", f"{b.row}")
                         for b in bars],
                        [BarSeries("cold", COLD, [b.cold_ms for b in bars],
                                   [b.cold_min for b in bars], [b.cold_max for b in bars]),
                         BarSeries("warm", WARM, [b.warm_ms for b in bars],
                                   [b.warm_min for b in bars], [b.warm_max for b in bars])],
                        "row · ×speedup")

    def set_series(self, forms: list[tuple[str, ...]], series: list[BarSeries],
                   axis_title: str = "row", unit: str = "ms") -> None:
        """Grouped bars: one category per row (``forms``: its label forms), one bar set per
        series, min–max whiskers where a series has them."""
        n = min(len(forms), MAX_BARS)
        self.forms, self.axis_title = forms[:n], axis_title
        chart = self.chart()
        clear_chart(chart)
        self._cats = None
        if not n or not series:
            self.legend_row.set_entries([])
            return
        bars = QBarSeries()
        bars.setBarWidth(0.8)
        for s in series:
            b = QBarSet(s.name)
            b.setColor(s.color)
            b.append(list(s.values[:n]))
            bars.append(b)
        chart.addSeries(bars)
        self._cats = QBarCategoryAxis()
        self._cats.setTruncateLabels(False)  # the labels are fitted here (fit_labels)
        self._cats.append(self._labels_for_width())
        self._cats.setTitleText(axis_title)
        y = value_axis(series, n, unit)
        chart.addAxis(self._cats, Qt.AlignBottom)
        chart.addAxis(y, Qt.AlignLeft)
        bars.attachAxis(self._cats)
        bars.attachAxis(y)
        # min–max whiskers on a hidden value axis aligned with the categories
        x = QValueAxis()
        x.setRange(-0.5, n - 0.5)
        x.setVisible(False)
        chart.addAxis(x, Qt.AlignBottom)
        width = 0.8 / len(series)
        explained = False  # the first whisker's legend entry says what they all are
        for k, s in enumerate(series):
            dx = -0.4 + width * (k + 0.5)
            for i in range(n):
                lo, hi = s.lows[i], s.highs[i]
                if hi <= lo:
                    continue
                w = QLineSeries()
                w.setPen(QPen(WHISKER_COLOR, 1.5))
                w.append(i + dx, lo)
                w.append(i + dx, hi)
                w.setName(WHISKERS)
                chart.addSeries(w)
                w.attachAxis(x)
                w.attachAxis(y)
                explained = True
        self.legend_row.set_entries([(s.name, s.color) for s in series]
                                    + ([(WHISKERS, WHISKER_COLOR)] if explained else []))
        self._relabel_timer.start()  # once the new axes are laid out

    def _labels_for_width(self) -> list[str]:
        plot = self.chart().plotArea().width()
        width = plot if plot > 50 else max(self.width() - 80, 100)
        font = self._cats.labelsFont() if self._cats else self.font()
        return fit_labels(self.forms, width, QFontMetrics(font))

    def _relabel(self) -> None:
        if compact(self):  # the plot's width changes with the axes' titles: measure it after
            self._relabel_timer.start()
            return
        if self._cats is None:
            return
        new = self._labels_for_width()
        if new != self._cats.categories():
            self._cats.setCategories(new)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.legend_row.place()
        self._relabel_timer.start()


class SweepChart(QChartView):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(_chart("Time to first token vs prefix length (ms)"), parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumHeight(MIN_HEIGHT)
        self.legend_row = ChartLegend(self)
        self.points = []

    def set_points(self, points) -> None:
        self.points = list(points)
        chart = self.chart()
        clear_chart(chart)
        if not points:
            self.legend_row.set_entries([])
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
        self.legend_row.set_entries([("cold", COLD), ("warm", WARM),
                                     ("suffix only (floor)", FLOOR)])
        compact(self)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.legend_row.place()
        compact(self)


def compact(view: QChartView) -> bool:
    """Axis titles and five value labels only where there is room: a short chart's plot would
    be squeezed until Qt elides every label to "…" (the title and legend say what the axes
    are). Returns whether anything changed."""
    show = view.height() >= COMPACT_BELOW
    changed = False
    for ax in view.chart().axes():
        if ax.isTitleVisible() != show:
            ax.setTitleVisible(show)
            changed = True
        if isinstance(ax, QValueAxis) and ax.isVisible() and ax.orientation() == Qt.Vertical:
            ticks = 5 if show else 3  # fewer labels, each with room to be read
            if ax.tickCount() != ticks:
                ax.setTickCount(ticks)
                changed = True
    return changed


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
