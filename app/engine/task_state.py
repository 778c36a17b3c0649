"""How a long engine job talks to whoever started it, without knowing about Qt.

Modelled on Orange3's TaskState: the job is a plain function that calls ``report`` after each
batch and ``check`` to learn whether it should stop. The window passes callbacks that post to
the GUI thread; the CLI passes a progress printer; tests pass nothing or a recorder.

A job made of items (the rows of a benchmark, in each reuse mode) also says where it is in the
whole: ``begin_job`` once, ``begin_item``/``end_item`` around each item. Every report then
carries a ``JobStep`` ("row 7 of 10 · chain", the items finished, the time the whole job has
left), so the window's status bar and the CLI's line, both written by ``progress_line``, show
the whole job as well as the current pass. A job that planned its passes up front (a
benchmark: progress_plan.py) gets its time left and share done from that plan; another, from
the mean time of the items finished.

A pass's time left (``PassClock``) is not its tokens left at the mean speed: attention costs
more the further into the context a token lies, so a long prime slows as it goes (95 tok/s at
the start of a 6,855-token prefix on a 1B model, 60 at its end). Each batch's time is fitted as
``a`` per token plus ``b`` per token per position (least squares over the batches done), and the
time left is that model summed over the positions still to come.
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
    eta_s: float | None  # the whole job's time left; None while nothing measured times it
    share: float | None = None  # the share done, from the job's plan (progress_plan.py)

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
    left_s: float | None = None  # the pass's time left from its batches (PassClock), if known
    speed: float = 0.0  # tokens/s over the last batches (0: not measured)

    @property
    def rate(self) -> float:
        """Tokens per second now (the last batches), else since the pass began."""
        if self.speed > 0:
            return self.speed
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """The pass's time left: from the batches' fit, else the tokens left at the mean rate."""
        if self.left_s is not None:
            return self.left_s
        r = self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (self.total - self.done) / r if r > 0 else None

    @property
    def fraction(self) -> float:
        """How far the whole is, 0 to 1: the items finished and the running pass's share of
        one more (a job of one row fills with its passes), else the pass alone."""
        part = min(self.done / self.total, 1.0) if self.total > 0 else 0.0
        if self.job is None:
            return part
        j = self.job
        if j.share is not None:
            return min(max(j.share, 0.0), 1.0)
        if j.total <= 0:
            return 0.0
        extra = 0.0 if self.whole or j.done >= j.total else part
        return min((j.done + extra) / j.total, 1.0)

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
    plan: Any = None  # a JobPlan (progress_plan.py) of every pass, when the job made one

    def eta(self, now: float) -> float | None:
        """Time left: the plan's, when the job made one; else the items left at the mean time
        of the finished items of the current part, else of all."""
        if self.plan is not None:
            return self.plan.time_left(now)
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
        share = self.plan.fraction(now) if self.plan is not None else None
        return JobStep(self.stage, self.unit, self.index, self.count, self.number or self.index,
                       self.part, self.done, self.total, now - self.start, self.eta(now), share)


def fit_batch_times(batches: list[tuple[int, int, float]],
                    slope: bool = True) -> tuple[float, float]:
    """(a, b) of ``seconds = a * tokens + b * (sum of the tokens' positions)`` fitted by least
    squares to ``batches`` of (first position, end position, seconds), both at least 0, the
    slope shrunk toward 0 as far as it is uncertain; with too few batches to tell the slope (or
    ``slope`` False), b is 0: the mean time per token."""
    n = [float(e - s) for s, e, _t in batches]
    pos = [(e - s) * (s + e - 1) / 2.0 for s, e, _t in batches]
    t = [dt for _s, _e, dt in batches]
    flat = (sum(t) / sum(n) if sum(n) > 0 else 0.0), 0.0
    if len(batches) < 3 or not slope:
        return flat
    snn = sum(x * x for x in n)
    snp = sum(x * y for x, y in zip(n, pos))
    spp = sum(y * y for y in pos)
    snt = sum(x * z for x, z in zip(n, t))
    spt = sum(y * z for y, z in zip(pos, t))
    det = snn * spp - snp * snp
    if det <= 1e-9 * snn * spp:  # the batches do not spread over positions enough
        return flat
    a = (snt * spp - snp * spt) / det
    b = (snn * spt - snp * snt) / det
    if b <= 0:
        return flat
    # a slope barely above its own noise (a few batches, a busy machine) would be extrapolated
    # far: shrink it by b^2 / (b^2 + var(b)), and take a so that the batches' time is kept
    resid = sum((z - a * x - b * y) ** 2 for x, y, z in zip(n, pos, t))
    var_b = resid / max(len(batches) - 2, 1) * snn / det
    b *= b * b / (b * b + var_b)
    a = (sum(t) - b * sum(pos)) / sum(n)
    if a < 0:
        return 0.0, spt / spp
    return a, b


def time_left(a: float, b: float, done: int, total: int) -> float:
    """The fitted model summed over positions ``done``..``total`` - 1."""
    left = max(total - done, 0)
    return a * left + b * left * (done + total - 1) / 2.0


# stages whose count is not one sequence's positions (rows, steps; "fork": many sequences'
# tokens side by side): no slope to fit
FLAT_STAGES = frozenset({"bench", "sweep", "server", "deploy", "run", "load", "fork"})


@dataclass
class PassClock:
    """One pass's reports: when it began and each batch's positions and time."""
    start: float
    last: tuple[int, float]  # (tokens done, time) at the last report
    positional: bool = True  # tokens at growing positions (not items): fit the slope
    batches: list[tuple[int, int, float]] = field(default_factory=list)

    def add(self, done: int, now: float) -> None:
        d0, t0 = self.last
        if done > d0:
            self.batches.append((d0, done, now - t0))
        self.last = (done, now)

    def left(self, done: int, total: int) -> float | None:
        """Time left: the batch fit over the batches done (the first one left out once there
        are four: it pays the pass's one-off costs), None before the first batch."""
        got = self.batches[1:] if len(self.batches) > 3 else self.batches
        if not got or done >= total:
            return None if not got else 0.0
        a, b = fit_batch_times(got, slope=self.positional)
        return time_left(a, b, done, total)

    def speed(self) -> float:
        """Tokens/s over the last three batches."""
        last = self.batches[-3:]
        secs = sum(dt for _s, _e, dt in last)
        return sum(e - s for s, e, _dt in last) / secs if secs > 0 else 0.0


class TaskState:
    def __init__(self, on_progress: Callable[[Progress], None] | None = None,
                 on_partial: Callable[[Any], None] | None = None):
        self._cancel = threading.Event()
        self.on_progress = on_progress
        self.on_partial = on_partial
        self._passes: dict[str, PassClock] = {}
        self._job: _JobClock | None = None
        # told of every report first (stage, tokens done): a benchmark reads the machine's
        # load pass by pass with it
        self.on_report: Callable[[str, int], None] | None = None

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self, kept_tokens: int = 0) -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled", kept_tokens)

    def report(self, stage: str, done: int, total: int) -> None:
        if self.on_report is not None:
            self.on_report(stage, done)
        now = time.perf_counter()
        clock = self._passes.get(stage)
        if clock is None or done == 0 or done < clock.last[0]:  # a new pass of this stage
            clock = self._passes[stage] = PassClock(now, (done, now), stage not in FLAT_STAGES)
        else:
            clock.add(done, now)
        left = clock.left(done, total)
        j = self._job
        if j is not None and j.plan is not None and j.item_start is not None:
            j.plan.in_pass(stage, done, total, left)
        if self.on_progress:
            job = j.step(now) if j else None
            self.on_progress(Progress(stage, done, total, now - clock.start, job, left,
                                      clock.speed()))

    # ---- the whole job
    def begin_job(self, stage: str, total: int, unit: str = "row", plan: Any = None) -> None:
        """A job of ``total`` items begins (a nested flow's own begin_job does not restart it).
        ``plan``: a JobPlan of its items' passes (progress_plan.py), one step per item, which
        then gives the time left and the share done."""
        if self._job is None:
            self._job = _JobClock(stage, total, unit, time.perf_counter(), plan=plan)
            self._report_job()

    def begin_item(self, index: int, count: int, *, number: int = 0, part: str = "") -> None:
        """Item ``index`` of ``count`` of ``part`` starts (``number``: as the user knows it)."""
        j = self._job
        if j is not None:
            j.index, j.count, j.number, j.part = index, count, number, part
            j.item_start = time.perf_counter()
            if j.plan is not None:
                j.plan.begin(j.item_start)
            self._report_job()

    def end_item(self, passes: list | None = None) -> None:
        """The running item finished; ``passes``: the DonePasses it ran, for the job's plan."""
        j = self._job
        if j is not None and j.item_start is not None:
            now = time.perf_counter()
            j.durations.append((j.part, now - j.item_start))
            if j.plan is not None:
                j.plan.end(now, passes or [])
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
    eta, of = None, ""
    if p.job is not None and p.job.done < p.job.total:
        eta = p.job.eta_s
    if eta is None and not p.whole:  # no item finished yet (a run of one row): the pass's
        eta = p.eta_s if p.done < p.total else None
        # of a job of several items, only the pass's time is known yet: say so
        of = " in this pass" if p.job is not None and p.job.total > 1 else ""
    if eta is not None:
        parts.append(f"{duration_text(eta)} left{of}")
    head = label or (p.job.stage if p.job else "")
    return f"{head}: " + " · ".join(parts) if head else " · ".join(parts)
