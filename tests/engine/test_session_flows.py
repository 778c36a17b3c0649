"""The session's flows (app/engine/session_flows.py) on the tiny model: the same functions the
window's jobs and the CLI's commands run. Plans refuse before any engine work; bodies report
through the TaskState."""
from __future__ import annotations

import pytest

from app.engine import (BenchResult, Cancelled, KvPrimerError, MissingValuesError, Row,
                        TaskState)
from app.engine import session_flows as flows
from app.engine.session import Options, RunRecord, Session

TPL = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
       + "hello world of the answer and question. " * 6
       + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")


def session(rows, **options) -> Session:
    s = Session(Options(max_tokens=3, **options))
    s.set_template(TPL)
    s.set_rows(rows)
    return s


class Recorder(TaskState):
    """Keeps every partial result; cancels once ``cancel_after`` RunRecords have gone out."""

    def __init__(self, cancel_after: int | None = None):
        super().__init__(on_partial=self._keep)
        self.items: list = []
        self.cancel_after = cancel_after

    def _keep(self, item) -> None:
        self.items.append(item)
        records = [i for i in self.items if isinstance(i, RunRecord)]
        if self.cancel_after is not None and len(records) >= self.cancel_after:
            self.cancel()


def test_run_selected_rows_reports_each_row_and_snapshots_the_prefix(engine):
    s = session([{"c": "the world", "q": "why?"}, {"c": "a question", "q": "how?"},
                 {"c": "hello", "q": "what?"}])
    s.set_selection([0, 2])
    plan = flows.selected_run_plan(s, "both", oneshot=False)
    task = Recorder()
    out = flows.run_rows(engine, plan, task)
    assert [r.row for r in out.records] == [1, 3]
    started = [i.row for i in task.items if isinstance(i, flows.RowStarted)]
    records = [i for i in task.items if isinstance(i, RunRecord)]
    assert started == [1, 3] and records == list(out.records)
    assert all(r.report.verdict.exact and r.report.oneshot is None for r in out.records)
    assert all(len(r.report.warm.tokens) <= 3 for r in out.records)  # the options' max_tokens
    # the state Save writes: the static prefix, as Prime gives it
    primed = flows.prime(engine, plan.template)
    assert out.state.tokens == primed.tokens and out.state.n_tokens > 0
    # a state the session already holds, still a prefix of the template's, is kept as it is
    assert flows.state_to_save(engine, plan.template, out.state) is out.state


def test_cold_only_runs_take_no_snapshot_and_the_cli_asks_for_none(engine):
    s = session([{"c": "the world", "q": "why?"}])
    assert flows.run_rows(engine, flows.selected_run_plan(s, "cold")).state is None
    plan = flows.run_plan(s.template, s.all_rows(), s.options, paths="warm", snapshot=False)
    out = flows.run_rows(engine, plan)
    assert out.state is None and out.records[0].report.cold is None


def test_plans_refuse_before_any_engine_work():
    s = session([{"c": "the world", "q": "why?"}, {"c": "  ", "q": "how?"}])
    s.set_selection([0, 1])
    with pytest.raises(MissingValuesError, match=r"^row 2: missing values for <c>"):
        flows.selected_run_plan(s)
    with pytest.raises(KvPrimerError, match="no row to run"):
        flows.selected_run_plan(session([]))
    with pytest.raises(KvPrimerError, match="unknown names zz"):
        flows.run_plan(s.template, [Row(1, {"c": "a", "q": "b", "zz": "c"})], s.options)
    with pytest.raises(KvPrimerError, match="a run uses one reuse mode"):
        flows.run_plan(s.template, s.all_rows()[:1], Options(reuse_mode="prefix,chain"))
    with pytest.raises(KvPrimerError, match="number of new tokens cannot be 0"):
        flows.run_plan(s.template, s.all_rows()[:1], Options(max_tokens=0))
    with pytest.raises(KvPrimerError, match="repeat count must be at least 1"):
        flows.bench_plan(s.template, s.all_rows(), Options(repeat=0))
    bad = Session()
    bad.set_template("hello <name\nworld")
    with pytest.raises(KvPrimerError, match="line 1, column 7"):
        flows.selected_run_plan(bad)
    with pytest.raises(KvPrimerError, match="the template is empty"):
        flows.selected_run_plan(Session())


def test_a_saved_state_is_benchmarked_in_prefix_mode_only(engine):
    s = session([{"c": "the world", "q": "why?"}])
    state = flows.prime(engine, s.template)
    with pytest.raises(KvPrimerError, match="prefix reuse mode only, not prefix, chain"):
        flows.bench_plan(s.template, s.all_rows(), Options(bench_modes=("prefix", "chain")),
                         restore=state)
    plan = flows.bench_plan(s.template, s.all_rows(), Options(bench_modes=("prefix",), repeat=1),
                            restore=state)
    assert [r.reuse for r in flows.bench(engine, plan).result.rows] == ["prefix"]


def test_bench_rows_a_blank_row_fails_alone_and_results_arrive_per_row(engine):
    s = session([{"c": "the world", "q": "why?"}, {"c": "", "q": "how?"},
                 {"c": "hello", "q": "what?"}], repeat=1, bench_modes=("prefix", "chain"))
    task = Recorder()
    out = flows.bench(engine, flows.session_bench_plan(s), task)
    rows = out.result.rows
    assert [(r.row, r.reuse) for r in rows] == [(n, m) for m in ("prefix", "chain") for n in (1, 2, 3)]
    failed = [r for r in rows if r.error]
    assert [r.row for r in failed] == [2, 2] and "missing values for <c>" in failed[0].error
    assert all(r.verdict().exact for r in rows if not r.error)
    assert out.result.summary()["failed_rows"] == 2
    partials = [i for i in task.items if isinstance(i, BenchResult)]
    assert len(partials) == 3  # one after each row, its modes run side by side
    assert out.state is not None and out.state.tokens == flows.prime(engine, s.template).tokens


def test_a_cancelled_run_stops_between_rows_keeping_what_finished(engine):
    s = session([{"c": "the world", "q": "why?"}, {"c": "hello", "q": "how?"}])
    s.set_selection([0, 1])
    task = Recorder(cancel_after=1)
    with pytest.raises(Cancelled):
        flows.run_rows(engine, flows.selected_run_plan(s, "warm"), task)
    assert [i.row for i in task.items if isinstance(i, RunRecord)] == [1]
    assert [i.row for i in task.items if isinstance(i, flows.RowStarted)] == [1]


def test_sweep_values_come_from_the_selected_row():
    s = session([{"c": "a", "q": "b"}, {"c": "c", "q": "d"}])
    s.set_selection([1])
    assert flows.sweep_values(s)[1] == {"c": "c", "q": "d"}
    with pytest.raises(KvPrimerError, match="the sweep needs one row"):
        flows.sweep_values(session([]))
