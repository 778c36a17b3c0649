"""A chart's legend as widgets below its plot, inside the chart's view: one entry per series,
wrapping onto another line when the chart is narrow.

QtCharts' own legend keeps one line and elides its entries ("wa…, wa…, wa…") when they do not
fit, so on a small screen the modes of a benchmark could not be told apart. Here every entry is
a label shown whole; the legend grows a line instead.
"""
from __future__ import annotations

import html

from PySide6.QtCharts import QChartView
from PySide6.QtCore import QPointF, QRectF, QSizeF
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel, QWidget

from .narrow_widgets import FlowRow

SWATCH = "■"


class ChartLegend(QWidget):
    """The entries of ``view``'s legend; ``place()`` (on the view's resize) puts it at the
    view's bottom and keeps the plot above it."""

    def __init__(self, view: QChartView):
        super().__init__(view)
        self.setObjectName("chartLegend")
        self.view = view
        self.row = FlowRow(self, spacing=14)
        self.row.setContentsMargins(6, 0, 6, 4)
        self.labels: list[QLabel] = []

    def set_entries(self, entries: list[tuple[str, QColor]]) -> None:
        """(name, colour) per entry, in order."""
        if [(lab.property("entry"), lab.property("color")) for lab in self.labels] == \
                [(n, c.name()) for n, c in entries]:
            return
        for lab in self.labels:
            self.row.removeWidget(lab)
            lab.deleteLater()
        self.labels = []
        for name, color in entries:
            lab = QLabel(f'<span style="color:{color.name()}">{SWATCH}</span>&nbsp;'
                         f'{html.escape(name)}', self)
            lab.setObjectName("legendEntry")
            lab.setProperty("entry", name)
            lab.setProperty("color", color.name())
            self.row.addWidget(lab)
            lab.show()
            self.labels.append(lab)
        self.place()

    def names(self) -> list[str]:
        return [lab.property("entry") for lab in self.labels]

    def place(self) -> None:
        view = self.view
        frame = view.frameWidth()
        width = view.width() - 2 * frame
        height = self.row.heightForWidth(width) if self.labels else 0
        view.setViewportMargins(0, 0, 0, height)
        self.setGeometry(frame, view.height() - frame - height, width, height)
        self.setVisible(bool(self.labels))
        chart = view.chart()
        plot = QSizeF(max(width, 1), max(view.height() - 2 * frame - height, 1))
        if chart.size() != plot:  # the chart fills the view, not the part above the legend
            chart.resize(plot)
            view.setSceneRect(QRectF(QPointF(0, 0), plot))
