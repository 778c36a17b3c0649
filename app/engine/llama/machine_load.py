"""How busy the rest of the machine was while we timed something.

A timing taken while other programs compete for the cores says little about the kernels: on a
2-core Xeon the same prefix evaluation took 4.4-5.3 ms/token on a quiet machine and 38-57
ms/token beside other work, enough to invert a kernel choice. So a measurement records the CPU
time that OTHER processes used during it: the machine's busy time minus this process's own,
over the wall time of the timed work, in cores. Sources, best first:

- Linux: /proc/stat (the whole machine's busy jiffies) and os.times (this process). Processes
  niced below us (a build or a test suite at nice 19) are left out while we run at normal
  priority: the scheduler gives them only the CPU we leave idle, so they do not slow us, yet
  counted as others' use they fill every gap between our batches and read as a busy machine
  (the batch threads then stay at one, which leaves them a core, and a job's time left stays
  at a busy machine's speed). /proc/stat counts their user time apart ("nice"); while we run
  niced ourselves they compete with us, and count;
- Windows: GetSystemTimes (kernel + user - idle) and os.times;
- elsewhere (macOS, BSD): os.getloadavg's one-minute average, less the one thread that measured:
  coarse and late, so the figure says which source it came from.

A long measurement (a benchmark's call: its warm run, then a cold run ten times as long) is also
read in parts: ``LoadMeter.mark`` closes a part, named after the pass that ran in it. Averaged
over the whole call, a busy spell that overlapped only its warm run (the time the modes are
compared by) read 0.0035 of the cores; the busiest half second and the part around the warm run
say what that run saw.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

# other processes' share of the cores above which a timing is not trusted: a quarter of the
# machine (half a core on 2 cores) already moved the kernel timings by more than the gap
# between the kernels here
BUSY_SHARE = 0.25
# the shortest stretch of wall time a reading stands for: /proc/stat and os.times count 10 ms
# ticks, so a difference of readings is off by up to ~40 ms of CPU on 2 cores; over half a
# second that is below 0.04 of the cores, a sixth of BUSY_SHARE
WINDOW_S = 0.5
# a job given a fifth of the machine or less is taken to run at a fifth: readings near "every
# core busy" (others' use while we wait for a core) must not promise an endless job
MIN_FREE = 0.2


@dataclass(frozen=True)
class MachineLoad:
    """Other processes' CPU use during a measurement."""
    other_cores: float | None  # cores' worth of CPU time used by other processes; None: unknown
    n_cores: int
    source: str  # "/proc/stat", "GetSystemTimes", "load average" or "unknown"
    wall_s: float = 0.0  # the timed work's wall time the figure covers
    # read in parts (LoadMeter.mark): the busiest stretch of at least WINDOW_S, and the last
    peak_cores: float | None = None
    recent_cores: float | None = None

    @property
    def share(self) -> float | None:
        """Other processes' share of the machine's cores (0: quiet, 1: every core busy)."""
        if self.other_cores is None:
            return None
        return self.other_cores / max(self.n_cores, 1)

    @property
    def busy(self) -> bool:
        """Too busy to trust a timing; an unknown load is not called busy (nothing to go on)."""
        return self.share is not None and self.share > BUSY_SHARE

    @property
    def peak_share(self) -> float | None:
        """The busiest stretch's share of the cores (the whole's when not read in parts)."""
        if self.peak_cores is None:
            return self.share
        return self.peak_cores / max(self.n_cores, 1)

    @property
    def busy_at_times(self) -> bool:
        """Busy over the whole or over some half second of it: a spell that covered only
        part of a long measurement is not averaged away."""
        return self.busy or (self.peak_share is not None and self.peak_share > BUSY_SHARE)

    def free_share(self, recent: bool = False) -> float:
        """The share of the cores other programs left free (1: quiet or unknown), over the
        whole or (``recent``) its last stretch; never below MIN_FREE."""
        cores = self.recent_cores if recent and self.recent_cores is not None else self.other_cores
        if cores is None:
            return 1.0
        return min(1.0, max(MIN_FREE, 1.0 - cores / max(self.n_cores, 1)))

    def describe(self) -> str:
        if self.other_cores is None:
            return "machine load unknown"
        return (f"other programs used {self.other_cores:.2f} of {self.n_cores} cores "
                f"({self.share:.0%}, {self.source})")

    def as_dict(self) -> dict:
        return {"other_cores": self.other_cores, "n_cores": self.n_cores, "source": self.source,
                "wall_s": self.wall_s, "peak_cores": self.peak_cores,
                "recent_cores": self.recent_cores}


def _stat_line() -> str:
    with open("/proc/stat") as f:
        return f.readline()


def stat_busy_s(line: str, niced: bool) -> float | None:
    """Busy CPU seconds in /proc/stat's "cpu" line; ``niced``: with the user time of niced
    processes (the "nice" field)."""
    fields = line.split()
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    vals = [int(v) for v in fields[1:9]]
    busy = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)
    if not niced:
        busy -= vals[1]
    return busy / os.sysconf("SC_CLK_TCK")


def runs_niced() -> bool:
    """This process runs below normal priority (then niced processes compete with it)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        return False


def _proc_busy_s() -> float | None:
    """The machine's busy CPU seconds since boot, from /proc/stat: of the processes that
    compete with this one (niced ones only while this one is niced too)."""
    try:
        line = _stat_line()
    except OSError:
        return None
    return stat_busy_s(line, runs_niced())


def _windows_busy_s() -> float | None:
    """The whole machine's busy CPU seconds, from GetSystemTimes (100 ns units)."""
    if sys.platform != "win32":
        return None
    try:
        import ctypes
        from ctypes import wintypes

        idle, kernel, user = wintypes.FILETIME(), wintypes.FILETIME(), wintypes.FILETIME()
        if not ctypes.windll.kernel32.GetSystemTimes(ctypes.byref(idle), ctypes.byref(kernel),
                                                     ctypes.byref(user)):
            return None

        def s(ft) -> float:
            return ((ft.dwHighDateTime << 32) | ft.dwLowDateTime) / 1e7
        return s(kernel) + s(user) - s(idle)  # kernel time includes idle time
    except (OSError, AttributeError, ImportError):
        return None


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system  # every thread of this process, the GUI thread too


def busy_time_source():
    """The best source of the machine's busy CPU seconds here, or None (macOS, BSD)."""
    if _proc_busy_s() is not None:
        return _proc_busy_s, "/proc/stat"
    if _windows_busy_s() is not None:
        return _windows_busy_s, "GetSystemTimes"
    return None, ""


class LoadMeter:
    """Accumulates other processes' CPU time over the spans it is told to watch:

        meter = LoadMeter()
        with meter: time_something()
        with meter: time_something_else()
        meter.result()

    Only the watched spans count, so a measurement paused for the user's job is not charged
    with what ran in between. Inside a span, ``mark(tag)`` closes a part (what ran since the
    last mark, ``tag`` naming it: a pass's kind) and opens the next; ``result(tag)`` reads the
    parts around those tagged ``tag`` only."""

    def __init__(self, busy_s=None, own_s=None, clock=time.perf_counter, loadavg=None,
                 n_cores: int | None = None):
        self.n_cores = n_cores or os.cpu_count() or 1
        self._clock, self._own = clock, own_s or own_cpu_s
        self._loadavg = loadavg if loadavg is not None else getattr(os, "getloadavg", None)
        if busy_s is not None:
            self._busy, self.source = busy_s, "injected"
        else:
            self._busy, self.source = busy_time_source()
            if self._busy is None:
                self.source = "load average" if self._loadavg else "unknown"
        self.other_s = 0.0
        self.wall_s = 0.0
        self._loads: list[float] = []
        self._start: tuple[float, float, float | None] | None = None
        self.parts: list[tuple[str, float, float]] = []  # (tag, wall s, others' CPU s)

    def _read(self) -> tuple[float, float, float | None]:
        return self._clock(), self._own(), self._busy() if self._busy else None

    def __enter__(self) -> "LoadMeter":
        self._start = self._read()
        return self

    def mark(self, tag: str = "") -> None:
        """Close the part since the last mark (or the span's start) as ``tag``; outside a
        span, nothing."""
        if self._start is None or self._busy is None:
            return
        self._close(tag)
        self._start = self._read()

    def _close(self, tag: str) -> None:
        t0, own0, busy0 = self._start
        wall = self._clock() - t0
        self.wall_s += wall
        if self._busy is not None and busy0 is not None:
            busy1 = self._busy()
            if busy1 is not None:
                other = max(0.0, (busy1 - busy0) - (self._own() - own0))
                self.other_s += other
                self.parts.append((tag, wall, other))
        elif self._loadavg is not None:
            try:
                # the one-minute average counts the thread that measured: take it out
                self._loads.append(max(0.0, self._loadavg()[0] - 1.0))
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self._close("")
        self._start = None

    def result(self, tag: str | None = None) -> MachineLoad:
        """The whole measurement's load, or (``tag``) the load over the parts from the first
        tagged ``tag`` to the last, widened by the parts after it (then before) to WINDOW_S."""
        if tag is not None:
            return self._around(tag)
        if self._busy is not None:
            # /proc/stat counts in jiffies (10 ms): spans shorter than a few of them are noise,
            # but a measurement's spans add up to seconds
            other = self.other_s / self.wall_s if self.wall_s > 0 else None
        elif self._loads:
            other = min(sum(self._loads) / len(self._loads), float(self.n_cores))
        else:
            other = None
        return self._load(other, self.wall_s, self.parts)

    def _load(self, other: float | None, wall: float, parts) -> MachineLoad:
        peak = recent = None
        if other is not None and parts:
            wins = _windows(parts)
            peak = max(o / w for w, o in wins if w > 0) if any(w > 0 for w, _o in wins) else None
            w, o = _last_window(parts)
            recent = o / w if w > 0 else None
        return MachineLoad(self._cores(other), self.n_cores,
                           self.source if other is not None else "unknown", round(wall, 3),
                           self._cores(peak), self._cores(recent))

    def recent_free(self) -> float | None:
        """The share of the cores others left free over the last WINDOW_S read in parts
        (None: less read so far)."""
        w, o = _last_window(self.parts)
        if w < WINDOW_S:
            return None
        return MachineLoad(o / w, self.n_cores, self.source).free_share()

    def _cores(self, x: float | None) -> float | None:
        return None if x is None else min(round(x, 3), float(self.n_cores))

    def _around(self, tag: str) -> MachineLoad:
        at = [i for i, p in enumerate(self.parts) if p[0] == tag]
        if not at:
            return self._load(None, 0.0, [])
        a, b = at[0], at[-1] + 1
        while sum(p[1] for p in self.parts[a:b]) < WINDOW_S and (b < len(self.parts) or a > 0):
            if b < len(self.parts):
                b += 1
            else:
                a -= 1
        got = self.parts[a:b]
        wall = sum(p[1] for p in got)
        other = sum(p[2] for p in got) / wall if wall > 0 else None
        return self._load(other, wall, got)


def _windows(parts) -> list[tuple[float, float]]:
    """Consecutive parts joined into stretches of at least WINDOW_S of wall time (a short
    last stretch joins the one before): (wall s, others' CPU s) each."""
    out: list[list[float]] = []
    w = o = 0.0
    for _tag, pw, po in parts:
        w, o = w + pw, o + po
        if w >= WINDOW_S:
            out.append([w, o])
            w = o = 0.0
    if w > 0 or not out:
        if out:
            out[-1][0] += w
            out[-1][1] += o
        else:
            out.append([w, o])
    return [(a, b) for a, b in out]


def _last_window(parts) -> tuple[float, float]:
    """The last parts adding up to at least WINDOW_S (all, if shorter)."""
    w = o = 0.0
    for _tag, pw, po in reversed(parts):
        w, o = w + pw, o + po
        if w >= WINDOW_S:
            break
    return w, o
