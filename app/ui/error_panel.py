"""The Log dock: engine errors, warnings and uncaught exceptions, also written to a log file.

qasync's ``asyncSlot`` hands exceptions to ``sys.excepthook``; so does Qt for exceptions raised
in slots. We install a hook that logs the traceback to the file and shows one line here, so a
bug is visible without killing the window.

Messages are shown whole: the status bar cuts a long one, so an error also brings this dock to
the front, selected, its whole text below the list in a box that can be selected and copied
(Copy, or Ctrl+C in the list, copies the selected messages).
"""
from __future__ import annotations

import logging
import sys
import time
import traceback
from logging.handlers import RotatingFileHandler
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QUrl, Signal
from PySide6.QtGui import QColor, QDesktopServices, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QAbstractItemView, QDockWidget, QHBoxLayout, QListWidget,
                               QListWidgetItem, QPlainTextEdit, QPushButton, QSplitter,
                               QVBoxLayout, QWidget)

log = logging.getLogger("kvprimer")

COLORS = {"error": "#c62828", "warning": "#b26a00", "info": "#455a64"}


def log_file_path(folder: str | Path | None = None) -> Path:
    if folder is None:
        from platformdirs import user_log_path

        folder = user_log_path("kvprimer", appauthor=False)
    return Path(folder) / "kvprimer.log"


def setup_file_logging(folder: str | Path | None = None) -> Path:
    """Log kvprimer.* records to a rotating file (once per process)."""
    path = log_file_path(folder)
    root = logging.getLogger("kvprimer")
    root.setLevel(logging.INFO)
    if not any(isinstance(h, RotatingFileHandler) for h in root.handlers):
        path.parent.mkdir(parents=True, exist_ok=True)
        h = RotatingFileHandler(path, maxBytes=1 << 20, backupCount=2, encoding="utf-8")
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(h)
    return path


class _Bridge(QObject):
    """Log records may come from the worker thread; a signal brings them to the GUI thread."""
    record = Signal(str, str)


class _PanelHandler(logging.Handler):
    def __init__(self, bridge: _Bridge):
        super().__init__(logging.WARNING)
        self.bridge = bridge

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage().splitlines()[0]
            self.bridge.record.emit("error" if record.levelno >= logging.ERROR else "warning", msg)
        except Exception:  # a log handler must never raise
            pass


class ErrorPanel(QDockWidget):
    def __init__(self, parent: QWidget | None = None, log_path: Path | None = None):
        super().__init__("Log", parent)
        self.setObjectName("logDock")
        self.log_path = log_path
        self.list = QListWidget()
        self.list.setObjectName("logList")
        self.list.setWordWrap(True)
        self.list.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.list.itemSelectionChanged.connect(self._show_selected)
        QShortcut(QKeySequence.Copy, self.list, self.copy_selected, context=Qt.WidgetShortcut)
        # the selected message whole, wrapped, selectable: what the status bar had to cut
        self.detail = QPlainTextEdit()
        self.detail.setObjectName("logDetail")
        self.detail.setReadOnly(True)
        self.detail.setPlaceholderText("Select a message to read it whole")
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.list)
        split.addWidget(self.detail)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 1)
        copy = QPushButton("Copy")
        copy.setObjectName("logCopy")
        copy.setToolTip("Copy the selected messages, whole (Ctrl+C in the list)")
        copy.clicked.connect(self.copy_selected)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.list.clear)
        open_log = QPushButton("Open log file")
        open_log.clicked.connect(self._open_log)
        open_log.setEnabled(log_path is not None)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(copy)
        buttons.addWidget(open_log)
        buttons.addWidget(clear)
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(split, 1)
        lay.addLayout(buttons)
        self.setWidget(body)
        self._bridge = _Bridge(self)
        self._bridge.record.connect(self.add)
        self._handler = _PanelHandler(self._bridge)
        log.addHandler(self._handler)
        self._old_hook = None

    # ---- showing
    def add(self, level: str, message: str) -> None:
        item = QListWidgetItem(f"{time.strftime('%H:%M:%S')}  {message}")
        item.setData(Qt.UserRole, level)
        item.setForeground(QColor(COLORS.get(level, COLORS["info"])))
        item.setToolTip(message)
        self.list.addItem(item)
        self.list.scrollToBottom()
        if level == "error":
            self.list.setCurrentItem(item)  # its whole text in the box below
            self.reveal()

    def reveal(self) -> None:
        """Shown and in front of the docks it is tabbed with."""
        self.show()
        self.raise_()

    def _show_selected(self) -> None:
        self.detail.setPlainText(self.selected_text())

    def selected_text(self) -> str:
        """The selected messages, whole, one a line, in the list's order."""
        rows = sorted(self.list.row(it) for it in self.list.selectedItems())
        return "\n".join(self.list.item(r).text() for r in rows)

    def copy_selected(self) -> None:
        text = self.selected_text()
        if text:
            QGuiApplication.clipboard().setText(text)

    def messages(self, level: str | None = None) -> list[str]:
        items = (self.list.item(i) for i in range(self.list.count()))
        return [it.text().split("  ", 1)[1] for it in items
                if level is None or it.data(Qt.UserRole) == level]

    def error(self, message: str) -> None:
        """An engine error for the user: shown as it is, logged without a traceback."""
        log.info("error shown: %s", message)
        self.add("error", message)

    def info(self, message: str) -> None:
        log.info(message)
        self.add("info", message)

    # ---- uncaught exceptions
    def install_excepthook(self) -> None:
        self._old_hook = sys.excepthook
        sys.excepthook = self._excepthook

    def uninstall_excepthook(self) -> None:
        if self._old_hook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._old_hook
        self._old_hook = None
        log.removeHandler(self._handler)

    def _excepthook(self, etype, value, tb) -> None:
        text = "".join(traceback.format_exception(etype, value, tb))
        for h in logging.getLogger("kvprimer").handlers:  # the file gets the whole traceback
            if isinstance(h, RotatingFileHandler):
                h.handle(logging.makeLogRecord({"name": "kvprimer.crash", "levelno": logging.ERROR,
                                                "levelname": "ERROR", "msg": text}))
        where = f" (details in {self.log_path})" if self.log_path else ""
        self.add("error", f"internal error: {etype.__name__}: {value}{where}")

    def _open_log(self) -> None:
        if self.log_path:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.log_path)))
