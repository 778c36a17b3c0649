"""One worker thread owns the engine (and so the llama context); the GUI thread never calls it.

A job is a plain function ``fn(engine, task)`` (Orange3's task-state pattern): it reports
progress and partial results through ``task`` and checks ``task`` for cancellation between
batches. Progress, partial results and the single done/error outcome arrive on the GUI thread
as Qt signals (emitted from the worker thread, delivered queued). Starting a job while another
runs cancels the running one; the new one starts when it has stopped, since the pool has one
thread.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from ..engine import Cancelled, Engine, EngineConfig, KvPrimerError, TaskState

log = logging.getLogger("kvprimer.ui")
_ids = itertools.count(1)

JobFn = Callable[[Engine | None, TaskState], Any]


@dataclass
class Job:
    name: str
    fn: JobFn = field(repr=False)
    id: int = field(default_factory=lambda: next(_ids))
    task: TaskState = field(default_factory=TaskState, repr=False)
    future: Future | None = field(default=None, repr=False)
    result: Any = None
    error: str | None = None  # a message for the user
    cancelled: bool = False
    on_done: Callable[[Any], None] | None = field(default=None, repr=False)
    on_error: Callable[[str], None] | None = field(default=None, repr=False)
    on_cancelled: Callable[["Job"], None] | None = field(default=None, repr=False)

    @property
    def outcome(self) -> str:
        return "cancelled" if self.cancelled else "error" if self.error else "done"


class EngineWorker(QObject):
    progress = Signal(object, object)  # Job, Progress
    partial = Signal(object, object)  # Job, partial result (TextDelta, RunReport, BenchResult…)
    job_started = Signal(object)  # Job
    job_finished = Signal(object)  # Job: look at .outcome, .result, .error
    busy_changed = Signal(bool)
    engine_changed = Signal(object)  # ModelInfo, or None while no model is loaded
    kv_changed = Signal()  # the KV cache may look different now

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvprimer-llama")
        self._engine: Engine | None = None
        self._jobs: list[Job] = []  # submitted and not finished, oldest first
        self.job_finished.connect(self._deliver)
        self._closed = False

    # ---- state seen from the GUI thread
    @property
    def info(self):
        e = self._engine
        return e.info if e else None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    @property
    def current(self) -> Job | None:
        return self._jobs[0] if self._jobs else None

    # ---- jobs
    def submit(self, name: str, fn: JobFn, *, on_done=None, on_error=None, on_cancelled=None,
               cancel_running: bool = True) -> Job:
        """Run ``fn(engine, task)`` on the worker thread. Callbacks run on the GUI thread."""
        if self._closed:
            raise RuntimeError("the worker is shut down")
        if cancel_running:
            for j in self._jobs:
                j.task.cancel()
        job = Job(name, fn, on_done=on_done, on_error=on_error, on_cancelled=on_cancelled)
        job.task.on_progress = lambda p, j=job: self.progress.emit(j, p)
        job.task.on_partial = lambda r, j=job: self.partial.emit(j, r)
        self._jobs.append(job)
        if len(self._jobs) == 1:
            self.busy_changed.emit(True)
        job.future = self._pool.submit(self._call, job)
        return job

    async def run(self, name: str, fn: JobFn, **kw) -> Any:
        """Await a job from a qasync coroutine; raises KvPrimerError or Cancelled."""
        loop = asyncio.get_event_loop()
        fut = loop.create_future()

        def done(r):
            if not fut.done():
                fut.set_result(r)

        def error(msg):
            if not fut.done():
                fut.set_exception(KvPrimerError(msg))

        def cancelled(_job):
            if not fut.done():
                fut.set_exception(Cancelled())

        self.submit(name, fn, on_done=done, on_error=error, on_cancelled=cancelled, **kw)
        return await fut

    def cancel(self) -> None:
        for j in self._jobs:
            j.task.cancel()

    def load(self, config: EngineConfig, **kw) -> Job:
        """Replace the engine (closing the old one on the worker thread)."""

        def load_job(_engine, task):
            task.report("load", 0, 1)
            old, self._engine = self._engine, None
            if old is not None:
                old.close()
            self._engine = Engine(config)
            task.report("load", 1, 1)
            return self._engine.info

        return self.submit("load model", load_job, **kw)

    def shutdown(self, wait: bool = True) -> None:
        """Cancel what runs, wait for it, free the context on the worker thread."""
        if self._closed:
            return
        self._closed = True
        self.cancel()

        def close():
            if self._engine is not None:
                self._engine.close()
                self._engine = None
        self._pool.submit(close)
        self._pool.shutdown(wait=wait)

    # ---- worker thread
    def _call(self, job: Job) -> None:
        self.job_started.emit(job)
        try:
            if job.task.cancelled:
                raise Cancelled()
            job.result = job.fn(self._engine, job.task)
        except Cancelled:
            job.cancelled = True
        except KvPrimerError as e:
            job.error = str(e)
        except MemoryError:
            job.error = "out of memory; close other sequences or use a smaller context"
        except Exception as e:  # a bug: the user sees a message, the log gets the traceback
            log.error("job %r failed:\n%s", job.name, traceback.format_exc())
            job.error = f"internal error in {job.name}: {type(e).__name__}: {e} (details in the log)"
        self.job_finished.emit(job)

    # ---- GUI thread
    def _deliver(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        if job.name == "load model" and not job.error and not job.cancelled:
            self.engine_changed.emit(job.result)
        elif job.name == "load model":
            self.engine_changed.emit(self.info)
        self.kv_changed.emit()
        try:
            if job.cancelled and job.on_cancelled:
                job.on_cancelled(job)
            elif job.error and job.on_error:
                job.on_error(job.error)
            elif not job.cancelled and not job.error and job.on_done:
                job.on_done(job.result)
        finally:
            if not self._jobs:
                self.busy_changed.emit(False)

    def engine_for_tests(self) -> Engine | None:
        """The engine object, for assertions in tests only (never call it from the GUI thread)."""
        return self._engine
