"""The Qt-free session: template, rows, options, state and typed results, with their events,
and its file form (the project file). No Qt; runs come from the tiny model."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.engine import BenchResult, BenchRow, EngineConfig, Template, run_prompt
from app.engine.benchmarks.prefix_sweep import SweepPoint
from app.engine.project.project_file import Autosaver, ProjectFile, ProjectFileError, report_from_dict
from app.engine.runs.prompt_runs import report_dict
from app.engine.session import RowsChange, RunRecord, Session, bench_summary


def record(events, name):
    seen = []
    getattr(events, name).connect(lambda *a: seen.append(a))
    return seen


@pytest.fixture
def report(engine):
    tpl = Template.parse("hello world of the answer and the question. " * 3 + "<q>")
    return run_prompt(engine, tpl, {"q": "why?"}, oneshot=False)


def test_template_parse_and_columns_follow_the_text():
    s = Session()
    tpl, rows, dirty = record(s.events, "template"), record(s.events, "rows"), record(s.events, "file")
    s.set_template("intro <a> and <b>", "t.tmpl")
    assert s.placeholders == ["a", "b"] and s.template.placeholders == ["a", "b"]
    assert s.template_path == "t.tmpl" and len(tpl) == 1 and rows == [(RowsChange("reset"),)]
    assert s.dirty and len(dirty) == 1
    s.set_template("intro <a\nand <b>")  # a syntax error: the columns stay as they were
    assert s.template is None and s.template_error.line == 1 and s.placeholders == ["a", "b"]
    s.set_template("intro <a\nand <b>")  # unchanged: no event
    assert len(tpl) == 2


def test_rows_keep_values_of_placeholders_renamed_while_typing():
    s = Session()
    s.set_template("<question> <topic>")
    s.set_rows([{"question": "why", "topic": "it"}])
    s.set_template("<questio> <topic>")
    assert s.rows == [{"questio": "", "topic": "it"}]
    s.set_template("<question> <topic>")
    assert s.rows == [{"question": "why", "topic": "it"}]
    s.set_template("<topic> <c>")
    assert s.rows == [{"topic": "it", "c": ""}]
    assert s.to_project().rows == [{"topic": "it", "c": ""}]  # only current columns are saved


def test_row_edits_selection_and_events():
    s = Session()
    s.set_template("<q> <r>")
    changes, sel = record(s.events, "rows"), record(s.events, "selection")
    s.set_rows([{"q": "what", "r": "this"}, {"q": "why", "r": "that"}])
    assert (s.selection, s.current) == ([0], 0) and sel
    s.set_value(1, "r", "edited")
    assert changes[-1] == (RowsChange("values", 1, "r"),) and s.value(1, "r") == "edited"
    n = len(changes)
    s.set_value(1, "r", "edited")  # no change, no event
    assert len(changes) == n
    assert s.add_rows([{"q": "how"}]) == [2] and (s.selection, s.current) == ([2], 2)
    assert s.selected_rows()[0].number == 3 and s.selected_rows()[0].values == {"q": "how", "r": ""}
    s.set_selection([0, 1], 1)
    assert [r.number for r in s.selected_rows()] == [1, 2]
    s.remove_rows([0, 1])
    assert s.rows == [{"q": "how", "r": ""}] and (s.selection, s.current) == ([0], 0)
    s.remove_rows([0])
    assert s.rows == [] and s.selected_rows() == [] and s.current == -1


def test_removed_rows_go_back_where_they_were_with_every_value():
    """What an undo of a delete needs: the rows, in place, with the values of placeholders the
    template no longer has."""
    s = Session()
    s.set_template("<q> <old>")
    s.set_rows([{"q": "a", "old": "kept"}, {"q": "b"}, {"q": "c"}])
    s.set_template("<q>")
    before = s.raw_rows()
    removed = s.remove_rows([2, 0])
    assert s.rows == [{"q": "b"}] and [i for i, _ in removed] == [0, 2]
    s.insert_rows(removed)
    assert s.raw_rows() == before and (s.selection, s.current) == ([0, 2], 2)
    s.set_template("<q> <old>")
    assert s.row_values(0) == {"q": "a", "old": "kept"}
    s.set_rows([])
    s.set_rows(before)
    assert s.raw_rows() == before


def test_options_state_and_results_emit_their_own_events(report):
    s = Session()
    opts, state, runs, bench, sweep = (record(s.events, k) for k in
                                       ("options", "state", "runs", "bench", "sweep"))
    s.set_options(max_tokens=7, reuse_mode="compose")
    assert opts[-1][0].max_tokens == 7 and s.options.reuse_mode == "compose" and s.dirty
    s.mark_clean()
    s.set_options(engine=EngineConfig(n_ctx=512), edit=False)  # a model load: not an edit
    assert s.options.engine.n_ctx == 512 and not s.dirty
    s.set_state(None, "x.kvstate")
    assert state[-1][0].path == "x.kvstate" and s.state is None
    rec = RunRecord(2, report)
    s.add_run(rec)
    # the session notes what made the run: this template, no model yet
    assert runs == [(replace(rec, origin=s.origin()),)] and rec.summary().startswith("run: cold ")
    assert s.runs[-1].origin.template == "untitled" and s.runs[-1].origin.model == ""
    assert report.reuse_text() in rec.summary() and rec.summary().endswith("bit-identical")
    s.clear_runs()
    assert runs[-1] == (None,) and s.runs == []
    s.set_bench(BenchResult(model={}, rows=[BenchRow(row=1, cold_ms=9.0, warm_ms=3.0, speedup=3.0,
                                                      tokens_equal=True)]))
    s.set_sweep([SweepPoint(10, 4, 5.0, 2.0, 1.0)])
    assert bench[-1][0].rows[0].speedup == 3.0 and sweep[-1][0][0].prefix_tokens == 10


def test_report_dict_is_json_and_reads_back(report):
    d = json.loads(json.dumps(report_dict(report)))
    back = report_from_dict(d)
    assert back.warm.tokens == report.warm.tokens and back.warm.text == report.warm.text
    assert back.cold.ttft_ms == report.cold.ttft_ms and back.speedup == report.speedup
    assert (back.warm.mode, back.cold.mode) == ("warm", "cold")
    assert back.reused_tokens == report.reused_tokens
    assert back.verdict == report.verdict and back.verdict.equivalence == "bit-identical"
    assert back.sources == report.sources and back.reuse_text() == report.reuse_text()


def test_project_round_trip_through_the_file(tmp_path, report):
    s = Session()
    s.set_template("intro <a>", "t.tmpl")
    s.set_rows([{"a": "one"}, {"a": "two"}])
    s.set_options(max_tokens=9, repeat=2, reuse_mode="compose", recompute=4,
                  bench_modes=("chain", "compose"), engine=EngineConfig(n_ctx=2048, n_gpu_layers=-1))
    s.add_run(RunRecord(1, report))
    s.set_bench(BenchResult(model={"name": "m"}, repeat=2, modes=("chain", "compose"), recompute=4,
                            rows=[BenchRow(row=1, reuse="chain", cold_ms=9.0),
                                  BenchRow(row=1, reuse="compose", cold_ms=9.0)]))
    s.set_sweep([SweepPoint(10, 4, 5.0, 2.0, 1.0)])
    s.to_project().save(tmp_path / "p.kvproj")

    t = Session()
    events = record(t.events, "runs")
    assert t.apply_project(ProjectFile.load(tmp_path / "p.kvproj"), str(tmp_path / "p.kvproj")) == []
    assert (t.template_text, t.template_path, t.rows) == ("intro <a>", "t.tmpl", s.rows)
    assert t.options == s.options and t.path.endswith("p.kvproj") and not t.dirty
    assert [r.row for r in t.runs] == [1] and t.runs[0].report.speedup == report.speedup and events
    assert t.bench.rows[0].cold_ms == 9.0 and t.bench.repeat == 2
    assert (t.bench.modes, t.bench.recompute) == (("chain", "compose"), 4)
    assert t.sweep == s.sweep


def test_bench_summary_says_each_modes_figures_and_verdicts():
    rows = [BenchRow(row=r, reuse=m, cold_ms=90.0, warm_ms=w, speedup=90.0 / w, tokens_equal=True,
                     equivalence=v, reused_tokens=40 + r, max_logit_diff=d)
            for m, w, v, d in (("prefix", 10.0, "bit-identical", 0.0), ("compose", 3.0, "diverged", 0.25))
            for r in (1, 2)]
    for r, (same, kl) in zip(rows[2:], ((True, 0.002), (False, 0.004))):  # compose's
        r.tokens_equal, r.kl_divergence, r.top1_agree, r.recompute_share = same, kl, 0.75, 0.15
    res = BenchResult(model={}, rows=rows, modes=("prefix", "compose", "chain"), cancelled=True,
                      recompute="15%")
    # one formatter: the CLI prints these lines, the window joins them; compose's says its
    # trade: what it recomputed, how close to the cold run it came (its time against prefix's
    # comes from rows measured side by side: these were not)
    assert res.mode_lines() == [
        "prefix: median warm 10.0 ms, cold 90.0 ms, ×9.0; reused 42 tokens; 2 bit-identical; "
        "max |Δlogit| 0",
        "compose: median warm 3.0 ms, cold 90.0 ms, ×30.0; reused 42 tokens; 2 diverged; "
        "max |Δlogit| 0.25; recomputed 15% of module tokens (setting 15%), greedy tokens equal "
        "on 1 of 2 rows, top-1 agreement 75%, KL median 0.003",
        "chain: no row finished", "cancelled before every row ran"]
    assert bench_summary(res) == " · ".join(res.mode_lines())


def test_old_project_files_still_open(tmp_path):
    """A file from before typed results: run summaries only, no reuse mode."""
    old = {"format": 1, "template": "a <b>", "template_path": "", "placeholders": ["b"],
           "rows": [{"b": "x"}], "settings": {"engine": {"n_ctx": 512, "store_bytes": 1}, "max_tokens": 5, "repeat": 2},
           "results": [{"kind": "run", "row": 1, "speedup": 3.0, "cold_ttft_ms": 9.0},
                       {"kind": "benchmark", "model": {}, "rows": [{"row": 1, "cold_ms": 2.0}],
                        "summary": {"repeat": 2}}]}
    (tmp_path / "old.kvproj").write_text(json.dumps(old))
    s = Session()
    assert s.apply_project(ProjectFile.load(tmp_path / "old.kvproj")) == []
    assert s.rows == [{"b": "x"}] and s.options.max_tokens == 5 and s.options.engine.n_ctx == 512
    assert s.runs == [] and s.bench.rows[0].cold_ms == 2.0
    broken = dict(old, results=[{"kind": "sweep", "points": [{"nope": 1}]}])
    assert "unreadable" in s.apply_project(ProjectFile.from_json(json.dumps(broken)))[0]


def test_project_file_errors_and_autosave(tmp_path):
    p = ProjectFile(template="a <b>", rows=[{"b": "x"}], placeholders=["b"])
    (tmp_path / "bad.kvproj").write_text("{not json")
    with pytest.raises(ProjectFileError, match="not a KV Primer project"):
        ProjectFile.load(tmp_path / "bad.kvproj")
    with pytest.raises(ProjectFileError, match="no project file"):
        ProjectFile.load(tmp_path / "none.kvproj")
    saver = Autosaver(tmp_path / "auto" / "autosave.kvproj")
    assert saver.pending_restore() is None
    assert saver.write(p) and not saver.write(p)  # unchanged: not written again
    assert saver.pending_restore() == p
    saver.discard()
    assert saver.pending_restore() is None


def test_clear_starts_an_empty_project(report):
    s = Session()
    s.set_template("a <b>")
    s.set_rows([{"b": "1"}])
    s.add_run(RunRecord(1, report))
    s.clear()
    assert (s.template_text, s.rows, s.runs, s.bench, s.path, s.dirty) == ("", [], [], None, "", False)


def test_server_results_are_session_results_saved_in_the_project_file():
    from app.engine.runs.server_results import DeployResult, ServerBench, ServerRow

    s = Session()
    s.set_template("intro <a>")
    seen = record(s.events, "server")
    s.set_server_bench(ServerBench("http://h:1", "openai", "vllm", "by name", None, []))
    row = ServerRow(row=2, prompt_tokens=9, prefix_tokens=5, cold_ms=3.0, warm_ms=1.5,
                    server_cached_tokens=None, server_evaluated_tokens=None,
                    cold_cached_tokens=None, text="x", miss_reason="reused 0 of 5")
    s.add_server_row(row)  # as a running benchmark delivers them: a cancel keeps them
    deployed = DeployResult("http://h:1", 1, "/d/x.bin", 5, 100, 5, 2.0, 4, 1, "by hash")
    s.set_deployed(deployed)
    assert len(seen) == 3 and s.dirty
    text = s.to_project().to_json()
    again = Session()
    assert again.apply_project(ProjectFile.from_json(text)) == []
    assert again.server.rows == [row] and (again.server.api, again.server.flavor) == ("openai", "vllm")
    assert again.server.summary() == s.server.summary() and again.deployed == deployed
    assert again.server.gen_threads is None  # nothing compared locally
    s.server.gen_threads, s.server.rows[0].tokens_equal = 2, True
    again.apply_project(ProjectFile.from_json(s.to_project().to_json()))
    assert again.server.gen_threads == 2
    assert "(local runs on the server's 2 generation threads)" in again.server.describe()
    again.clear()
    assert again.server is None and again.deployed is None


def test_the_session_keeps_the_messages_while_the_template_is_their_rendering():
    from app.engine.prompts.chat_messages import ChatMessage, ChatTemplate

    s = Session()
    chat = ChatTemplate((ChatMessage("user", "<q>"),))
    seen = record(s.events, "template")
    s.set_template("<|im_start|>user\n<q>")
    s.set_chat(chat, "<|im_start|>user\n<q>")
    assert s.chat_template() == chat and len(seen) == 2
    s.set_template("typed over it <q>")  # the text changed: plain text now
    assert s.chat_template() is None
    s.set_template("<|im_start|>user\n<q>")  # undone: the rendering again
    assert s.chat_template() == chat
    s.set_chat(None)
    assert s.chat_template() is None
