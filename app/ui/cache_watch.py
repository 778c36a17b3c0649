"""One picture of the KV cells and the radix cache for the KV Cache dock and the Cache panel.

Both panels draw from the same ``CachePicture``: the cell map, which radix node each sequence
holds, and the cache's nodes and tiers, all read at one moment on the engine's thread. So the
two never disagree. (They did: the KV dock got live views from the engine while a benchmark ran,
but the Cache panel read only when the job had ended, its read queued behind the benchmark, so
it kept "5 nodes" while the map had already lost their cells.)

Pictures come from two places: a read job whenever the engine status's cache revision moves
(after every job that can change cells or nodes, a model load included) or a panel asks, and
the engine's own KV listener while a job runs (``Engine.add_kv_listener``, throttled there),
which arrive here as a queued signal and are passed on at most ~20 times a second (the last
one wins). Both panels hear the same pictures in the same order. There is one watch per worker
(``CacheWatch.of``).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from ..engine.cache.radix_cache import CacheNodeInfo, TierUsage
from ..engine.kv.kv_view import KvCacheView
from ..engine.kv_flows import SeqNode, cached_sequences
from .engine_worker import EngineWorker, JobKind
from .model_events import follow

REDRAW_MS = 50  # live pictures: at most ~20 a second

@dataclass(frozen=True)
class CacheSnapshot:
    nodes: list[CacheNodeInfo]
    tiers: list[TierUsage]
    now: float  # time.monotonic() when read: nodes' last_used is on that clock
    wall: float  # time.time() at the same moment: when a node was last used, for people


@dataclass(frozen=True)
class CachePicture:
    """The cells and the cache at one moment (None: no model loaded)."""
    view: KvCacheView | None
    nodes: dict[int, SeqNode] = field(default_factory=dict)  # sequence → the radix node it holds
    cache: CacheSnapshot | None = None


def read_cache(engine) -> CacheSnapshot | None:
    """The cache's nodes and tiers (worker thread)."""
    if engine is None:
        return None
    return CacheSnapshot(engine.cache.nodes(), engine.cache.tier_usage(), time.monotonic(),
                         time.time())


def read_picture(engine, view: KvCacheView | None = None) -> CachePicture:
    """The cells (``view`` if the engine just published one) and the cache (worker thread)."""
    if engine is None:
        return CachePicture(None)
    return CachePicture(view or engine.kv_view(), cached_sequences(engine), read_cache(engine))


class CacheWatch(QObject):
    arrived = Signal(object)  # CachePicture, on the GUI thread: draw it
    _live = Signal(object)  # CachePicture, emitted from the engine's thread (queued)

    @classmethod
    def of(cls, worker: EngineWorker) -> "CacheWatch":
        """The worker's watch, made on first use (the panels share it)."""
        watch = worker.findChild(CacheWatch)
        return watch if watch is not None else cls(worker)

    def __init__(self, worker: EngineWorker):
        super().__init__(worker)
        self.worker = worker
        self.engine_status = worker.engine_status
        self.picture: CachePicture | None = None  # the last one delivered
        self._watched = None  # weakref to the engine whose live pictures we get (worker thread)
        self._pending: CachePicture | None = None  # a live picture waiting for the timer
        self._timer = QTimer(self, singleShot=True, interval=REDRAW_MS)
        self._timer.timeout.connect(self._pass_pending)
        self._live.connect(self._queue)
        self.arrived.connect(self._remember)
        follow(self, self.engine_status.events.info, self._model_changed)
        follow(self, self.engine_status.events.cache_revision, self._cache_changed)

    def _remember(self, picture: CachePicture) -> None:
        self.picture = picture
        self._pending = None  # older than what was just delivered

    def _queue(self, picture: CachePicture) -> None:
        self._pending = picture
        if not self._timer.isActive():
            self._timer.start()

    def _pass_pending(self) -> None:
        if self._pending is not None:
            self.arrived.emit(self._pending)

    def _model_changed(self, info) -> None:
        if info is None:  # a load brings its own revision, and so its picture
            self.arrived.emit(CachePicture(None))

    def _cache_changed(self, _revision: int) -> None:
        if self.engine_status.info is not None:
            self.refresh()

    def refresh(self) -> None:
        """Read a fresh picture after the jobs already queued (never cancel the user's job)."""
        self.submit(lambda engine: None)

    def submit(self, act, *, kind: JobKind = JobKind.CACHE_VIEW, label: str = "",
               on_done=None, on_error=None) -> None:
        """Run ``act(engine)`` on the worker, then read the picture; on the GUI thread both
        panels get it, then ``on_done(picture)`` runs. Nothing once the worker is shut."""
        if self.engine_status.closed:
            return

        def job(engine, task):
            act(engine)
            return self.read(engine)

        def done(picture: CachePicture) -> None:
            self.arrived.emit(picture)
            if on_done is not None:
                on_done(picture)

        try:
            self.worker.submit(kind, job, label=label, cancel_running=False, on_done=done,
                               on_error=on_error)
        except RuntimeError:  # shut down between the check and the submit
            pass

    def read(self, engine) -> CachePicture:
        """The picture (worker thread). First, once per engine (a load makes a new one), ask it
        for the views it publishes while jobs run."""
        if engine is not None and (self._watched is None or self._watched() is not engine):
            def publish(view, engine=engine):  # the engine's thread; the signal delivers it queued
                try:
                    self._live.emit(read_picture(engine, view))
                except RuntimeError:  # the watch is gone; the engine outlives it briefly
                    pass

            engine.add_kv_listener(publish)
            self._watched = weakref.ref(engine)
        return read_picture(engine)
