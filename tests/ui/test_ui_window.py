"""The window, driven as a user would, on the tiny model; every file it writes is in tmp_path."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QPushButton

from app.engine import EngineConfig, PrefixState, Template
from app.ui.engine_worker import JobKind
from app.ui.main_window import STATE_FILTERS
from tests.ui_actions import (BENCH, CANCEL, LOAD_STATE, PRIME, RUN_BOTH, RUN_WARM, SAVE_STATE,
                              SWEEP, Answers, action, answer_file_dialogs, click, idle, start,
                              trigger, wait_for_job)
from tests.paths import REPO_ROOT

PREFIX = "<|im_start|>system\nYou are a helpful assistant. " + "hello world of the answer. " * 20
TPL = PREFIX + "<|im_end|>\n<|im_start|>user\n<question> about <topic><|im_end|>\n"
SHORT_TPL = "You are a helpful assistant. hello world of the answer. <question> about <topic>"
LONG_TPL = "hello world of the answer and the question. " * 80 + "<q>"


def test_editing_the_template_updates_placeholders_and_prefix_count(qtbot, make_window, engine):
    w = make_window()
    w.editor.edit.setPlainText("hello <name>")
    qtbot.waitUntil(lambda: w.editor.counts is not None and w.editor.template.source == "hello <name>")
    assert list(w.fillings.fields) == ["name"]
    w.editor.edit.moveCursor(w.editor.edit.textCursor().MoveOperation.Start)
    qtbot.keyClicks(w.editor.edit, "the answer is <topic>: ")
    expected = len(engine.tokenize(Template.parse(w.editor.text()).prefix_prompt()))
    qtbot.waitUntil(lambda: w.editor.counts is not None and w.editor.counts.prefix == expected)
    assert list(w.fillings.fields) == ["topic", "name"]
    assert f"{expected:,} tokens" in w.editor.status.text()
    # the shaded prefix covers exactly the text before the first placeholder
    sels = w.editor.edit.extraSelections()
    assert (sels[0].cursor.selectionStart(), sels[0].cursor.selectionEnd()) == (0, len("the answer is "))
    w.editor.edit.undo()
    qtbot.waitUntil(lambda: w.editor.template is not None and "topic" not in w.editor.text())


def test_syntax_error_is_marked_at_its_line_and_column(qtbot, make_window):
    w = make_window(load=False)
    w.editor.set_text("first line\nsecond <name\nthird")
    assert (w.editor.error.line, w.editor.error.column) == (2, 8)
    sels = w.editor.edit.extraSelections()
    assert sels[-1].cursor.selectionStart() == len("first line\nsecond ")
    assert "line 2, column 8" in w.editor.status.text()
    assert w.editor.template is None


def test_fill_prime_save_load_run_cold_and_warm(qtbot, make_window, tmp_path, monkeypatch):
    w = make_window()
    w.editor.set_text(TPL)
    assert list(w.fillings.fields) == ["question", "topic"]
    qtbot.keyClicks(w.fillings.fields["question"], "what is it")
    qtbot.keyClicks(w.fillings.fields["topic"], "the world")
    assert w.session.rows == [{"question": "what is it", "topic": "the world"}]

    assert trigger(qtbot, w, PRIME).outcome == "done"
    primed = w.session.state
    qtbot.waitUntil(lambda: w.editor.counts is not None, timeout=20000)  # counted by a debounced job
    assert primed is not None and primed.n_tokens == w.editor.counts.prefix

    path = tmp_path / "states" / "hello.kvstate"
    answer_file_dialogs(monkeypatch, save=(str(path), STATE_FILTERS[0]))
    job = trigger(qtbot, w, SAVE_STATE)
    assert job.outcome == "done" and PrefixState.load(path).tokens == primed.tokens
    assert w.library.paths == [path]
    assert w.library.table.item(0, 2).text() == f"{primed.n_tokens:,}"

    w.session.set_state(None)
    w.library.select(path)
    assert click(qtbot, w, w.library.buttons["Load"], JobKind.LOAD_STATE).outcome == "done"
    assert w.session.state.tokens == primed.tokens and "loaded hello.kvstate" in w.library.message.text()
    assert w.session.state_ref.path == str(path)

    w.fillings.table.selectRow(0)
    click(qtbot, w, w.run_panel.findChild(QPushButton, "run_both"), JobKind.RUN)
    assert w.run_panel.table.rowCount() == 2  # one line per path
    paths = {w.run_panel.table.item(r, 1).text() for r in range(2)}
    assert paths == {"cold", "warm"}
    number, report = w.session.runs[-1].row, w.session.runs[-1].report
    assert number == 1 and report.reused_tokens == primed.n_tokens
    # the same verdict the engine's tests demand of a loaded state's prefix
    assert report.verdict.equivalence == "bit-identical", report.verdict.describe()
    assert w.run_panel.verdict.text() == report.verdict.equivalence
    assert w.run_panel.reuse.text().endswith(report.reuse_text())
    assert w.run_panel.chart.bar_count == 2
    assert w.run_panel.outputs["warm"].toPlainText() == report.warm.text


def test_cancel_a_prime(qtbot, make_window):
    w = make_window(n_batch=8)
    w.editor.set_text(LONG_TPL)
    idle(qtbot, w)
    seen = []

    def on_progress(job, p):
        if job.kind is JobKind.PRIME and p.done > 0 and not seen:
            seen.append(p)
            start(w, CANCEL)

    w.worker.progress.connect(on_progress)
    job = trigger(qtbot, w, PRIME)
    idle(qtbot, w)
    assert seen and job.outcome == "cancelled"
    assert w.session.state is None
    assert "prime cancelled" in w.errors.messages()[-1]
    assert "prime" in w.status.last_text and "tok/s" in w.status.last_text
    assert w.status.bar.isHidden()


def test_loading_a_corrupt_state_shows_the_reason_and_the_app_carries_on(qtbot, make_window, tmp_path):
    w = make_window()
    bad = tmp_path / "states" / "broken.kvstate"
    bad.write_bytes(b"KVPSTATE" + b"\0" * 10)
    w.library.refresh()
    w.library.select(bad)
    assert click(qtbot, w, w.library.buttons["Load"], JobKind.LOAD_STATE).outcome == "error"
    assert "broken.kvstate is truncated" in w.library.message.text()
    assert any("broken.kvstate is truncated" in m for m in w.errors.messages("error"))
    w.editor.set_text(TPL)
    assert trigger(qtbot, w, PRIME).outcome == "done" and w.session.state is not None


def test_state_for_another_model_is_refused(qtbot, make_window, other_tiny_model, tmp_path,
                                            monkeypatch):
    from app.engine import Engine

    other = Engine(EngineConfig(model_path=str(other_tiny_model), n_ctx=1024, n_threads=1))
    try:
        foreign = other.prime(Template.parse(TPL))
    finally:
        other.close()
    w = make_window()
    foreign.save(tmp_path / "states" / "foreign.kvstate")
    answer_file_dialogs(monkeypatch, open_path=str(tmp_path / "states" / "foreign.kvstate"))
    assert trigger(qtbot, w, LOAD_STATE).outcome == "error"
    assert "model" in w.library.message.text() and w.session.state is None


def test_close_during_a_job_cancels_it_cleanly(qtbot, make_window, tmp_path):
    w = make_window(n_batch=8)
    w.editor.set_text(LONG_TPL)
    idle(qtbot, w)
    started = []
    w.worker.progress.connect(lambda job, p: started.append(job) if job.kind is JobKind.PRIME else None)
    start(w, PRIME)
    qtbot.waitUntil(lambda: bool(started))
    job = started[0]
    w.close()
    assert job.future.done() and job.cancelled
    assert w.engine_status.closed and w.worker.engine_for_tests() is None
    assert not (tmp_path / "autosave" / "autosave.kvproj").exists()
    assert not w.errors.messages("error")


def test_benchmark_and_sweep_fill_the_charts_and_export(qtbot, make_window, tmp_path):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": "what", "topic": "it"}, {"question": "why", "topic": "that"}])
    w.bench.mode_boxes["compose"].setChecked(False)
    assert w.session.options.bench_modes == ("prefix", "chain")
    w.bench.repeat.setValue(2)
    job = trigger(qtbot, w, BENCH)
    assert job.outcome == "done"
    assert [(r.reuse, r.row) for r in w.session.bench.rows] == [
        ("prefix", 1), ("prefix", 2), ("chain", 1), ("chain", 2)]
    assert w.central_tabs.currentWidget() is w.bench
    # grouped bars: cold and one series per mode, for each row
    assert w.bench.chart.series_names() == ["cold", "warm: prefix", "warm: chain"]
    assert w.bench.chart.bar_count == 6 and w.bench.table.rowCount() == 4
    assert w.bench.chart.labels()[0].startswith(("row 1", "1"))
    assert "prefix: median warm" in w.bench.summary.text()
    headers = [w.bench.table.horizontalHeaderItem(c).text() for c in range(w.bench.table.columnCount())]
    verdicts = {w.bench.table.item(r, headers.index("verdict")).text() for r in range(4)}
    assert {w.bench.table.item(r, headers.index("reuse")).text() for r in range(4)} == {"prefix", "chain"}
    assert verdicts == {"bit-identical"}  # prefix and chain are exact, as the engine's tests say
    acc = w.bench.accuracy
    assert [acc.item(r, 0).text() for r in range(acc.rowCount())] == ["prefix", "chain"]
    assert sum(int(acc.item(0, c).text()) for c in (2, 3, 4)) == 2
    job = trigger(qtbot, w, SWEEP)
    pts = w.bench.sweep.points
    assert job.outcome == "done" and len(pts) >= 3
    assert [p.prefix_tokens for p in pts] == sorted(p.prefix_tokens for p in pts)
    assert pts[-1].prefix_tokens == w.editor.counts.prefix
    w.bench.export_data(tmp_path / "b.csv")
    w.bench.export_data(tmp_path / "b.json")
    rows = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert [(r["reuse"], r["row"]) for r in rows] == [("prefix", "1"), ("prefix", "2"),
                                                     ("chain", "1"), ("chain", "2")]
    assert len(json.loads((tmp_path / "b.json").read_text())["sweep"]) == len(pts)
    files = w.bench.export_charts(tmp_path / "c.png") + w.bench.export_charts(tmp_path / "c.svg")
    assert all(f.stat().st_size > 1000 for f in files)
    assert b"<svg" in files[-1].read_bytes()[:400]
    # results travel in the project file and come back as charts
    assert w.project.save(tmp_path / "p.kvproj")
    w.session.set_bench(None)
    w.session.set_sweep([])
    assert w.bench.chart.bar_count == 0
    assert w.project.open(tmp_path / "p.kvproj")
    assert w.bench.chart.bar_count == 6 and len(w.bench.sweep.points) == len(pts)


def test_project_save_open_and_unsaved_changes_on_close(qtbot, make_window, tmp_path):
    answers = Answers(unsaved="cancel")
    w = make_window(load=False, ask=answers)
    w.editor.set_text("intro <a>")
    w.session.set_rows([{"a": "one"}, {"a": "two"}])
    w.session.mark_dirty()
    w.close()
    assert answers.asked == ["unsaved"] and not w.closing and not w.engine_status.closed
    proj = tmp_path / "p.kvproj"
    assert w.project.save(proj) and not w.session.dirty
    w.editor.set_text("other <b>")
    assert w.project.open(proj)
    assert w.editor.text() == "intro <a>" and w.session.rows == [{"a": "one"}, {"a": "two"}]
    assert not w.project.open(tmp_path / "missing.kvproj")
    assert "no project file" in w.errors.messages("error")[-1]
    w.editor.set_text("changed <a>")
    answers.answers["unsaved"] = "discard"
    w.close()
    assert w.closing and w.engine_status.closed and answers.asked == ["unsaved", "unsaved"]


def test_autosave_is_offered_back_after_a_crash(qtbot, make_window, tmp_path):
    crashed = make_window(load=False)
    crashed.editor.set_text("unsaved work <x>")
    crashed.session.set_rows([{"x": "1"}])
    crashed.project.autosave()
    assert (tmp_path / "autosave" / "autosave.kvproj").is_file()
    answers = Answers(restore="yes")
    again = make_window(load=False, ask=answers, offer_restore=True, open_example=True)
    assert answers.asked == ["restore"]
    assert again.editor.text() == "unsaved work <x>" and again.session.rows == [{"x": "1"}]


def test_layout_and_recent_models_are_kept_in_settings(qtbot, make_window, tiny_model, tmp_path):
    from dataclasses import replace

    w = make_window()
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, lambda: w.load_model(replace(w.config, n_ctx=2048)))
    assert w.engine_status.info.n_ctx == 2048 and w.model_panel.fact_labels["context"].text().startswith("2,048")
    assert w.recent_models() == [str(tiny_model)]
    w.library.hide()
    w.close()
    s = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    assert s.value("geometry") is not None and s.value("recentModels") in ([str(tiny_model)], str(tiny_model))
    w2 = make_window(load=False)
    assert w2.library.isHidden()


def test_shortcuts_and_excepthook(qtbot, make_window, tmp_path):
    from app.ui.error_panel import setup_file_logging

    w = make_window(load=False)
    keys = dict(w.shortcut_list())
    assert keys["Prime prefix"] == "Ctrl+P" and keys["Run cold + warm"] == "Ctrl+R"
    assert keys["Cancel job"] == "Esc" and keys["Save project"] == "Ctrl+S"
    log_path = setup_file_logging(tmp_path / "logs")
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            sys.excepthook(*sys.exc_info())
        assert w.errors.messages("error")[-1].startswith("internal error: ValueError: boom")
        text = log_path.read_text()
        assert "Traceback" in text and "ValueError: boom" in text
        w.errors.list.clear()  # the fixture fails tests that leave internal errors behind
    finally:
        import logging
        from logging.handlers import RotatingFileHandler

        root = logging.getLogger("kvprimer")
        for h in [h for h in root.handlers if isinstance(h, RotatingFileHandler)]:
            root.removeHandler(h)
            h.close()


@pytest.mark.model
def test_screenshot_mode_on_the_default_model(default_model, tmp_path):
    out = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    r = subprocess.run([sys.executable, "-m", "app", "--threads", "1", "--screenshot", str(out)], env=env,
                       capture_output=True, text=True, timeout=900,
                       cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    from PySide6.QtGui import QImage

    img = QImage(str(out))
    assert img.width() >= 1400 and img.height() >= 900  # docks' minimum widths may add a little
    assert "bit-identical" in r.stdout  # chain reuse is exact: the warm run is the cold run


def test_dropped_files_open_by_type(qtbot, make_window, examples):
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent

    w = make_window(load=False)

    def drop(path):
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(str(path))])
        w.dropEvent(QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))

    drop(examples / "few-shot.tmpl")
    assert w.editor.path == str(examples / "few-shot.tmpl")
    drop(examples / "few-shot-rows.csv")
    expected = sum(1 for line in open(examples / "few-shot-rows.csv") if line.strip()) - 1
    assert len(w.session.rows) == expected > 0


def test_screenshot_mode_fails_with_one_line_when_the_model_is_missing(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    r = subprocess.run([sys.executable, "-m", "app", "--model", str(tmp_path / "none.gguf"),
                        "--screenshot", str(tmp_path / "x.png")], env=env, capture_output=True,
                       text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1 and not (tmp_path / "x.png").exists()
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("kvprimer-gui: error:")]
    assert len(errors) == 1 and str(tmp_path / "none.gguf") in errors[0]  # the engine's reason


def test_actions_follow_the_worker_state(qtbot, make_window):
    import threading

    w = make_window(load=False)
    engine_actions = ["Prime prefix", "Run cold + warm", "Benchmark rows", "Load state"]
    assert not any(action(w, a).isEnabled() for a in engine_actions)  # no model yet
    assert not w.run_panel.run_buttons[0].isEnabled() and not w.bench.run_button.isEnabled()
    w.load_model(w.config)
    qtbot.waitUntil(lambda: w.engine_status.info is not None and not w.engine_status.busy,
                    timeout=10000)
    assert all(action(w, a).isEnabled() for a in engine_actions)
    assert not action(w, SAVE_STATE).isEnabled()  # nothing primed
    assert not action(w, CANCEL).isEnabled()

    gate = threading.Event()
    job = w.worker.submit(JobKind.TASK, lambda e, t: gate.wait(10), label="hold")
    try:
        assert not any(action(w, a).isEnabled() for a in engine_actions)
        assert not w.run_panel.run_buttons[0].isEnabled() and not w.bench.sweep_button.isEnabled()
        assert action(w, CANCEL).isEnabled()
        action(w, RUN_BOTH).trigger()  # disabled: nothing is started
        assert not job.task.cancelled and not w.errors.messages("error")
    finally:
        gate.set()
    idle(qtbot, w)
    assert all(action(w, a).isEnabled() for a in engine_actions)
    # background work (token counts, KV views) leaves the actions enabled
    w.editor.set_text(TPL)
    assert action(w, PRIME).isEnabled()
    assert trigger(qtbot, w, PRIME).outcome == "done" and w.session.state is not None
    idle(qtbot, w)
    assert action(w, SAVE_STATE).isEnabled()


def test_runs_are_the_sessions_and_come_back_with_the_project(qtbot, make_window, tmp_path):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": "what", "topic": "it"}, {"question": "why", "topic": "that"}])
    w.session.set_selection([0, 1])
    job = trigger(qtbot, w, RUN_BOTH)
    assert job.outcome == "done" and [r.row for r in w.session.runs] == [1, 2]
    assert [r.report.verdict.equivalence for r in w.session.runs] == ["bit-identical"] * 2
    assert w.run_panel.table.rowCount() == 4 and w.run_panel.chart.bar_count == 4
    assert w.errors.messages()[-1] == w.session.runs[-1].summary()
    assert w.project.save(tmp_path / "runs.kvproj")
    w.session.clear_runs()
    assert w.run_panel.table.rowCount() == 0
    assert w.project.open(tmp_path / "runs.kvproj")
    assert [r.row for r in w.session.runs] == [1, 2] and w.run_panel.table.rowCount() == 4
    # the panel shows the last run, as it did before the project was saved
    assert w.run_panel.outputs["warm"].toPlainText() == w.session.runs[-1].report.warm.text


def test_advanced_panels_show_the_kv_cache_beside_the_model_panel(qtbot, make_window):
    w = make_window(load=False)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    assert w.kv_dock.isVisible() and w.model_panel.isVisible()
    assert not w.tabifiedDockWidgets(w.kv_dock)
    assert w.dockWidgetArea(w.kv_dock) == w.dockWidgetArea(w.model_panel)
    assert w.kv_dock.geometry().top() >= w.model_panel.geometry().bottom()


CHAIN_TPL = PREFIX + "<|im_end|>\n<|im_start|>user\nContext: <c1>\nQuestion: <question><|im_end|>\n"
PASSAGE = "the same passage about the world and the answer"


def test_chain_mode_reuses_an_earlier_rows_value_and_says_so(qtbot, make_window):
    from app.ui.run_panel import VERDICT_COLORS

    w = make_window()
    w.editor.set_text(CHAIN_TPL)
    w.session.set_rows([{"c1": PASSAGE, "question": "what"}, {"c1": PASSAGE, "question": "why now"}])
    w.run_panel.reuse_mode.setCurrentIndex(w.run_panel.reuse_mode.findData("prefix"))
    w.run_panel.reuse_mode.setCurrentIndex(w.run_panel.reuse_mode.findData("chain"))
    assert w.session.options.reuse_mode == "chain" and not w.run_panel.recompute.isEnabled()
    w.session.set_selection([0, 1])
    job = trigger(qtbot, w, RUN_BOTH)
    assert job.outcome == "done"
    first, second = (r.report for r in w.session.runs)
    assert first.reuse == second.reuse == "chain"
    assert [name for name, _n in first.sources] == ["static prefix"]
    # the passage came from the first row's cached prompt (and maybe a shared start of the question)
    assert [name.split()[0] for name, _n in second.sources][:2] == ["static", "<c1>"]
    assert second.reused_tokens > first.reused_tokens
    assert w.run_panel.reuse.text() == f"Reused (chain mode): {second.reuse_text()}"
    word = second.verdict.equivalence
    assert word == "bit-identical"  # chained reuse is exact
    assert w.run_panel.verdict.text() == word and VERDICT_COLORS[word] in w.run_panel.verdict.styleSheet()
    assert "same tokens" in w.run_panel.details.text()
    t = w.run_panel.table
    headers = [t.horizontalHeaderItem(c).text() for c in range(t.columnCount())]
    last = t.rowCount() - 1  # the warm line of the second row
    assert t.item(last, headers.index("reuse")).text() == "chain"
    assert t.item(last, headers.index("verdict")).text() == word


def test_cache_panel_lists_nodes_after_runs_and_evict_and_pin_act_on_them(qtbot, make_window):
    w = make_window()
    w.editor.set_text(CHAIN_TPL)
    w.session.set_rows([{"c1": PASSAGE, "question": "what"}])
    w.session.set_options(reuse_mode="chain")
    assert trigger(qtbot, w, RUN_WARM).outcome == "done"
    panel = w.cache_panel

    def node(label):
        snap = panel.snapshot
        return next((n for n in snap.nodes if n.label.startswith(label)), None) if snap else None

    qtbot.waitUntil(lambda: node("<c1>") is not None and node("<question>") is not None,
                    timeout=10000)
    top = panel.tree.topLevelItem(0)
    assert top.text(0) == "static prefix" and top.text(3) == "resident"
    assert top.child(0).text(0).startswith("<c1>")  # the tree follows the prompt
    assert panel.bars["resident"].value() > 0 and "node" in panel.bars["resident"].text()

    c1 = node("<c1>")
    assert c1.tier == "resident"
    panel.select(c1.id)
    assert panel.evict_btn.isEnabled()
    panel.evict_btn.click()
    qtbot.waitUntil(lambda: node("<c1>").tier == "ram", timeout=10000)
    assert "evicted" in panel.message.text()
    assert panel.bars["ram"].value() > 0

    q = node("<question>")
    panel.select(q.id)
    panel.pin_btn.click()
    qtbot.waitUntil(lambda: node("<question>").pinned, timeout=10000)
    assert panel.pin_btn.text() == "Unpin" and not panel.evict_btn.isEnabled()
    # the next run refreshes the panel by itself
    hits = node("static prefix").hits
    assert trigger(qtbot, w, RUN_WARM).outcome == "done"
    qtbot.waitUntil(lambda: node("static prefix").hits > hits, timeout=10000)
    # Clear, the action the engine's messages point at: nothing cached, the next run rebuilds
    panel.clear_btn.click()
    qtbot.waitUntil(lambda: panel.snapshot is not None and not panel.snapshot.nodes, timeout=10000)
    assert "cleared" in panel.message.text()
    assert trigger(qtbot, w, RUN_WARM).outcome == "done"
    qtbot.waitUntil(lambda: node("static prefix") is not None, timeout=10000)


def test_save_state_in_llamas_format_loads_back_with_its_warning(qtbot, make_window, tmp_path,
                                                                  monkeypatch):
    from app.engine.states.llama_state_file import is_llama_state
    from app.ui.states_library import LLAMA_MODEL

    w = make_window()
    w.editor.set_text(TPL)
    assert trigger(qtbot, w, PRIME).outcome == "done"
    primed = w.session.state
    # the Save dialog's second file type: llama.cpp's own sequence-state file
    answer_file_dialogs(monkeypatch, save=(str(tmp_path / "states" / "slot"), STATE_FILTERS[1]))
    job = trigger(qtbot, w, SAVE_STATE)
    path = tmp_path / "states" / "slot.bin"
    assert job.outcome == "done" and is_llama_state(path.read_bytes()[:4])
    assert w.library.paths == [path] and w.library.table.item(0, 1).text() == LLAMA_MODEL

    w.session.set_state(None)
    w.library.select(path)
    assert click(qtbot, w, w.library.buttons["Load"], JobKind.LOAD_STATE).outcome == "done"
    assert w.session.state.origin == "llama.cpp" and w.session.state.tokens == primed.tokens
    assert "no model identity" in w.library.message.text()
    assert "no model identity" in w.errors.messages()[-1]

    w.session.set_rows([{"question": "what", "topic": "it"}])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    report = w.session.runs[-1].report
    assert report.reused_tokens == primed.n_tokens
    # as the engine's tests demand of a llama.cpp state file (test_llama_state_cli)
    assert report.verdict.equivalence == "bit-identical", report.verdict.describe()


def test_model_panel_says_what_the_architecture_means_for_caching(qtbot, make_window):
    w = make_window()
    notes = w.engine_status.info.traits.notes()
    assert notes and all(n in w.model_panel.notes.text() for n in notes[:1])
    assert "warm runs: exact" in w.model_panel.notes.text()
