"""How many threads a prompt batch gets: the cores the rest of the machine leaves free.

llama.cpp's CPU backend waits for its threads at a barrier after every graph node, spinning
(ggml_barrier, or libgomp's spinning barrier in an OpenMP build). When other programs keep the
cores busy, a thread that lost its core holds up every other one, which spins on: on a 2-core
Xeon with about ten other runnable threads, the same 25-token decode took 0.89 s with one batch
thread and 10.1 s with two. On a quiet machine two threads are about 1.4x faster than one. So
with the thread count left to the app ("auto"), each batch gets the cores other processes did
not use lately, between one and every core.

The figure is other processes' CPU time (the machine's busy time less this process's own, as
machine_load.py measures it) over the last second or so of wall time, our own decodes and the
gaps between them alike. While we run, the others get less than they would take, so the
estimate errs towards more threads; it falls back as soon as they show up.

Exactness does not depend on it: a batch of two or more tokens computes every output element in
one thread whatever the thread count (matrix rows, softmax and flash attention rows are
split between threads whole), and llama.cpp decodes a single token with the generation threads
(``n_threads``), which stay fixed. tests/engine/llama/test_thread_fit.py checks it bit for bit.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from .machine_load import busy_time_source, own_cpu_s
from .thread_count import logical_cpus

MIN_SPAN_S = 0.1  # /proc/stat counts 10 ms jiffies: shorter spans are mostly rounding
MEMORY_S = 1.0  # how much recent wall time the estimate stands for
# give a core to the batch unless others used more than this share of it: background noise
# (an editor, a browser tab) must not halve a quiet machine's speed
CORE_FREE_AT = 0.5


@dataclass(frozen=True)
class ThreadReading:
    """What the fit knows now: other processes' cores lately, and the threads it gives a batch."""
    other_cores: float | None  # None: not measured yet, or no source on this system
    threads: int
    n_cores: int
    adaptive: bool  # False: a fixed thread count the user set

    def describe(self) -> str:
        count = f"{self.threads} batch thread{'s' if self.threads != 1 else ''}"
        if not self.adaptive:
            return f"{count} (set)"
        if self.other_cores is None:
            return f"{count} (auto: all {self.n_cores} cores; load not measured yet)"
        return (f"{count} (auto: other programs used {self.other_cores:.1f} of "
                f"{self.n_cores} cores lately)")


class ThreadFit:
    """Batch threads for one engine's contexts. ``fixed``: the user's count, never changed.

    ``threads()`` is asked before each batch decode; it samples the machine's and this
    process's CPU time (two small reads) and updates the estimate once enough time passed."""

    def __init__(self, fixed: int = 0, n_cores: int | None = None,
                 busy_s: Callable[[], float | None] | None = None,
                 own_s: Callable[[], float] = own_cpu_s, clock: Callable[[], float] = time.monotonic):
        self.n_cores = n_cores or logical_cpus()
        self.fixed = fixed
        if busy_s is None:
            busy_s = busy_time_source()[0]
        self._busy, self._own, self._clock = busy_s, own_s, clock
        self.other_cores: float | None = None
        self._last = self._sample()
        self._pinned = 0  # generation threads held for a run (``pinned``); 0: none

    def _sample(self) -> tuple[float, float, float] | None:
        if self._busy is None:
            return None
        busy = self._busy()
        return None if busy is None else (self._clock(), busy, self._own())

    @property
    def adaptive(self) -> bool:
        return self.fixed <= 0 and self._busy is not None

    def threads(self) -> int:
        """Threads for the next batch."""
        if self.fixed > 0:
            return self.fixed
        self._update()
        if self.other_cores is None:
            return self.n_cores
        free = self.n_cores - self.other_cores
        return max(1, min(self.n_cores, int(free + CORE_FREE_AT)))

    def _update(self) -> None:
        if self._last is None:
            self._last = self._sample()
            return
        if self._clock() - self._last[0] < MIN_SPAN_S:
            return  # every decode asks: read /proc/stat only when the span can count
        now = self._sample()
        if now is None:
            return
        wall = now[0] - self._last[0]
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / wall
        others = min(others, float(self.n_cores))
        w = min(1.0, wall / MEMORY_S)  # a long gap outweighs what came before it
        self.other_cores = others if self.other_cores is None else (
            (1 - w) * self.other_cores + w * others)
        self._last = now

    # ---- generation: one-token decodes
    def generation_threads(self) -> int:
        """Threads for a one-token decode: the count pinned for the run in progress, else the
        batch count. Flash attention splits a one-token decode's cache by thread count, so a
        warm run and its cold run must generate on the same count: ``pinned`` holds it."""
        return self._pinned if self._pinned else self.threads()

    @contextmanager
    def pinned(self, count: int = 0):
        """One count for every one-token decode inside (a run's warm and cold paths alike):
        ``count`` (a run verified later: the count its warm path held), else the batch count now."""
        outer = self._pinned
        if not outer:
            self._pinned = count or self.threads()
        try:
            yield self._pinned
        finally:
            self._pinned = outer

    def reading(self) -> ThreadReading:
        threads = self.threads()
        return ThreadReading(None if self.other_cores is None else round(self.other_cores, 2),
                             threads, self.n_cores, self.adaptive)


_SHARED: ThreadFit | None = None


def shared_fit() -> ThreadFit:
    """The process's one estimate (the machine's load is the same for every context)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = ThreadFit()
    return _SHARED
