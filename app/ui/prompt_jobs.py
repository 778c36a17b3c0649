"""The window's engine jobs: prime, save/load a state, run rows, benchmark, sweep.

A thin forwarder: each action makes its flow's plan from the session (app/engine/session_flows.py:
which rows, the blank-row check, the options), submits the flow's body to the worker as a job
of its kind, and puts the typed results back into the session; panels observe the session.
Messages for the user leave through the ``status`` and ``error`` signals; what is transient
(streamed text, the row being run, context use) through signals of its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from ..engine import BenchResult, KvPrimerError, PrefixState, TextDelta
from ..engine import session_flows as flows
from ..engine import state_flows
from ..engine.states.llama_state_file import save_state
from ..engine.runs.cold_reference import ColdEstimate
from ..engine.session import RunRecord, Session, bench_summary
from .engine_worker import EngineWorker, Job, JobKind
from .session_edits import SessionEdits

RowStarted = flows.RowStarted  # a run's partial result: this row starts now


@dataclass(frozen=True)
class Finished:
    """What every job of this module returns: its value and the KV cells then in use."""
    value: Any
    context_used: int


def kept_rows_text(res: BenchResult) -> str:
    """What a cancelled benchmark kept, counted in rows: ``res.rows`` holds one entry per row
    and mode (a row is added once it ran in every mode), so 1 row in 3 modes is 3 entries."""
    n = res.summary()["rows"]
    if n == 0:
        return "no row finished"
    modes = f" in {len(res.modes)} modes" if len(res.modes) > 1 else ""
    return f"the {n:,} finished row{'s' if n != 1 else ''}{modes} {'is' if n == 1 else 'are'} kept"


class PromptJobs(QObject):
    status = Signal(str)
    error = Signal(str)
    row_started = Signal(int)
    delta = Signal(object)  # TextDelta, while a run generates
    context_used = Signal(int)  # KV cells in use after a job
    state_saved = Signal(str, int)  # path, bytes
    state_loaded = Signal(str, object)  # path, PrefixState (its .warning may say how little was checked)
    state_load_failed = Signal(str)  # the reason
    cold_estimate = Signal(str)  # before a long cold run: how long it will take
    verified = Signal(object)  # RunRecord: an earlier warm-only run, now with its verdict
    run_failed = Signal(str)  # a run stopped with an error (a refused reuse mode): the reason

    def __init__(self, worker: EngineWorker, session: Session, parent: QObject | None = None,
                 edits: SessionEdits | None = None):
        super().__init__(parent)
        self.worker = worker
        self.engine_status = worker.engine_status
        self.session = session
        self.edits = edits or SessionEdits(session, self)  # a loaded state can be undone
        worker.partial.connect(self._on_partial)

    # ---- helpers
    def _fail(self, msg: str) -> None:
        if not self.engine_status.closed:
            self.error.emit(msg)

    def _submit(self, kind: JobKind, fn, on_done, *, label: str = "", on_error=None, **kw) -> Job | None:
        if self.engine_status.info is None:
            loading = self.engine_status.loading
            self._fail("the model is still loading; try again when the progress bar is gone"
                       if loading else "no model is loaded; open a GGUF model (Ctrl+M)")
            return None

        def body(engine, task):
            value = fn(engine, task)
            return Finished(value, engine.seqs.used_cells())

        def done(finished: Finished):
            if self.engine_status.closed:
                return
            self.context_used.emit(finished.context_used)
            on_done(finished.value)

        def cancelled(job: Job):
            if not self.engine_status.closed:
                self.cold_estimate.emit("")  # no cold run is coming now
                self.status.emit(f"{job.label} cancelled")

        def failed(msg: str):
            if not self.engine_status.closed:
                self.cold_estimate.emit("")
            (on_error or self._fail)(msg)

        return self.worker.submit(kind, body, label=label, on_done=done, on_error=failed,
                                  on_cancelled=cancelled, **kw)

    def _plan(self, make, *args):
        """The flow's plan, or None after telling the user why the flow cannot start."""
        try:
            return make(*args)
        except KvPrimerError as e:
            self._fail(str(e))
            return None

    def _on_partial(self, job: Job, item) -> None:
        if self.engine_status.closed:
            return
        if job.kind is JobKind.RUN:
            if isinstance(item, TextDelta):
                self.delta.emit(item)
            elif isinstance(item, RowStarted):
                self.row_started.emit(item.row)
            elif isinstance(item, RunRecord):
                self.session.add_run(item)
        if isinstance(item, ColdEstimate):  # a run's, a verification's or a benchmark row's
            text = item.text() + ("; Warm only skips it, Verify runs it later"
                                  if job.label == "run both" else "")
            if job.kind is JobKind.RUN:
                self.cold_estimate.emit(text)
            self.status.emit(text)
        elif job.kind is JobKind.BENCH and isinstance(item, BenchResult):
            self.session.set_bench(dataclasses.replace(item, rows=list(item.rows)))
        elif job.kind is JobKind.SWEEP and isinstance(item, list):
            self.session.set_sweep(item)

    def _keep_state(self, state: PrefixState | None) -> None:
        if state is not None and state is not self.session.state:
            self.session.set_state(state)

    # ---- prime / save / load
    def prime(self) -> Job | None:
        tpl = self._plan(flows.session_template, self.session)
        if tpl is None:
            return None

        def done(state):
            self.session.set_state(state)
            self.status.emit(f"primed the static prefix: {state.n_tokens:,} tokens, "
                             f"{state.nbytes / 1e6:,.1f} MB of KV; save it with Ctrl+Alt+S")

        return self._submit(JobKind.PRIME, lambda e, t: flows.prime(e, tpl, t), done)

    def save_state(self, path: str | Path, fmt: str = "kvprimer",
                   for_fa: str = "auto") -> Job | None:
        """``fmt``: "kvprimer" (.kvstate, with the model's identity) or "llama" (llama.cpp's
        sequence-state file, which llama-server and LLamaSharp read), its V laid out for a
        context with flash attention ``for_fa`` (auto|on|off: `prime --for-fa`)."""
        state = self.session.state
        if state is None:
            self._fail("nothing is primed yet; press Prime (Ctrl+P) first, then save")
            return None
        path = str(path)

        def save(engine, _task):
            fa = None  # a .kvstate keeps the engine's own layout
            out = state
            if fmt == "llama":
                out, fa = state_flows.for_llama_file(engine, state, for_fa)
            return save_state(out, path, fmt), fa

        def done(result):
            size, fa = result
            self.session.set_state(state, path)
            self.state_saved.emit(path, size)
            how = "" if fa is None else (
                f" in llama.cpp's format, for contexts with flash attention {'on' if fa else 'off'}"
                + (" (llama.cpp's default here)" if for_fa == "auto" else ""))
            self.status.emit(f"saved the state{how} to {path}")

        return self._submit(JobKind.SAVE_STATE, save, done, cancel_running=False)

    def load_state(self, path: str | Path) -> Job | None:
        """Read a state of either format, check it, and put it in the radix cache: runs of a
        template whose static prefix it holds fork it from there."""
        path = str(path)
        tpl = self.session.template

        def done(state):
            # the state it replaces (primed, or loaded before) comes back with Undo
            try:
                self.edits.state_loaded(state, path, f"load state {Path(path).name}")
            except KvPrimerError as e:  # another model loaded since: the session refuses it
                return failed(str(e))
            self.state_loaded.emit(path, state)
            note = f" ({state.warning})" if state.warning else ""
            self.status.emit(f"loaded the state {path}{note}")

        def failed(msg):
            self.state_load_failed.emit(msg)
            self._fail(msg)

        return self._submit(JobKind.LOAD_STATE, lambda e, t: state_flows.load_state(e, path, tpl),
                            done, on_error=failed)

    # ---- runs
    def run(self, mode: str = "both", oneshot: bool | None = None) -> Job | None:
        """``mode``: both paths, cold or warm; ``oneshot``: the plain-batches cold run (the
        noise floor; both paths only): None as the session's options say (only when warm and
        cold differ, unless always asked), True always, False never."""
        plan = self._plan(flows.selected_run_plan, self.session, mode, oneshot)
        if plan is None:
            return None

        def done(outcome: flows.RunOutcome):
            self._keep_state(outcome.state)
            if self.session.runs:
                self.status.emit(self.session.runs[-1].summary())

        def failed(msg: str):
            self.run_failed.emit(msg)
            self._fail(msg)

        return self._submit(JobKind.RUN, lambda e, t: flows.run_rows(e, plan, t), done,
                            label=f"run {mode}", on_error=failed)

    def verify(self, record: RunRecord | None = None) -> Job | None:
        """Verify a warm-only run later (the latest one not yet verified by default): its cold
        run, between jobs; the session's record is replaced by the verified one."""
        plan = self._plan(flows.verify_plan, self.session, record)
        if plan is None:
            return None

        def done(new: RunRecord):
            new = replace(new, origin=plan.record.origin)  # the same run, of the same template
            runs = self.session.runs
            at = next((i for i, r in enumerate(runs) if r is plan.record), None)
            if at is not None:  # not cleared meanwhile
                runs[at] = new
                self.session.mark_dirty()
            self.verified.emit(new)
            self.status.emit(f"verified row {new.row}: {new.report.verdict_text()}")

        # after the job running now, not instead of it; a job started later stops it
        return self._submit(JobKind.RUN, lambda e, t: flows.verify(e, plan, t), done,
                            label="verify", cancel_running=False)

    def bench(self, repeat: int | None = None) -> Job | None:
        plan = self._plan(flows.session_bench_plan, self.session, repeat or None)
        if plan is None:
            return None

        def done(outcome: flows.BenchOutcome):
            self._keep_state(outcome.state)
            res = outcome.result
            self.session.set_bench(res)
            if res.cancelled:  # the rows finished are kept, and saved with the project
                self.status.emit(f"benchmark cancelled; {kept_rows_text(res)}: "
                                 + bench_summary(res))
            else:
                self.status.emit("benchmark done: " + bench_summary(res))

        return self._submit(JobKind.BENCH, lambda e, t: flows.bench(e, plan, t), done)

    def sweep(self) -> Job | None:
        got = self._plan(flows.sweep_values, self.session)
        if got is None:
            return None
        tpl, values = got

        def done(points):
            self.session.set_sweep(points)
            self.status.emit(f"sweep done: {len(points)} prefix lengths")

        return self._submit(JobKind.SWEEP, lambda e, t: flows.sweep(e, tpl, values, t), done)
