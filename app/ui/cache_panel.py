"""The Cache panel: the radix cache's tree of cached prompts, each tier's use against its cap,
and the Evict and Pin actions.

What it shows comes from the cache watch (cache_watch.py): ``engine.cache.nodes()`` and
``engine.cache.tier_usage()`` read on the worker thread in the same picture as the KV dock's cell
map, after every job that can change the cache (its own actions included) and live while jobs
run, so the panel and the map always agree. Evict moves a node one tier down (resident → RAM
→ file → dropped); a pinned node is never evicted, by the user or by the caps.

The RAM bar counts the nodes whose snapshot is in RAM and, named apart, the kept copies: the
state of each node's last copy into the work context, kept so that the next run of the same
prompt only restores it (they count against the RAM cap and are dropped first).

The tree fits its column of the window (about 430 pixels at 1366×768, 380 at the narrowest)
without scrolling sideways: the node's text, long and in its tooltip whole, is the last column,
which ends in "…" in the room the numbers leave; the headers are short words (a column of long
texts shrinks down to its header); a node's age takes at most four characters ("3m"), the time
it was used in the cell's tooltip; a pinned node says so before its name (a column of its own
would not fit); the widths are table_columns.py's, as every table's. Each tier's bar is
tier_bars.py's: its text above it, never over its fill.
"""
from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QDockWidget, QHBoxLayout, QLabel,
                               QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from ..engine import kv_flows
from ..engine.cache.radix_cache import CacheNodeInfo
from .byte_sizes import size_text
from .cache_watch import CachePicture, CacheSnapshot, CacheWatch
from .engine_worker import EngineWorker, JobKind
from .tier_bars import TIERS, TierBar

# short headers: a column of long texts shrinks down to its header, the others keep their
# texts whole, and all of them fit a 380-pixel panel
COLUMNS = [("node", "What the node adds to its parent's prompt: the static prefix, a value…; "
                    "pinned: never evicted"),
           ("text", "The node's own tokens as text"),
           ("tokens", "Tokens from the start of the prompt to the node's end (its own in brackets)"),
           ("tier", "resident: cells in the KV cache; ram: a snapshot in memory; file: on disk"),
           ("size", "Bytes of the node's own cells, with the recurrent state it keeps at its "
                    "depth on hybrid and recurrent models (in brackets)"),
           ("hits", "Runs that reused this node"),
           ("used", "Time since a run last used it: now, seconds (12s), minutes (3m), hours "
                    "(2h) or days (3d); the time it was used in the cell's tooltip")]
TEXT_COLUMN = 1  # shown last: it takes the room the other columns leave
AGE_COLUMN = 6  # "used"
TREE_INDENT = 12  # pixels a level (Qt's 20): a chain's deep nodes keep room for their label


def age_text(seconds: float) -> str:
    """A node's age in at most four characters ("now", "12s", "3m", "2h", "3d"), whole units
    (59.6 s is "59s"): the column stays as narrow as its header whatever the age ("1 min ago"
    widened it, and the tree scrolled sideways at 1366×768)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return "now"


def used_tip(used_at: float) -> str:
    """The age cell's tooltip: the time of day a run last used the node (``used_at``,
    time.time()'s clock), which unlike its age stays true as time passes."""
    return time.strftime("Last used at %H:%M:%S on %Y-%m-%d", time.localtime(used_at))


class CachePanel(QDockWidget):
    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__("Radix cache", parent)
        self.setObjectName("cacheDock")
        self.worker = worker  # to act: the panel's reads and operations are its jobs
        self.engine_status = worker.engine_status  # to know: the worker is open
        self.watch = CacheWatch.of(worker)  # the pictures of the cache, shared with the KV dock
        self.snapshot: CacheSnapshot | None = None
        self._items: dict[int, QTreeWidgetItem] = {}  # node id → its item in the tree
        self.tree = QTreeWidget()
        self.tree.setObjectName("cacheTree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels([c for c, _ in COLUMNS])
        for i, (_c, tip) in enumerate(COLUMNS):
            self.tree.headerItem().setToolTip(i, tip)
        self.tree.setSelectionMode(QAbstractItemView.SingleSelection)
        self.tree.setUniformRowHeights(True)
        self.tree.setIndentation(TREE_INDENT)
        self.tree.header().moveSection(TEXT_COLUMN, len(COLUMNS) - 1)
        self.tree.itemSelectionChanged.connect(self._selection_changed)

        self.bars = {name: TierBar(name) for name in TIERS}

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
        for bar in self.bars.values():
            lay.addWidget(bar)
        lay.addWidget(self.tree, 1)
        lay.addLayout(buttons)
        self.setWidget(body)
        self._selection_changed()
        self.watch.arrived.connect(self.show_picture)
        if self.engine_status.info is not None:
            self.refresh()

    # ---- reading the cache
    def refresh(self) -> None:
        """Ask for a fresh picture (after the jobs already queued); the KV dock gets it too."""
        self.watch.refresh()

    def show_picture(self, picture: CachePicture) -> None:
        self.show_snapshot(picture.cache)

    def show_snapshot(self, snap: CacheSnapshot | None) -> None:
        self.snapshot = snap
        tiers = {t.name: t for t in snap.tiers} if snap else {}
        for name, bar in self.bars.items():
            bar.show_usage(tiers.get(name))
        nodes = snap.nodes if snap else []
        self._sync_items(nodes)
        for n in nodes:  # the cells that changed (pictures come many times a second in jobs)
            item = self._items[n.id]
            age = snap.now - n.last_used
            own = f" (+{n.own_tokens:,})" if n.own_tokens != n.tokens else ""
            cells = [("pinned · " if n.pinned else "") + (n.label or "cached prompt"), n.text,
                     f"{n.tokens:,}{own}", n.tier,
                     size_text(n.nbytes) + (f" (recurrent {size_text(n.recurrent_bytes)})"
                                            if n.recurrent_bytes else ""), str(n.hits),
                     age_text(age) if n.last_used else "never"]
            for c, text in enumerate(cells):
                if item.text(c) != text:
                    item.setText(c, text)
            if item.data(AGE_COLUMN, Qt.UserRole) != n.last_used:  # a run used it (or new)
                item.setData(AGE_COLUMN, Qt.UserRole, n.last_used)
                item.setToolTip(AGE_COLUMN, used_tip(snap.wall - age) if n.last_used
                                else "No run has used it yet")
            tips = (f"approximate: {n.approx}" if n.approx else "", n.text)
            if (item.toolTip(0), item.toolTip(1)) != tips:
                item.setToolTip(0, tips[0])
                item.setToolTip(1, tips[1])
                item.setForeground(3, Qt.darkYellow if n.approx else self.tree.palette().text())
        self._selection_changed()

    def _sync_items(self, nodes: list[CacheNodeInfo]) -> None:
        """One item per node under its parent's: new nodes get one, a split's moves its item
        under the new parent, gone nodes lose theirs. Items are never made anew for nodes that
        stay (a long benchmark adds hundreds of nodes, and pictures arrive all along)."""
        changed = False
        scrolled = self.tree.verticalScrollBar().value()  # live pictures must not yank the list
        for n in nodes:  # parents come before their children
            parent = self._items.get(n.parent_id)
            item = self._items.get(n.id)
            if item is not None and item.parent() is parent:
                continue
            if item is None:
                item = self._items[n.id] = QTreeWidgetItem()
                for c in (2, 4, 5):
                    item.setTextAlignment(c, Qt.AlignRight | Qt.AlignVCenter)
                item.setData(0, Qt.UserRole, n.id)
            else:
                self._detach(item)
            if parent is None:
                self.tree.addTopLevelItem(item)
            else:
                parent.addChild(item)
            changed = True
        living = {n.id for n in nodes}
        gone = {i: self._items.pop(i) for i in [i for i in self._items if i not in living]}
        for item in gone.values():  # the highest gone items, whose subtrees are all gone now
            parent = item.parent()
            if parent is None or parent.data(0, Qt.UserRole) not in gone:
                self._detach(item)  # with its subtree: Qt deletes it, never touch it again
            changed = True
        if changed:
            self.tree.expandAll()
            self.tree.verticalScrollBar().setValue(scrolled)

    def _detach(self, item: QTreeWidgetItem) -> None:
        parent = item.parent()
        if parent is not None:
            parent.removeChild(item)
        else:
            self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))

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
                     lambda e, i=n.id: kv_flows.evict(e, i))

    def clear_all(self) -> None:
        self._op("cleared the cache", kv_flows.clear_cache)

    def toggle_pin(self) -> None:
        n = self.node(self.selected_id())
        if n is not None:
            self._op(("unpinned" if n.pinned else "pinned") + f" “{n.label or 'cached prompt'}”",
                     lambda e, i=n.id, p=not n.pinned: kv_flows.pin(e, i, p))

    def _op(self, done_text: str, fn) -> None:
        self.watch.submit(fn, kind=JobKind.CACHE_OP, on_done=lambda _p: self.show_message(done_text),
                          on_error=lambda m: self.show_message(m, True))

    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet("color: #c62828;" if error else "color: #2e7d32;")
        self.message.setText(text)
