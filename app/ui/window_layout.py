"""Where the window's docks are: the work in the middle, the advanced panels around it.

A newcomer first sees the template, the rows, Run and the result (the central widget). The
Model, KV Cache, Cache, States and Log docks are the advanced panels: hidden on the first
start and shown together by one toggle (on the toolbar and in the View menu), or one by one
from the View menu. A layout the user left (QMainWindow.saveState) comes back as it was.
"""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDockWidget, QMainWindow


class DockLayout:
    def __init__(self, window: QMainWindow, settings: QSettings, side: list[QDockWidget],
                 bottom: list[QDockWidget]):
        """``side``: docked on the right, one above the other; ``bottom``: tabbed below."""
        self.window, self.settings = window, settings
        self.side, self.bottom = side, bottom
        self.docks = [*side, *bottom]
        window.addDockWidget(Qt.RightDockWidgetArea, side[0])
        for above, below in zip(side, side[1:]):
            window.splitDockWidget(above, below, Qt.Vertical)
        for d in bottom:
            window.addDockWidget(Qt.BottomDockWidgetArea, d)
        for a, b in zip(bottom, bottom[1:]):
            window.tabifyDockWidget(a, b)
        bottom[0].raise_()
        self.sized = False  # the docks were given their first-start sizes (or a saved layout's)
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
            self.bottom[0].raise_()
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
        if geo is not None:
            w.restoreGeometry(geo)
        state = s.value("windowState")
        self.sized = state is not None and w.restoreState(state)
        if not self.sized:  # first start: the work alone, the advanced panels one click away
            for d in self.docks:
                d.hide()
        self._sync_toggle()

    def save(self) -> None:
        self.settings.setValue("geometry", self.window.saveGeometry())
        self.settings.setValue("windowState", self.window.saveState())
        self.settings.sync()

    def size_docks(self) -> None:
        """First sizes for docks shown for the first time: room for the work in the middle."""
        w = self.window
        if self.sized or not w.isVisible() or not self.advanced_shown:
            return
        self.sized = True
        w.resizeDocks([self.bottom[0]], [190], Qt.Vertical)
        w.resizeDocks([self.side[-1]], [430], Qt.Horizontal)
        if len(self.side) > 1:
            w.resizeDocks(self.side[:2], [300, 600], Qt.Vertical)
