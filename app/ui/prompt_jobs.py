"""The window's engine jobs: prime, save/load a state, run rows, benchmark, sweep.

Each action reads what it needs from the session (template, rows, options, the state to save),
submits a job of its kind to the worker and puts the job's typed results back into the session;
panels observe the session. Job bodies are plain engine calls. Messages for the user leave
through the ``status`` and ``error`` signals; what is transient (streamed text, the row being
run, context use) through signals of its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from ..engine import (BenchResult, GenerationConfig, MissingValuesError, PrefixState, TextDelta,
                      bench_rows, run_prompt)
from ..engine.prompt_tokens import common_prefix
from ..engine.llama_state_file import load_any_state, save_state
from ..engine.prefix_sweep import prefix_sweep
from ..engine.session import RunRecord, Session, bench_summary
from .engine_worker import EngineWorker, Job, JobKind


@dataclass(frozen=True)
class RowStarted:
    """Partial result of a run job: this row's paths start now."""
    row: int


@dataclass(frozen=True)
class Finished:
    """What every job of this module returns: its value and the KV cells then in use."""
    value: Any
    context_used: int


def state_to_save(engine, template, state: PrefixState | None, task) -> PrefixState:
    """The state Save writes after a run (worker thread): the session's own when it is a prefix
    of the template's static prefix, else a snapshot of the cached static prefix. Runs never
    need it: they fork the radix cache's node."""
    if state is not None:
        prefix = engine.tokenize(template.prefix_prompt())
        if common_prefix(state.tokens, prefix) == state.n_tokens:
            return state
    return engine.prime(template, task=task)


class PromptJobs(QObject):
    status = Signal(str)
    error = Signal(str)
    row_started = Signal(int)
    delta = Signal(object)  # TextDelta, while a run generates
    context_used = Signal(int)  # KV cells in use after a job
    state_saved = Signal(str, int)  # path, bytes
    state_loaded = Signal(str, object)  # path, PrefixState (its .warning may say how little was checked)
    state_load_failed = Signal(str)  # the reason

    def __init__(self, worker: EngineWorker, session: Session, parent: QObject | None = None):
        super().__init__(parent)
        self.worker = worker
        self.session = session
        worker.partial.connect(self._on_partial)

    # ---- helpers
    def _fail(self, msg: str) -> None:
        if not self.worker.closed:
            self.error.emit(msg)

    def _submit(self, kind: JobKind, fn, on_done, *, label: str = "", on_error=None, **kw) -> Job | None:
        if self.worker.info is None:
            loading = self.worker.loading
            self._fail("the model is still loading; try again when the progress bar is gone"
                       if loading else "no model is loaded; open a GGUF model (Ctrl+M)")
            return None

        def body(engine, task):
            value = fn(engine, task)
            return Finished(value, engine.used_cells())

        def done(finished: Finished):
            if self.worker.closed:
                return
            self.context_used.emit(finished.context_used)
            on_done(finished.value)

        def cancelled(job: Job):
            if not self.worker.closed:
                self.status.emit(f"{job.label} cancelled")

        return self.worker.submit(kind, body, label=label, on_done=done,
                                  on_error=on_error or self._fail, on_cancelled=cancelled, **kw)

    def _template(self):
        s = self.session
        if s.template is None:
            self._fail(str(s.template_error) if s.template_error else
                       "the template is empty; write or open one first")
        return s.template

    def _on_partial(self, job: Job, item) -> None:
        if self.worker.closed:
            return
        if job.kind is JobKind.RUN:
            if isinstance(item, TextDelta):
                self.delta.emit(item)
            elif isinstance(item, RowStarted):
                self.row_started.emit(item.row)
            elif isinstance(item, RunRecord):
                self.session.add_run(item)
        elif job.kind is JobKind.BENCH and isinstance(item, BenchResult):
            self.session.set_bench(dataclasses.replace(item, rows=list(item.rows)))
        elif job.kind is JobKind.SWEEP and isinstance(item, list):
            self.session.set_sweep(item)

    def _keep_state(self, state: PrefixState | None) -> None:
        if state is not None and state is not self.session.state:
            self.session.set_state(state)

    # ---- prime / save / load
    def prime(self) -> Job | None:
        tpl = self._template()
        if tpl is None:
            return None

        def done(state):
            self.session.set_state(state)
            self.status.emit(f"primed the static prefix: {state.n_tokens:,} tokens, "
                             f"{state.nbytes / 1e6:,.1f} MB of KV; save it with Ctrl+Alt+S")

        return self._submit(JobKind.PRIME, lambda e, t: e.prime(tpl, task=t), done)

    def save_state(self, path: str | Path, fmt: str = "kvprimer") -> Job | None:
        """``fmt``: "kvprimer" (.kvstate, with the model's identity) or "llama" (llama.cpp's
        sequence-state file, which llama-server and LLamaSharp read)."""
        state = self.session.state
        if state is None:
            self._fail("nothing is primed yet; press Prime (Ctrl+P) first, then save")
            return None
        path = str(path)

        def done(size):
            self.session.set_state(state, path)
            self.state_saved.emit(path, size)
            how = " in llama.cpp's format" if fmt == "llama" else ""
            self.status.emit(f"saved the state{how} to {path}")

        return self._submit(JobKind.SAVE_STATE, lambda e, t: save_state(state, path, fmt), done,
                            cancel_running=False)

    def load_state(self, path: str | Path) -> Job | None:
        """Read a state of either format, check it, and put it in the radix cache: runs of a
        template whose static prefix it holds fork it from there."""
        path = str(path)
        tpl = self.session.template

        def job(engine, task):
            state = load_any_state(engine, path, tpl)
            engine.cache.adopt(state, "saved state")
            return state

        def done(state):
            self.session.set_state(state, path)
            self.state_loaded.emit(path, state)
            note = f" ({state.warning})" if state.warning else ""
            self.status.emit(f"loaded the state {path}{note}")

        def failed(msg):
            self.state_load_failed.emit(msg)
            self._fail(msg)

        return self._submit(JobKind.LOAD_STATE, job, done, on_error=failed)

    # ---- runs
    def run(self, mode: str = "both", oneshot: bool = True) -> Job | None:
        """``oneshot`` adds the plain-batches cold run (both paths only), shown apart."""
        tpl = self._template()
        if tpl is None:
            return None
        rows = self.session.selected_rows() or self.session.all_rows()[:1]
        if not rows:
            self._fail("there is no row to run; fill the form or import rows first")
            return None
        for row in rows:
            blank = tpl.blank(row.values)
            if blank:
                self._fail(f"row {row.number}: {MissingValuesError(blank, [])}")
                return None
        opts = self.session.options
        gen = GenerationConfig(max_tokens=opts.max_tokens)
        state = self.session.state

        def job(engine, task):
            for row in rows:
                task.partial(RowStarted(row.number))
                rep = run_prompt(engine, tpl, row.values, reuse=opts.reuse_mode,
                                 recompute=opts.recompute, cold=mode != "warm",
                                 warm=mode != "cold", oneshot=oneshot and mode == "both", gen=gen,
                                 task=task)
                task.partial(RunRecord(row.number, rep))
            return state_to_save(engine, tpl, state, task) if mode != "cold" else None

        def done(st):
            self._keep_state(st)
            if self.session.runs:
                self.status.emit(self.session.runs[-1].summary())

        return self._submit(JobKind.RUN, job, done, label=f"run {mode}")

    def bench(self, repeat: int | None = None) -> Job | None:
        tpl = self._template()
        if tpl is None:
            return None
        rows = self.session.all_rows()
        if not rows:
            self._fail("there are no rows to benchmark; import or add rows first")
            return None
        opts = self.session.options
        repeat = repeat or opts.repeat
        state = self.session.state

        def job(engine, task):
            res = bench_rows(engine, tpl, rows, repeat=repeat, modes=opts.bench_modes,
                             recompute=opts.recompute, task=task)
            return state_to_save(engine, tpl, state, task), res

        def done(result):
            st, res = result
            self._keep_state(st)
            self.session.set_bench(res)
            self.status.emit("benchmark done: " + bench_summary(res))

        return self._submit(JobKind.BENCH, job, done)

    def sweep(self) -> Job | None:
        tpl = self._template()
        if tpl is None:
            return None
        rows = self.session.selected_rows() or self.session.all_rows()[:1]
        if not rows:
            self._fail("the sweep needs one row of values; fill the form first")
            return None
        values = rows[0].values

        def done(points):
            self.session.set_sweep(points)
            self.status.emit(f"sweep done: {len(points)} prefix lengths")

        return self._submit(JobKind.SWEEP, lambda e, t: prefix_sweep(e, tpl, values, task=t), done)

