"""Who hears about changes of the KV cells, and how often.

A front end draws the cell map while a long job runs on the engine's thread: after each change
of cells the engine builds a view (kv_view.py) and hands it to every listener, but at most once
per the shortest interval any listener asked for, so that drawing never slows evaluation. The
caller publishes a final view itself when a job ends.
"""
from __future__ import annotations

import time
from typing import Callable


class KvListeners:
    def __init__(self, make_view: Callable[[], object]):
        self._make_view = make_view
        self._listeners: list[tuple[Callable, float]] = []
        self._published = 0.0

    def add(self, fn: Callable, min_interval_s: float = 0.05) -> None:
        self._listeners.append((fn, min_interval_s))

    def remove(self, fn: Callable) -> None:
        self._listeners = [(f, i) for f, i in self._listeners if f != fn]

    def changed(self, settled: bool = False) -> None:
        """The cells changed. After one llama.cpp call (a batch, a copy) listeners hear at most
        every min_interval_s; after a whole compound operation (``settled``: the radix cache's,
        held by ``ctx.held_changes``) always, since nothing may follow it for a long time and
        its last picture must not be a throttled-away half of it."""
        if not self._listeners:
            return
        now = time.perf_counter()
        if not settled and now - self._published < min(i for _f, i in self._listeners):
            return
        self._published = now
        view = self._make_view()
        for fn, _i in list(self._listeners):
            fn(view)
