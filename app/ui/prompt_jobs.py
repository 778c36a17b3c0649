"""The window's engine jobs: prime, save/load a state, run rows, benchmark, sweep.

Each action checks what the GUI knows (a template parsed, rows filled, a state primed), then
submits a job to the worker; the job body is plain engine calls. Outcomes come back as
callbacks on the GUI thread, where the panels show them and errors go to the Log as they are.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from ..engine import (GenerationConfig, MissingValuesError, PrefixState, RunReport,
                      TextDelta, bench_rows, run_prompt)
from ..engine.kv_engine import common_prefix
from ..engine.prefix_sweep import prefix_sweep

if TYPE_CHECKING:
    from .main_window import MainWindow


def seq0_used(engine) -> int:
    return len(engine.resident.get(0, [])) if engine else 0


def usable_state(engine, template, state: PrefixState | None) -> PrefixState | None:
    """The state if it is a prefix of the template's static prefix (worker thread)."""
    if state is None:
        return None
    prefix = engine.tokenize(template.prefix_prompt())
    return state if common_prefix(state.tokens, prefix) == state.n_tokens else None


class PromptJobs(QObject):
    state_changed = Signal(object)  # PrefixState or None
    context_used = Signal(int)  # tokens held by sequence 0 after a job

    def __init__(self, window: "MainWindow"):
        super().__init__(window)
        self.w = window
        self.worker = window.worker
        self.state: PrefixState | None = None
        self.state_path = ""

    # ---- helpers
    def _fail(self, msg: str) -> None:
        if not self.w.closing:
            self.w.show_error(msg)

    def _submit(self, name, fn, on_done, on_error=None, **kw):
        if self.worker.info is None:
            loading = self.worker.current is not None and self.worker.current.name == "load model"
            self._fail("the model is still loading; try again when the progress bar is gone"
                       if loading else "no model is loaded; open a GGUF model (Ctrl+M)")
            return None

        def body(engine, task):
            result = fn(engine, task)
            return result, seq0_used(engine)

        def done(pair):
            if self.w.closing:
                return
            result, used = pair
            self.context_used.emit(used)
            on_done(result)

        return self.worker.submit(name, body, on_done=done, on_error=on_error or self._fail,
                                  on_cancelled=lambda j: self._cancelled(j), **kw)

    def _cancelled(self, job) -> None:
        if not self.w.closing:
            self.w.show_status(f"{job.name} cancelled")

    def _template(self):
        tpl = self.w.editor.template
        if tpl is None:
            err = self.w.editor.error
            self._fail(str(err) if err else "the template is empty; write or open one first")
        return tpl

    def set_state(self, state: PrefixState | None, path: str = "") -> None:
        self.state, self.state_path = state, path
        self.state_changed.emit(state)

    # ---- prime / save / load
    def prime(self):
        tpl = self._template()
        if tpl is None:
            return None

        def done(state):
            self.set_state(state)
            self.w.show_status(f"primed the static prefix: {state.n_tokens:,} tokens, "
                               f"{state.nbytes / 1e6:,.1f} MB of KV; save it with Ctrl+S")

        return self._submit("prime", lambda e, t: e.prime(tpl, task=t), done)

    def save_state(self, path: str | Path):
        state = self.state
        if state is None:
            self._fail("nothing is primed yet; press Prime (Ctrl+P) first, then save")
            return None
        path = str(path)

        def done(size):
            self.state_path = path
            self.w.library.refresh()
            self.w.library.select(Path(path))
            self.w.library.show_message(f"saved {Path(path).name} ({size / 1e6:,.1f} MB)")
            self.w.show_status(f"saved the state to {path}")

        return self._submit("save state", lambda e, t: state.save(path), done,
                            cancel_running=False)

    def load_state(self, path: str | Path):
        path = str(path)

        def job(engine, task):
            state = engine.load_state(path)
            engine.restore(state, 0)
            engine.store.put(state)
            return state

        def done(state):
            self.set_state(state, path)
            self.w.library.show_message(f"loaded {Path(path).name}: {state.n_tokens:,} tokens "
                                        "restored into sequence 0")
            self.w.show_status(f"loaded the state {path}")

        def failed(msg):
            self.w.library.show_message(msg, error=True)
            self._fail(msg)

        return self._submit("load state", job, done, on_error=failed)

    # ---- runs
    def run(self, mode: str = "both", oneshot: bool = True):
        """``oneshot`` adds the plain-batches cold run (both paths only), shown apart."""
        tpl = self._template()
        if tpl is None:
            return None
        rows = self.w.fillings.selected_rows() or self.w.fillings.all_rows()[:1]
        if not rows:
            self._fail("there is no row to run; fill the form or import rows first")
            return None
        for row in rows:
            missing = [n for n in tpl.placeholders if not str(row.values.get(n, "")).strip()]
            if missing:
                self._fail(f"row {row.number}: " + str(MissingValuesError(missing, [])).split(";")[0]
                           + "; fill them in the form")
                return None
        gen = GenerationConfig(max_tokens=self.w.run_panel.max_tokens.value())
        state = self.state

        def job(engine, task):
            st = None
            if mode != "cold":
                st = usable_state(engine, tpl, state) or engine.prime(tpl, task=task)
            reports = []
            for row in rows:
                task.partial(("row", row.number))
                rep = run_prompt(engine, tpl, row.values, state=st, cold=mode != "warm",
                                 warm=mode != "cold", oneshot=oneshot and mode == "both", gen=gen, task=task)
                task.partial(("report", row.number, rep))
                reports.append((row.number, rep))
            return st, reports

        def done(result):
            st, reports = result
            if st is not None and st is not self.state:
                self.set_state(st)
            if reports:
                last = reports[-1][1]
                self.w.show_status(run_summary(last))
            self.w.results_changed()

        self.w.run_panel.begin_row(rows[0].number)
        return self._submit(f"run {mode}", job, done)

    def on_partial(self, job, item) -> None:
        if self.w.closing:
            return
        if isinstance(item, TextDelta):
            self.w.run_panel.on_delta(item)
        elif isinstance(item, tuple) and item and item[0] == "row":
            self.w.run_panel.begin_row(item[1])
        elif isinstance(item, tuple) and item and item[0] == "report":
            self.w.run_panel.add_report(item[1], item[2])
        elif job.name == "benchmark" and hasattr(item, "rows"):
            self.w.bench.show_result(dataclasses.replace(item, rows=list(item.rows)))
        elif job.name == "sweep" and isinstance(item, list):
            self.w.bench.show_sweep(item)

    def bench(self, repeat: int = 3):
        tpl = self._template()
        rows = self.w.fillings.all_rows()
        if tpl is None:
            return None
        if not rows:
            self._fail("there are no rows to benchmark; import or add rows first")
            return None
        state = self.state

        def job(engine, task):
            st = usable_state(engine, tpl, state) or engine.prime(tpl, task=task)
            return st, bench_rows(engine, tpl, rows, repeat=repeat, state=st, task=task)

        def done(result):
            st, res = result
            if st is not self.state:
                self.set_state(st)
            self.w.bench.show_result(res)
            self.w.results_changed()
            self.w.show_status("benchmark done: " + self.w.bench.summary.text())

        self.w.central_tabs.setCurrentWidget(self.w.bench)
        return self._submit("benchmark", job, done)

    def sweep(self):
        tpl = self._template()
        rows = self.w.fillings.selected_rows() or self.w.fillings.all_rows()[:1]
        if tpl is None:
            return None
        if not rows:
            self._fail("the sweep needs one row of values; fill the form first")
            return None
        values = rows[0].values

        def done(points):
            self.w.bench.show_sweep(points)
            self.w.results_changed()
            self.w.show_status(f"sweep done: {len(points)} prefix lengths")

        self.w.central_tabs.setCurrentWidget(self.w.bench)
        return self._submit("sweep", lambda e, t: prefix_sweep(e, tpl, values, task=t), done)


def run_summary(r: RunReport) -> str:
    parts = []
    if r.cold:
        parts.append(f"cold {r.cold.ttft_ms:,.0f} ms")
    if r.warm:
        parts.append(f"warm {r.warm.ttft_ms:,.0f} ms ({r.reused_tokens:,} tokens reused)")
    if r.speedup:
        parts.append(f"×{r.speedup:.1f} faster to first token")
    if r.equivalence:
        parts.append("same output" if r.equivalence.tokens_equal else
                     f"outputs differ at token {r.equivalence.first_diff}")
    return "run: " + ", ".join(parts)
