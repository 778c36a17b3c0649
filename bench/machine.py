"""Where the figures came from: the machine, the software, and how busy the machine was."""
from __future__ import annotations

import os
import platform
import time

import llama_cpp


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": cpus,
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start": loadavg(),
    }


class CpuShare:
    """How much of its threads' time this process got: CPU seconds / (wall seconds × threads).
    Near 1.0 on a quiet machine; well below it when other work competes for the cores."""

    def __init__(self, threads: int, children: bool = False):
        """``children``: count the CPU time of child processes that ended (a section that
        runs its work in children, bench/scale.py)."""
        self.threads = max(threads, 1)
        self.children = children
        self.t0 = time.perf_counter()
        self.c0 = _cpu_seconds(children)

    def value(self) -> float:
        wall = time.perf_counter() - self.t0
        return ((_cpu_seconds(self.children) - self.c0) / (wall * self.threads)
                if wall > 0 else 0.0)


def _cpu_seconds(children: bool = False) -> float:
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)
