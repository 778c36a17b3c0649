"""Table columns that fit the table and keep the widths the user gave them.

Each column is sized to its header and contents, no wider than ``MAX_SHARE`` of the table, and
columns of long texts shrink (their text ends in "…"; the one shown last first, as it takes the
room the others leave) until all of them fit the table's width; numbers and short words stay
whole, and the table scrolls sideways if they do not fit. A column the user drags keeps that
width, in the settings too, so that it comes back after a restart; "Fit columns" in the
header's menu gives them all back to the fitting.
"""
from __future__ import annotations

import json

from PySide6.QtCore import QEvent, QObject, QSettings, QTimer, Qt
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QAbstractItemView, QHeaderView

MAX_SHARE = 0.45  # of the table's width, for one column fitted to its contents
MIN_FIT = 40  # pixels: a fitted column never shrinks below this or its header
SHORT_CHARS = 16  # a column this narrow (in average characters) shrinks last


class ColumnWidths(QObject):
    """Keeps ``view``'s columns fitted (and the user's widths) under the settings key
    ``columns/<key>``."""

    def __init__(self, view: QAbstractItemView, settings: QSettings | None, key: str):
        super().__init__(view)
        self.view, self.settings, self.key = view, settings, key
        self.header: QHeaderView = view.header() if hasattr(view, "header") \
            else view.horizontalHeader()
        self.user: dict[int, int] = self._load()
        self._fitting = False
        self.header.setSectionResizeMode(QHeaderView.Interactive)
        self.header.setStretchLastSection(True)
        self.header.sectionResized.connect(self._resized)
        self._timer = QTimer(self, singleShot=True, interval=0)
        self._timer.timeout.connect(self.fit)
        model = view.model()
        for signal in (model.modelReset, model.rowsInserted, model.dataChanged,
                       model.layoutChanged, model.headerDataChanged, model.columnsInserted):
            signal.connect(lambda *_a: self._timer.start())
        view.viewport().installEventFilter(self)
        fit = QAction("Fit columns", self.header)
        fit.setToolTip("Size every column to its contents again, within the table's width")
        fit.triggered.connect(self.reset)
        self.header.addAction(fit)
        self.header.setContextMenuPolicy(Qt.ActionsContextMenu)
        self._timer.start()

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Resize:
            self._timer.start()
        return False

    def _load(self) -> dict[int, int]:
        raw = self.settings.value(f"columns/{self.key}") if self.settings is not None else None
        try:
            return {int(k): int(v) for k, v in json.loads(str(raw)).items()} if raw else {}
        except (ValueError, TypeError, AttributeError):
            return {}  # an unreadable entry: fitted widths, as on a first start

    def _save(self) -> None:
        if self.settings is not None:
            self.settings.setValue(f"columns/{self.key}", json.dumps(self.user))

    def _resized(self, column: int, _old: int, new: int) -> None:
        # the user's drag only: Qt resizes sections itself too (a new model, the last one
        # filling what is left)
        dragging = QGuiApplication.mouseButtons() & Qt.LeftButton
        if self._fitting or not dragging or self._last_shown() == column:
            return
        self.user[column] = new
        self._save()

    def reset(self) -> None:
        self.user = {}
        self._save()
        self.fit()

    def _shown(self) -> list[int]:
        """The shown columns' logical indexes, left to right as shown (a view may move one)."""
        h = self.header
        return [c for c in (h.logicalIndex(v) for v in range(h.count()))
                if not h.isSectionHidden(c)]

    def _last_shown(self) -> int | None:
        shown = self._shown()
        return shown[-1] if shown else None

    def natural(self, column: int) -> int:
        """The width that shows the column's header and contents whole."""
        return max(self.header.sectionSizeHint(column), self.view.sizeHintForColumn(column))

    def fit(self) -> None:
        shown = self._shown()
        room = self.view.viewport().width()
        if not shown or room <= 0:
            return
        widths = {}
        for c in shown:
            if c in self.user:
                widths[c] = self.user[c]
            else:
                widths[c] = min(self.natural(c), max(int(room * MAX_SHARE), MIN_FIT))
        fitted = [c for c in shown if c not in self.user]
        header = {c: max(self.header.sectionSizeHint(c), MIN_FIT) for c in fitted}
        short = self.view.fontMetrics().averageCharWidth() * SHORT_CHARS
        # long texts give up width, down to their header; numbers and short words stay whole
        # (the table scrolls if that is not enough)
        for floor in ({c: widths[c] if widths[c] <= short else header[c] for c in fitted},):
            excess = sum(widths.values()) - room
            while excess > 0:
                give = [c for c in fitted if widths[c] > floor[c]]
                if not give:
                    break
                # the column shown last first: it is stretched over the room left anyway
                c = max(give, key=lambda k: (k == shown[-1], widths[k] - floor[k]))
                cut = min(excess, widths[c] - floor[c])
                widths[c] -= cut
                excess -= cut
        self._fitting = True
        try:
            for c in shown:
                if self.header.sectionSize(c) != widths[c]:
                    self.header.resizeSection(c, widths[c])
        finally:
            self._fitting = False


def keep_column_widths(settings: QSettings | None, views: dict[str, QAbstractItemView]
                       ) -> dict[str, ColumnWidths]:
    """A ColumnWidths for each view, under its key."""
    return {key: ColumnWidths(view, settings, key) for key, view in views.items()}


def window_tables(window) -> dict[str, QAbstractItemView]:
    """The main window's tables of results, by the key their widths are kept under."""
    return {"cacheTree": window.cache_panel.tree, "runTable": window.run_panel.table,
            "benchTable": window.bench.table, "benchAccuracy": window.bench.accuracy,
            "serverTable": window.server_view.table}
