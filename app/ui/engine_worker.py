"""One worker thread owns the engine (and so the llama context); the GUI thread never calls it.

A job is a plain function ``fn(engine, task)`` (Orange3's task-state pattern) of a known
``JobKind``: it reports progress and typed partial results through ``task`` and checks ``task``
for cancellation between batches. Progress, partial results and the single done/error/cancelled
outcome arrive on the GUI thread as Qt signals (emitted from the worker thread, delivered
queued); ``_deliver`` is the one place outcomes are dispatched. Starting a job cancels the
running one unless asked not to; the new one starts when it has stopped, since the pool has one
thread. Background kinds (token counts, the KV dock's and Cache panel's views) never make the worker "working",
so the window's actions stay enabled while they run.

Idle work: a model loads without waiting for its attention kernels to be measured (the engine
opens on a safe default, engine_kernels.py). Whenever the worker has nothing else to do and the
engine wants a measurement, it submits one as a MEASURE_KERNELS job; every other job submitted
stops it between two of its steps, and it resumes, where it stopped, once the worker is idle
again. Its progress and news go to ``engine_status.kernel_measurement``; it never counts as
busy. When it picks the other kernel, the engine switches between jobs (the job itself).

What front ends show about the engine (the loaded model, what runs, the cache's revision) is
the worker's ``engine_status`` (app/engine/engine_status.py): written here, on the GUI thread
only (after each submit and in ``_deliver``), so its subscribers always run on the GUI thread.
Panels observe it; they act through ``submit``.
"""
from __future__ import annotations

import itertools
import logging
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from ..engine import Cancelled, Engine, EngineConfig, EngineStatus, KvPrimerError, TaskState
from ..versions import version_text

log = logging.getLogger("kvprimer.ui")
_ids = itertools.count(1)

JobFn = Callable[[Engine | None, TaskState], Any]


class JobKind(Enum):
    LOAD_MODEL = "load model"
    PRIME = "prime"
    SAVE_STATE = "save state"
    LOAD_STATE = "load state"
    RUN = "run"
    BENCH = "benchmark"
    SWEEP = "sweep"
    COUNT_TOKENS = "count tokens"
    KV_VIEW = "KV view"
    KV_OP = "KV operation"
    CACHE_VIEW = "cache view"
    CACHE_OP = "cache operation"
    SERVER = "server"  # deploy to a server, run rows on it (primes and runs locally too)
    SERVER_CHECK = "server check"  # a server's health, model and slots
    TASK = "task"  # any other work (tools, tests)
    MEASURE_KERNELS = "measure kernels"  # idle work: yields to every other job

    @property
    def background(self) -> bool:
        """Bookkeeping: no progress bar, and the user's actions stay enabled while it runs."""
        return self in (JobKind.COUNT_TOKENS, JobKind.KV_VIEW, JobKind.KV_OP, JobKind.CACHE_VIEW,
                        JobKind.CACHE_OP, JobKind.SERVER_CHECK, JobKind.MEASURE_KERNELS)

    @property
    def changes_cache(self) -> bool:
        """Can it change the KV cells or the radix cache (so views of them need refreshing)?"""
        return self not in (JobKind.COUNT_TOKENS, JobKind.KV_VIEW, JobKind.CACHE_VIEW,
                            JobKind.SERVER_CHECK, JobKind.MEASURE_KERNELS)


@dataclass
class Job:
    kind: JobKind
    fn: JobFn = field(repr=False)
    label: str = ""  # what the user reads ("run both", "prime"); the kind's name by default
    id: int = field(default_factory=lambda: next(_ids))
    task: TaskState = field(default_factory=TaskState, repr=False)
    future: Future | None = field(default=None, repr=False)
    result: Any = None
    error: str | None = None  # a message for the user
    cancelled: bool = False
    on_done: Callable[[Any], None] | None = field(default=None, repr=False)
    on_error: Callable[[str], None] | None = field(default=None, repr=False)
    on_cancelled: Callable[["Job"], None] | None = field(default=None, repr=False)
    # read on the worker thread after the job, for the GUI thread to publish
    kernel_status: Any = field(default=None, repr=False)
    info: Any = field(default=None, repr=False)  # the engine's ModelInfo (kernels may change)

    def __post_init__(self) -> None:
        self.label = self.label or self.kind.value

    @property
    def outcome(self) -> str:
        return "cancelled" if self.cancelled else "error" if self.error else "done"


class EngineWorker(QObject):
    progress = Signal(object, object)  # Job, Progress
    partial = Signal(object, object)  # Job, partial result (TextDelta, RunReport, BenchResult…)
    job_started = Signal(object)  # Job
    job_finished = Signal(object)  # Job: look at .outcome, .result, .error

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvprimer-llama")
        self._engine: Engine | None = None
        self._jobs: list[Job] = []  # submitted and not finished, oldest first
        self._load_configs: dict[int, EngineConfig] = {}  # a load job's id: what it opens
        self.engine_status = EngineStatus()  # what front ends observe; written on this thread
        self.job_finished.connect(self._deliver)
        self.partial.connect(self._measure_partial)

    def _publish(self, **changes) -> None:
        """Put what the job list means into the status, with ``changes`` (one update, so a
        subscriber reads the model loaded, the revision and the activity together)."""
        user = [j for j in self._jobs if not j.kind.background]
        busy = [j for j in self._jobs if j.kind is not JobKind.MEASURE_KERNELS]
        self.engine_status.update(
            **changes, busy=bool(busy), working=bool(user),
            loading=any(j.kind is JobKind.LOAD_MODEL for j in self._jobs),
            job=user[0].label if user else "")

    # ---- jobs
    def submit(self, kind: JobKind, fn: JobFn, *, label: str = "", on_done=None, on_error=None,
               on_cancelled=None, cancel_running: bool = True) -> Job:
        """Run ``fn(engine, task)`` on the worker thread. Callbacks run on the GUI thread."""
        if self.engine_status.closed:
            raise RuntimeError("the worker is shut down")
        for j in self._jobs:
            # the user's new job replaces their old one, not background work; idle work yields
            if j.kind is JobKind.MEASURE_KERNELS or (cancel_running and not j.kind.background):
                j.task.cancel()
        job = Job(kind, fn, label, on_done=on_done, on_error=on_error, on_cancelled=on_cancelled)
        job.task.on_progress = lambda p, j=job: self.progress.emit(j, p)
        job.task.on_partial = lambda r, j=job: self.partial.emit(j, r)
        self._jobs.append(job)
        job.future = self._pool.submit(self._call, job)
        self._publish()  # after the pool has it: a subscriber may submit a job of its own
        return job

    def cancel(self) -> None:
        """Cancel the user's jobs (background refreshes finish on their own)."""
        for j in self._jobs:
            if not j.kind.background:
                j.task.cancel()

    def load(self, config: EngineConfig, **kw) -> Job:
        """Replace the engine on the worker thread. The new one is opened first and the old one
        closed only once it works, so a model or context that cannot be opened leaves the loaded
        one in place (both are in memory for that moment)."""

        def load_job(_engine, task):
            task.report("load", 0, 1)
            new = Engine(config, measure_kernels_later=True, task=task)
            old, self._engine = self._engine, new
            if old is not None:
                old.close()
            version_text()  # read llama.cpp's build here, so the About box need not call it
            task.report("load", 1, 1)
            return self._engine.info

        job = self.submit(JobKind.LOAD_MODEL, load_job, **kw)
        # what the status will say the model runs with; measuring again is a request, not a setting
        self._load_configs[job.id] = replace(config, remeasure_kernels=False)
        return job

    def shutdown(self, wait: bool = True) -> None:
        """Cancel what runs, wait for it, free the context on the worker thread."""
        if self.engine_status.closed:
            return
        self.engine_status.closed = True  # first: a subscriber's submit now raises
        self.cancel()
        for j in self._jobs:  # idle work too
            j.task.cancel()

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
            log.error("job %r failed:\n%s", job.label, traceback.format_exc())
            job.error = f"internal error in {job.label}: {type(e).__name__}: {e} (details in the log)"
        if self._engine is not None:  # cheap reads, here where the engine lives
            job.kernel_status = self._engine.kernel_state.status()
            job.info = self._engine.info
        self.job_finished.emit(job)

    # ---- GUI thread
    def _deliver(self, job: Job) -> None:
        """The one place outcomes arrive: the status first (so callbacks read it as it now is),
        then the job's own callback."""
        if job in self._jobs:
            self._jobs.remove(job)
        config = self._load_configs.pop(job.id, None)
        changes = {}
        if job.kind is JobKind.LOAD_MODEL and job.outcome == "done":  # a failed one changed nothing
            changes.update(info=job.result, config=config)
        if job.kernel_status is not None:
            changes["kernel_measurement"] = job.kernel_status
        old, switched = self.engine_status.info, False
        if job.kind is not JobKind.LOAD_MODEL and job.info is not None and old is not None \
                and job.info != old:  # a new kernel choice (measured, or distrusted after runs)
            changes["info"] = job.info
            # another kernel: the engine opened its contexts again, with an empty cache
            switched = job.info.kernels.flash_attn != old.kernels.flash_attn
        if job.kind.changes_cache or switched:
            changes["cache_revision"] = self.engine_status.cache_revision + 1
        self._publish(**changes)
        try:
            if job.cancelled and job.on_cancelled:
                job.on_cancelled(job)
            elif job.error and job.on_error:
                job.on_error(job.error)
            elif not job.cancelled and not job.error and job.on_done:
                job.on_done(job.result)
        finally:  # after the callbacks: a job they submit goes first
            self._measure_when_idle()

    # ---- idle work: the attention-kernel measurement
    def _measure_when_idle(self) -> None:
        m = self.engine_status.kernel_measurement
        if self.engine_status.closed or self._jobs or m is None or not m.active:
            return

        def measure(engine, task):
            if engine is None:
                return None
            try:
                return engine.measure_kernels(task, on_status=task.partial)
            except Exception as e:  # never retried in a loop: the engine stops wanting it
                log.error("measuring the attention kernels failed:\n%s", traceback.format_exc())
                engine.kernel_state.give_up(str(e) if isinstance(e, KvPrimerError)
                                            else f"{type(e).__name__}: {e}")
                return engine.kernel_state.status()

        self.submit(JobKind.MEASURE_KERNELS, measure, cancel_running=False)

    def _measure_partial(self, job: Job, status) -> None:
        if job.kind is JobKind.MEASURE_KERNELS and not self.engine_status.closed:
            self.engine_status.update(kernel_measurement=status)

    def engine_for_tests(self) -> Engine | None:
        """The engine object, for assertions in tests only (never call it from the GUI thread)."""
        return self._engine
