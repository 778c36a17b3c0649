"""How a long engine job talks to whoever started it, without knowing about Qt.

Modelled on Orange3's TaskState: the job is a plain function that calls ``report`` after each
batch and ``check`` to learn whether it should stop. The window passes callbacks that post to
the GUI thread; the CLI passes a progress printer; tests pass nothing or a recorder.

A job made of items (the rows of a benchmark, in each reuse mode) also says where it is in the
whole: ``begin_job`` once, ``begin_item``/``end_item`` around each item. Every report then
carries a ``JobStep`` ("row 7 of 10 · chain", the items finished, the time the whole job has
left, estimated from the items finished), so the window's status bar and the CLI's line,
both written by ``progress_line``, show the whole job as well as the current pass.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import Cancelled


@dataclass(frozen=True)
class JobStep:
    """Where a job of items is: the item running (or just finished) and the whole's figures."""
    stage: str  # the whole job's stage ("bench", "run", "server")
    unit: str  # what an item is ("row")
    index: int  # the item's place among the items of its part, from 1
    count: int  # the items of its part ("of 10")
    number: int  # the item as the user knows it (row 7 of the table)
    part: str  # the part of the job it belongs to (a reuse mode), "" for a job of one part
    done: int  # items finished in the whole job
    total: int  # items in the whole job
    elapsed_s: float  # since the job began
    eta_s: float | None  # the whole job's time left; None until an item has finished

    def text(self) -> str:
        """"row 7 of 10 · chain"; a row chosen out of others: "row 7 (2 of 3)"."""
        where = (f"{self.unit} {self.index} of {self.count}" if self.number == self.index
                 else f"{self.unit} {self.number} ({self.index} of {self.count})")
        return f"{where} · {self.part}" if self.part else where


@dataclass(frozen=True)
class Progress:
    stage: str  # "prime", "cold", "warm", "oneshot", "generate", "bench", ...
    done: int
    total: int
    elapsed_s: float
    job: JobStep | None = None  # the whole job, when it is made of items

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        r = self.rate
        return (self.total - self.done) / r if r > 0 else None

    @property
    def whole(self) -> bool:
        """A report about the whole job (an item begun or finished), not about a pass."""
        return self.job is not None and self.stage == self.job.stage


@dataclass
class _JobClock:
    stage: str
    total: int
    unit: str
    start: float
    done: int = 0
    index: int = 0
    count: int = 0
    number: int = 0
    part: str = ""
    item_start: float | None = None  # None between items
    durations: list[tuple[str, float]] = field(default_factory=list)  # (part, seconds)

    def eta(self, now: float) -> float | None:
        """Time left: the items left at the mean time of the finished items of the current
        part (a later reuse mode skips the cold runs the first one shared), else of all."""
        if not self.durations:
            return None
        same = [d for p, d in self.durations if p == self.part]
        mean = statistics.fmean(same or [d for _p, d in self.durations])
        left = max(self.total - self.done, 0)
        if self.item_start is None or left == 0:
            return mean * left
        # the running item counts as a whole item until it takes longer than the mean
        return max(mean * left - (now - self.item_start), mean * (left - 1))

    def step(self, now: float) -> JobStep:
        return JobStep(self.stage, self.unit, self.index, self.count, self.number or self.index,
                       self.part, self.done, self.total, now - self.start, self.eta(now))


class TaskState:
    def __init__(self, on_progress: Callable[[Progress], None] | None = None,
                 on_partial: Callable[[Any], None] | None = None):
        self._cancel = threading.Event()
        self.on_progress = on_progress
        self.on_partial = on_partial
        self._stage_start: dict[str, float] = {}
        self._job: _JobClock | None = None

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self, kept_tokens: int = 0) -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled", kept_tokens)

    def report(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        start = self._stage_start.setdefault(stage, now)
        if done == 0:
            self._stage_start[stage] = start = now
        if self.on_progress:
            job = self._job.step(now) if self._job else None
            self.on_progress(Progress(stage, done, total, now - start, job))

    # ---- the whole job
    def begin_job(self, stage: str, total: int, unit: str = "row") -> None:
        """A job of ``total`` items begins (a nested flow's own begin_job does not restart it)."""
        if self._job is None:
            self._job = _JobClock(stage, total, unit, time.perf_counter())
            self._report_job()

    def begin_item(self, index: int, count: int, *, number: int = 0, part: str = "") -> None:
        """Item ``index`` of ``count`` of ``part`` starts (``number``: as the user knows it)."""
        j = self._job
        if j is not None:
            j.index, j.count, j.number, j.part = index, count, number, part
            j.item_start = time.perf_counter()
            self._report_job()

    def end_item(self) -> None:
        j = self._job
        if j is not None and j.item_start is not None:
            j.durations.append((j.part, time.perf_counter() - j.item_start))
            j.item_start = None
            j.done += 1
            self._report_job()

    def _report_job(self) -> None:
        j = self._job
        self.report(j.stage, j.done, j.total)

    def partial(self, result: Any) -> None:
        if self.on_partial:
            self.on_partial(result)


def duration_text(seconds: float) -> str:
    """"<1 s", "45 s", "3 min 10 s", "1 h 05 min"."""
    s = round(seconds)
    if seconds < 1:
        return "<1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_line(label: str, p: Progress) -> str:
    """One line for a report: the whole job ("row 7 of 10 · chain"), the current pass
    ("warm 1,280/1,836 · 240 tok/s") and the time left ("3 min 10 s left"). The window's status
    bar and the CLI both show it."""
    if p.stage == "load":
        return f"{label or p.stage}…"
    parts = []
    if p.job is not None:
        parts.append(p.job.text() if p.job.index else f"{p.job.done} of {p.job.total} "
                                                      f"{p.job.unit}s")
    if not p.whole:
        parts.append(f"{p.stage} {p.done:,}/{p.total:,}")
        if p.rate > 0 and p.stage not in ("bench", "sweep", "server", "deploy"):
            parts.append(f"{p.rate:,.0f} tok/s")
    if p.job is not None:
        eta = p.job.eta_s if p.job.done < p.job.total else None
    else:
        eta = p.eta_s if p.done < p.total else None
    if eta is not None:
        parts.append(f"{duration_text(eta)} left")
    head = label or (p.job.stage if p.job else "")
    return f"{head}: " + " · ".join(parts) if head else " · ".join(parts)
