"""Where the window's docks are: the work in the middle, the advanced panels beside it.

A newcomer first sees the template, the rows, Run and the result (the central widget). The
Model, KV Cache, Radix cache, States and Log docks are the advanced panels: hidden on the first
start and shown together by one toggle (on the toolbar and in the View menu), or one by one
from the View menu. They all sit in one column on the right, in two tabbed groups (the KV map
below, the rest above it), so the work keeps the window's whole height: on a 1366×768 screen
the template still shows 15 lines and every results table 5 rows. Each dock scrolls when it is
shorter than its contents rather than squeezing them, and the wheel scrolls it: a spin box or
drop-down takes the wheel only once clicked into (setting_boxes.py). A layout the user left
(QMainWindow.saveState, and the splitters' positions) comes back as it was.
"""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (QDockWidget, QFrame, QGroupBox, QMainWindow, QPlainTextEdit,
                               QScrollArea, QSplitter, QTabWidget, QVBoxLayout, QWidget)

from .setting_boxes import wheel_when_focused

# saved layouts of another arrangement of docks are not restored (they would put the docks
# back where an older version had them): bump when the arrangement changes
LAYOUT_VERSION = 2
DOCK_SHARE = 0.33  # of the window's width, for the column of advanced panels
DOCK_WIDTH = (380, 560)  # its bounds in pixels
TEMPLATE_LINES = 16  # the template's first height: lines shown (15 and a margin)
TEMPLATE_SHARE = 0.45  # or this share of the central height, if that is more
DEFAULT_SIZE = (1400, 900)


def central_widgets(editor: QWidget, fillings: QWidget, tabs: list[tuple[QWidget, str]]
                    ) -> tuple[QSplitter, QSplitter, QTabWidget]:
    """The work: the template beside the fillings above the result tabs. Returns the vertical
    splitter (the central widget), the top one and the tabs."""
    boxes = []
    for title, body in (("Template", editor), ("Fillings", fillings)):
        box = QGroupBox(title)
        QVBoxLayout(box).addWidget(body)
        box.layout().setContentsMargins(4, 4, 4, 4)
        boxes.append(box)
    top = QSplitter(Qt.Horizontal)
    top.setObjectName("topSplit")
    for box in boxes:
        top.addWidget(box)
    top.setStretchFactor(0, 4)
    top.setStretchFactor(1, 3)
    central_tabs = QTabWidget()
    for widget, name in tabs:
        central_tabs.addTab(widget, name)
    center = QSplitter(Qt.Vertical)
    center.setObjectName("centerSplit")
    center.addWidget(top)
    center.addWidget(central_tabs)
    # the template keeps its height (sized once shown: size_center); the results grow
    center.setStretchFactor(0, 0)
    center.setStretchFactor(1, 1)
    return center, top, central_tabs


def scrolling(dock: QDockWidget) -> None:
    """Put the dock's contents in a scroll area: a short dock scrolls instead of squeezing, and
    the wheel over its settings scrolls it rather than changing them."""
    body = dock.widget()
    if body is not None:
        wheel_when_focused(body)
    if body is None or isinstance(body, QScrollArea):
        return
    area = QScrollArea()
    area.setObjectName(dock.objectName() + "Scroll")
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    area.setWidget(body)
    dock.setWidget(area)


def fit_to_screen(window: QMainWindow, size: tuple[int, int] = DEFAULT_SIZE) -> None:
    """The first size: ``size``, or the screen's free area if that is smaller (the offscreen
    platform's fixed 800×800 stands for no real screen: tests and screenshots size their own)."""
    w, h = size
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is not None and QGuiApplication.platformName() != "offscreen":
        free = screen.availableGeometry()
        w, h = min(w, free.width()), min(h, free.height())
    window.resize(w, h)


class DockLayout:
    def __init__(self, window: QMainWindow, settings: QSettings, upper: list[QDockWidget],
                 lower: list[QDockWidget], splitters: tuple[QSplitter, ...] = ()):
        """``upper`` and ``lower``: two groups of tabbed docks, one above the other on the
        right (each group's first dock in front); ``splitters``: the central splitters whose
        positions are saved with the layout (each needs an objectName)."""
        self.window, self.settings = window, settings
        self.upper, self.lower = upper, lower
        self.docks = [*upper, *lower]
        self.splitters = splitters
        for d in self.docks:
            scrolling(d)
            d.setAllowedAreas(Qt.AllDockWidgetAreas)
        window.setDockOptions(window.dockOptions() | QMainWindow.AllowTabbedDocks
                              | QMainWindow.AnimatedDocks)
        window.addDockWidget(Qt.RightDockWidgetArea, upper[0])
        window.splitDockWidget(upper[0], lower[0], Qt.Vertical)
        for group in (upper, lower):
            for d in group[1:]:
                window.tabifyDockWidget(group[0], d)
        self.sized = False  # the docks were given their first-start sizes (or a saved layout's)
        self.splits_restored = False
        self.toggle = QAction("Advanced panels", window)
        self.toggle.setCheckable(True)
        self.toggle.setToolTip("Show or hide the model's settings, the KV cache map, the radix "
                               "cache, saved states and the log")
        self.toggle.toggled.connect(self.show_advanced)
        for d in self.docks:
            d.toggleViewAction().toggled.connect(lambda _on: self._sync_toggle())

    @property
    def advanced_shown(self) -> bool:
        return any(not d.isHidden() for d in self.docks)

    def show_advanced(self, on: bool) -> None:
        for d in self.docks:
            d.setVisible(on)
        if on:
            for group in (self.upper, self.lower):
                group[0].raise_()
            self.size_docks()
        self._sync_toggle()

    def _sync_toggle(self) -> None:
        was = self.toggle.blockSignals(True)
        self.toggle.setChecked(self.advanced_shown)
        self.toggle.blockSignals(was)

    # ---- saved and first-start layouts
    def restore(self) -> None:
        w, s = self.window, self.settings
        geo = s.value("geometry")
        if geo is None or not w.restoreGeometry(geo):
            fit_to_screen(w)
        state = s.value("windowState")
        self.sized = state is not None and w.restoreState(state, LAYOUT_VERSION)
        if not self.sized:  # first start: the work alone, the advanced panels one click away
            for d in self.docks:
                d.hide()
        restored = [sp.restoreState(s.value(f"splitter/{sp.objectName()}"))
                    for sp in self.splitters if s.value(f"splitter/{sp.objectName()}") is not None]
        self.splits_restored = bool(restored) and all(restored)
        self._sync_toggle()

    def save(self) -> None:
        self.settings.setValue("geometry", self.window.saveGeometry())
        self.settings.setValue("windowState", self.window.saveState(LAYOUT_VERSION))
        for sp in self.splitters:
            self.settings.setValue(f"splitter/{sp.objectName()}", sp.saveState())
        self.settings.sync()

    def size_docks(self) -> None:
        """First sizes for docks shown for the first time: a column that leaves the work most
        of the width, the KV map a little taller than the group above it."""
        w = self.window
        if self.sized or not w.isVisible() or not self.advanced_shown:
            return
        self.sized = True
        lo, hi = DOCK_WIDTH
        width = int(min(max(w.width() * DOCK_SHARE, lo), hi))
        w.resizeDocks([self.upper[0]], [width], Qt.Horizontal)
        column = max(w.centralWidget().height(), 200)
        w.resizeDocks([self.upper[0], self.lower[0]], [column * 9 // 20, column * 11 // 20],
                      Qt.Vertical)


def size_center(center: QSplitter, editor: QPlainTextEdit,
                lines: int = TEMPLATE_LINES, share: float = TEMPLATE_SHARE) -> None:
    """Give the top of ``center`` (the template) room for ``lines`` of ``editor`` or ``share``
    of the height, whichever is more; the rest goes to the results below. The top's own
    splitter, if it has one, gives the template 55% of the width. Call once the window is laid
    out (the editor's chrome is measured, not guessed)."""
    top_split = center.widget(0)
    if isinstance(top_split, QSplitter) and top_split.count() == 2:
        width = sum(top_split.sizes())
        top_split.setSizes([width * 55 // 100, width - width * 55 // 100])
    sizes = center.sizes()
    total = sum(sizes)
    if len(sizes) != 2 or total <= 0:
        return
    chrome = sizes[0] - editor.viewport().height()  # what surrounds the text in the top part
    want = lines * editor.fontMetrics().lineSpacing() + editor.document().documentMargin() * 2
    top = max(int(want) + chrome, int(total * share))
    top = min(top, total - center.widget(1).minimumSizeHint().height())
    center.setSizes([top, total - top])
