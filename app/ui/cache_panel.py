"""The Cache panel: the radix cache's tree of cached prompts, each tier's use against its cap,
and the Evict and Pin actions.

What it shows comes from ``engine.cache.nodes()`` and ``engine.cache.tiers()``, read on the
worker thread whenever the engine status's cache revision moves (after every job that can
change the cache, its own actions included: they also bring their snapshot with them). Evict
moves a node one tier down (resident → RAM → file → dropped); a pinned node is never evicted,
by the user or by the caps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QDockWidget, QGridLayout, QHBoxLayout,
                               QHeaderView, QLabel, QProgressBar, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from ..engine.cache.radix_cache import CacheNodeInfo, TierUsage
from .units import size_text
from .engine_worker import EngineWorker, JobKind
from .model_events import follow

COLUMNS = [("cached prompt", "What the node adds to its parent: the static prefix, a value…"),
           ("text", "The node's own tokens as text"),
           ("tokens", "Tokens from the start of the prompt to the node's end (its own in brackets)"),
           ("tier", "resident: cells in the KV cache; ram: a snapshot in memory; file: on disk"),
           ("size", "Bytes of the node's own cells, with the recurrent state it keeps at its "
                    "depth on hybrid and recurrent models (in brackets)"),
           ("hits", "Runs that reused this node"),
           ("last use", "Time since a run last used it"),
           ("pinned", "A pinned node is never evicted")]
TIERS = {"resident": "resident (KV cells)", "ram": "RAM snapshots", "file": "files"}


@dataclass(frozen=True)
class CacheSnapshot:
    nodes: list[CacheNodeInfo]
    tiers: list[TierUsage]
    now: float  # time.monotonic() when read: nodes' last_used is on that clock


def read_cache(engine) -> CacheSnapshot | None:
    """The cache's nodes and tiers (worker thread)."""
    if engine is None:
        return None
    return CacheSnapshot(engine.cache.nodes(), engine.cache.tiers(), time.monotonic())


def ago_text(seconds: float) -> str:
    if seconds < 1:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


class CachePanel(QDockWidget):
    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__("Radix cache", parent)
        self.setObjectName("cacheDock")
        self.worker = worker  # to act: the panel's reads and operations are its jobs
        self.engine_status = worker.engine_status  # to know: a model loaded, the cache revision
        self.snapshot: CacheSnapshot | None = None
        self.tree = QTreeWidget()
        self.tree.setObjectName("cacheTree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels([c for c, _ in COLUMNS])
        for i, (_c, tip) in enumerate(COLUMNS):
            self.tree.headerItem().setToolTip(i, tip)
        self.tree.setSelectionMode(QAbstractItemView.SingleSelection)
        self.tree.setUniformRowHeights(True)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.tree.header().setSectionResizeMode(1, QHeaderView.Stretch)
        self.tree.header().setStretchLastSection(False)
        self.tree.itemSelectionChanged.connect(self._selection_changed)

        self.bars: dict[str, QProgressBar] = {}
        tiers = QGridLayout()
        for r, (name, title) in enumerate(TIERS.items()):
            bar = QProgressBar()
            bar.setObjectName(f"tier_{name}")
            bar.setTextVisible(True)
            bar.setRange(0, 1)
            bar.setValue(0)
            bar.setFormat("—")
            tiers.addWidget(QLabel(title), r // 3, 2 * (r % 3))
            tiers.addWidget(bar, r // 3, 2 * (r % 3) + 1)
            self.bars[name] = bar

        self.evict_btn = QPushButton("Evict")
        self.evict_btn.setObjectName("cacheEvict")
        self.evict_btn.setToolTip("Move the selected node one tier down: resident → RAM → file "
                                  "→ dropped")
        self.pin_btn = QPushButton("Pin")
        self.pin_btn.setObjectName("cachePin")
        self.pin_btn.setToolTip("A pinned node stays where it is whatever the caps")
        self.refresh_btn = QPushButton("Refresh")
        self.clear_btn = QPushButton("Clear")
        self.clear_btn.setObjectName("cacheClear")
        self.clear_btn.setToolTip("Drop every cached prompt and what the work context holds; "
                                  "the next runs evaluate and cache their prompts again")
        self.clear_btn.clicked.connect(self.clear_all)
        self.evict_btn.clicked.connect(self.evict_selected)
        self.pin_btn.clicked.connect(self.toggle_pin)
        self.refresh_btn.clicked.connect(self.refresh)
        self.message = QLabel("")
        self.message.setObjectName("cacheMessage")
        self.message.setWordWrap(True)
        buttons = QHBoxLayout()
        for b in (self.evict_btn, self.pin_btn, self.clear_btn, self.refresh_btn):
            buttons.addWidget(b)
        buttons.addWidget(self.message, 1)

        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(tiers)
        lay.addWidget(self.tree, 1)
        lay.addLayout(buttons)
        self.setWidget(body)
        self._selection_changed()
        follow(self, self.engine_status.events.cache_revision, self._cache_changed)
        if self.engine_status.info is not None:
            self.refresh()

    # ---- reading the cache
    def _cache_changed(self, _revision: int) -> None:
        if self.engine_status.info is not None:
            self.refresh()

    def refresh(self) -> None:
        self._submit(JobKind.CACHE_VIEW, lambda e, t: read_cache(e), self.show_snapshot)

    def _submit(self, kind: JobKind, fn, on_done, **kw) -> None:
        """Queue after what runs (never cancel the user's job); nothing once the worker is shut."""
        if self.engine_status.closed:
            return
        try:
            self.worker.submit(kind, fn, cancel_running=False, on_done=on_done, **kw)
        except RuntimeError:
            pass

    def show_snapshot(self, snap: CacheSnapshot | None) -> None:
        selected = self.selected_id()
        self.snapshot = snap
        self.tree.clear()
        for bar in self.bars.values():
            bar.setRange(0, 1)
            bar.setValue(0)
            bar.setFormat("—")
        if snap is None:
            self._selection_changed()
            return
        for t in snap.tiers:
            bar = self.bars.get(t.name)
            if bar is None:
                continue
            cap_kb = max(t.cap_bytes // 1000, 1)  # kB: a progress bar holds an int
            bar.setRange(0, cap_kb)
            bar.setValue(min(t.used_bytes // 1000, cap_kb))
            bar.setFormat(f"{size_text(t.used_bytes)} of {size_text(t.cap_bytes)} · "
                          f"{t.nodes} node{'s' if t.nodes != 1 else ''}")
        items: dict[int, QTreeWidgetItem] = {}
        for n in snap.nodes:  # parents come before their children
            parent = items.get(n.parent_id)
            item = QTreeWidgetItem(parent) if parent else QTreeWidgetItem(self.tree)
            own = f" (+{n.own_tokens:,})" if n.own_tokens != n.tokens else ""
            cells = [n.label or "cached prompt", n.text, f"{n.tokens:,}{own}", n.tier,
                     size_text(n.nbytes) + (f" (recurrent {size_text(n.recurrent_bytes)})"
                                            if n.recurrent_bytes else ""), str(n.hits),
                     ago_text(snap.now - n.last_used) if n.last_used else "never",
                     "pinned" if n.pinned else ""]
            for c, text in enumerate(cells):
                item.setText(c, text)
                if c in (2, 4, 5):
                    item.setTextAlignment(c, Qt.AlignRight | Qt.AlignVCenter)
            item.setToolTip(1, n.text)
            if n.approx:
                item.setToolTip(0, f"approximate: {n.approx}")
                item.setForeground(3, Qt.darkYellow)
            item.setData(0, Qt.UserRole, n.id)
            items[n.id] = item
        self.tree.expandAll()
        if selected in items:
            self.tree.setCurrentItem(items[selected])
        self._selection_changed()

    # ---- selection and actions
    def node(self, node_id: int | None) -> CacheNodeInfo | None:
        if self.snapshot is None or node_id is None:
            return None
        return next((n for n in self.snapshot.nodes if n.id == node_id), None)

    def selected_id(self) -> int | None:
        item = self.tree.currentItem()
        return None if item is None else item.data(0, Qt.UserRole)

    def select(self, node_id: int) -> None:
        it = self._item(node_id)
        if it is not None:
            self.tree.setCurrentItem(it)

    def _item(self, node_id: int) -> QTreeWidgetItem | None:
        stack = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        while stack:
            it = stack.pop()
            if it.data(0, Qt.UserRole) == node_id:
                return it
            stack.extend(it.child(i) for i in range(it.childCount()))
        return None

    def _selection_changed(self) -> None:
        n = self.node(self.selected_id())
        self.evict_btn.setEnabled(n is not None and not n.pinned and n.tier != "gone")
        self.pin_btn.setEnabled(n is not None)
        self.pin_btn.setText("Unpin" if n is not None and n.pinned else "Pin")

    def evict_selected(self) -> None:
        n = self.node(self.selected_id())
        if n is not None:
            self._op(f"evicted “{n.label or 'cached prompt'}” from {n.tier}",
                     lambda e, i=n.id: e.cache.evict(i))

    def clear_all(self) -> None:
        self._op("cleared the cache", lambda e: e.clear_cache())

    def toggle_pin(self) -> None:
        n = self.node(self.selected_id())
        if n is not None:
            self._op(("unpinned" if n.pinned else "pinned") + f" “{n.label or 'cached prompt'}”",
                     lambda e, i=n.id, p=not n.pinned: e.cache.pin(i, p))

    def _op(self, done_text: str, fn) -> None:
        def job(engine, task):
            fn(engine)
            return read_cache(engine)

        def done(snap):
            self.show_snapshot(snap)
            self.show_message(done_text)

        self._submit(JobKind.CACHE_OP, job, done, on_error=lambda m: self.show_message(m, True))

    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet("color: #c62828;" if error else "color: #2e7d32;")
        self.message.setText(text)
