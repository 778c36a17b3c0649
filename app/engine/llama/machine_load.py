"""How busy the rest of the machine was while we timed something.

A timing taken while other programs compete for the cores says little about the kernels: on a
2-core Xeon the same prefix evaluation took 4.4-5.3 ms/token on a quiet machine and 38-57
ms/token beside other work, enough to invert a kernel choice. So a measurement records the CPU
time that OTHER processes used during it: the machine's busy time minus this process's own,
over the wall time of the timed work, in cores. Sources, best first:

- Linux: /proc/stat (the whole machine's busy jiffies) and os.times (this process);
- Windows: GetSystemTimes (kernel + user - idle) and os.times;
- elsewhere (macOS, BSD): os.getloadavg's one-minute average, less the one thread that measured:
  coarse and late, so the figure says which source it came from.
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


@dataclass(frozen=True)
class MachineLoad:
    """Other processes' CPU use during a measurement."""
    other_cores: float | None  # cores' worth of CPU time used by other processes; None: unknown
    n_cores: int
    source: str  # "/proc/stat", "GetSystemTimes", "load average" or "unknown"
    wall_s: float = 0.0  # the timed work's wall time the figure covers

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

    def describe(self) -> str:
        if self.other_cores is None:
            return "machine load unknown"
        return (f"other programs used {self.other_cores:.2f} of {self.n_cores} cores "
                f"({self.share:.0%}, {self.source})")

    def as_dict(self) -> dict:
        return {"other_cores": self.other_cores, "n_cores": self.n_cores, "source": self.source,
                "wall_s": self.wall_s}


def _proc_busy_s() -> float | None:
    """The whole machine's busy CPU seconds since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    vals = [int(v) for v in fields[1:9]]
    busy = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


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
    with what ran in between."""

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

    def __enter__(self) -> "LoadMeter":
        self._start = (self._clock(), self._own(), self._busy() if self._busy else None)
        return self

    def __exit__(self, *exc) -> None:
        t0, own0, busy0 = self._start
        wall = self._clock() - t0
        self.wall_s += wall
        if self._busy is not None and busy0 is not None:
            busy1 = self._busy()
            if busy1 is not None:
                self.other_s += max(0.0, (busy1 - busy0) - (self._own() - own0))
        elif self._loadavg is not None:
            try:
                # the one-minute average counts the thread that measured: take it out
                self._loads.append(max(0.0, self._loadavg()[0] - 1.0))
            except OSError:
                pass

    def result(self) -> MachineLoad:
        if self._busy is not None:
            # /proc/stat counts in jiffies (10 ms): spans shorter than a few of them are noise,
            # but a measurement's spans add up to seconds
            other = self.other_s / self.wall_s if self.wall_s > 0 else None
        elif self._loads:
            other = min(sum(self._loads) / len(self._loads), float(self.n_cores))
        else:
            other = None
        if other is not None:
            other = min(round(other, 3), float(self.n_cores))
        return MachineLoad(other, self.n_cores, self.source if other is not None else "unknown",
                           round(self.wall_s, 3))
