"""How a long engine job talks to whoever started it, without knowing about Qt.

Modelled on Orange3's TaskState: the job is a plain function that calls ``report`` after each
batch and ``check`` to learn whether it should stop. The window passes callbacks that post to
the GUI thread; the CLI passes a progress printer; tests pass nothing or a recorder.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import Cancelled


@dataclass(frozen=True)
class Progress:
    stage: str  # "prime", "cold", "warm", "oneshot", "generate", "bench", ...
    done: int
    total: int
    elapsed_s: float

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        r = self.rate
        return (self.total - self.done) / r if r > 0 else None


class TaskState:
    def __init__(self, on_progress: Callable[[Progress], None] | None = None,
                 on_partial: Callable[[Any], None] | None = None):
        self._cancel = threading.Event()
        self.on_progress = on_progress
        self.on_partial = on_partial
        self._stage_start: dict[str, float] = {}

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
            self.on_progress(Progress(stage, done, total, now - start))

    def partial(self, result: Any) -> None:
        if self.on_partial:
            self.on_partial(result)

