"""KV Cache dock: a live map of the KV cells per sequence (skeleton; filled in by issue 4)."""
from __future__ import annotations

from PySide6.QtWidgets import QDockWidget, QLabel, QWidget

from .engine_worker import EngineWorker


class KvCacheDock(QDockWidget):
    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__("KV Cache", parent)
        self.setObjectName("kvCacheDock")
        self.worker = worker
        self.setWidget(QLabel("KV cache view: no model loaded"))
