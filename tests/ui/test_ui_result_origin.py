"""Results belong to what made them: each run and benchmark records its template, model and
settings; when those change the shown results are kept and marked as from the earlier ones;
the project file keeps the origins (and opens files saved without them). A run that stops
with an error says so instead of leaving the last verdict above emptied output boxes."""
from __future__ import annotations

from dataclasses import replace

from app.engine import KvPrimerError
from app.engine import session_flows
from app.engine.runs.result_origin import ResultOrigin, earlier_text
from app.engine.session import Session
from app.ui.result_marks import EARLIER
from app.ui.run_panel import COLUMNS
from tests.engine.test_session import report  # noqa: F401 (a fixture: a real run of the tiny model)
from tests.ui.test_ui_window import TPL
from tests.ui_actions import BENCH, RUN_BOTH, idle, trigger

ROWS = [{"question": f"question {i}", "topic": f"topic {i}"} for i in range(3)]


def line_colours(table, column: str) -> list[str]:
    c = COLUMNS.index(column)
    return [table.item(r, c).foreground().color().name() for r in range(table.rowCount())]


def test_runs_of_an_earlier_template_are_kept_and_marked(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_selection([0])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    panel, table = w.run_panel, w.run_panel.table
    model = w.engine_status.info.name
    assert [table.item(r, COLUMNS.index("model")).text() for r in range(2)] == [model, model]
    assert panel.earlier.isHidden()
    verdict_colour = line_colours(table, "verdict")[1]
    # an edit of the template: the run is kept, greyed, and the note says why
    w.editor.set_text(TPL.replace("<question>", "<question>?"))
    qtbot.waitUntil(lambda: not panel.earlier.isHidden(), timeout=5000)
    assert table.rowCount() == 2 and "earlier template" in panel.earlier.text()
    assert set(line_colours(table, "verdict")) == {EARLIER.name()}
    assert "from an earlier template" in table.item(1, 0).toolTip()
    # a run of the template shown now is not greyed
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    assert table.rowCount() == 4 and "1 of these 2 runs" in panel.earlier.text()
    assert line_colours(table, "row")[2:] != [EARLIER.name()] * 2
    # back to the first template: the first run is the shown template's again, its colour back
    w.editor.set_text(TPL)
    qtbot.waitUntil(lambda: line_colours(table, "verdict")[1] == verdict_colour, timeout=5000)
    assert "1 of these 2 runs" in panel.earlier.text()  # now the second run is the earlier one


def test_a_benchmark_of_earlier_settings_is_marked_and_a_chain_bench_has_no_fork_column(
        qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS[:2])
    w.session.set_options(bench_modes=("chain",), repeat=1)
    assert trigger(qtbot, w, BENCH).outcome == "done"
    idle(qtbot, w)
    bench = w.bench
    origin = w.session.bench.origin
    assert origin.model == w.engine_status.info.name and "context 4,096" in origin.settings
    assert bench.earlier.isHidden()
    fork = [h.text() for h in (bench.table.horizontalHeaderItem(c)
                               for c in range(bench.table.columnCount()))].index("fork (ms)")
    assert bench.table.isColumnHidden(fork)
    # the same model with another context: the benchmark stays, marked as of other settings
    w.load_model(replace(w.session.options.engine, n_ctx=2048))
    qtbot.waitUntil(lambda: w.engine_status.info.n_ctx == 2048 and not w.engine_status.busy,
                    timeout=20000)
    qtbot.waitUntil(lambda: not bench.earlier.isHidden(), timeout=5000)
    assert "from earlier settings (context 4,096" in bench.earlier.text()
    assert w.session.bench is not None and bench.table.rowCount() == 2


def test_a_failed_run_does_not_leave_the_last_verdict_above_empty_outputs(
        qtbot, make_window, monkeypatch):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_selection([0])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    panel = w.run_panel
    assert panel.verdict.text() == "bit-identical"

    def refused(*a, **k):
        raise KvPrimerError("compose reuse cannot run on this model's recurrent layers; "
                            "use prefix or chain")

    monkeypatch.setattr(session_flows, "run_prompt", refused)
    w.session.set_selection([1])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "error"
    idle(qtbot, w)
    assert panel.verdict.text() == "not run" and "recurrent layers" in panel.details.text()
    assert all(not t.toPlainText() for t in panel.outputs.values())
    assert panel.reuse.text() == "" and not panel.verify_button.isEnabled()


def test_the_project_file_keeps_each_result_origin_and_opens_older_files(report):
    from app.engine import BenchResult
    from app.engine.session import RunRecord

    s = Session()
    s.set_template("hello <q>", "/tmp/rag.txt")
    made = ResultOrigin("rag.txt", "abc", "tiny", "f00", "context 4,096 · batch 32 · KV f16/f16")
    s.add_run(RunRecord(1, report, made))
    s.add_run(RunRecord(2, report))  # stamped by the session: this template, no model
    s.set_bench(BenchResult(model={}, rows=[], origin=made))
    project = s.to_project()
    again = Session()
    again.apply_project(project)
    assert [r.origin for r in again.runs] == [made, s.runs[1].origin]
    assert again.bench.origin == made
    # a project saved before results had an origin opens, its results without one
    for r in project.results:
        r.pop("origin", None)
    older = Session()
    older.apply_project(project)
    assert [r.origin for r in older.runs] == [None, None] and older.bench.origin is None


def test_what_changed_and_how_it_is_said():
    a = ResultOrigin("rag.txt", "aaa", "SmolLM2", "s1", "context 8,192 · batch 512 · KV f16/f16")
    assert a.changed(a) == []
    assert a.changed(replace(a, template_sha="bbb")) == ["template"]
    assert a.changed(replace(a, model="Qwen", model_sha="s2")) == ["model"]
    assert a.changed(replace(a, settings="context 4,096 · batch 512 · KV f16/f16")) == ["settings"]
    both = a.changed(replace(a, template_sha="b", model_sha="s2", model="Qwen"))
    assert earlier_text(both, a) == "from an earlier template and model (SmolLM2, rag.txt)"
    assert earlier_text(["settings"], a) == \
        "from earlier settings (context 8,192 · batch 512 · KV f16/f16)"
    assert ResultOrigin.from_dict({"template": "x"}) is None  # not an origin: none
