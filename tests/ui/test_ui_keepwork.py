"""Nothing lost and the whole job in view, driven through the window's actions on the tiny
model: Open template over unsaved edits asks and Undo brings the old one back, naming it; the
last project reopens and Recent projects lists it; server results come back with the project;
dialogs start in Documents, then where the user went; the status bar names row k of N during a
benchmark; cancel keeps the rows finished. Settings and files live in tmp_path."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QFileDialog

from app.engine.runs.server_results import DeployResult, ServerBench, ServerRow
from app.ui.engine_worker import JobKind
from app.ui.file_folders import documents_dir
from app.ui.main_window import STATE_FILTERS
from tests.ui_actions import (BENCH, LOAD_STATE, PRIME, SAVE_STATE, Answers, action,
                              answer_file_dialogs, start, trigger)
from tests.paths import REPO_ROOT

SHORT_TPL = "You are a helpful assistant. hello world of the answer. <question> about <topic>"


def menu_text(a) -> str:
    return a.text().replace("&", "")


def test_open_template_over_unsaved_edits_asks_and_undo_brings_it_back(qtbot, make_window,
                                                                       tmp_path, monkeypatch):
    answers = Answers(replace="no")
    w = make_window(load=False, ask=answers)
    w.editor.edit.setPlainText("my own template <q>")  # typed, saved nowhere
    other = tmp_path / "other.tmpl"
    other.write_text("another one <x>", encoding="utf-8")
    answer_file_dialogs(monkeypatch, open_path=str(other))

    start(w, "Open template")
    assert answers.asked == ["replace"] and w.editor.text() == "my own template <q>"
    answers.answers["replace"] = "yes"
    start(w, "Open template")
    assert answers.asked == ["replace", "replace"]
    assert w.editor.text() == "another one <x>" and w.session.template_path == str(other)

    undo, redo = action(w, "Undo"), action(w, "Redo")
    assert menu_text(undo) == "Undo open template other.tmpl" and undo.isEnabled()
    undo.trigger()
    assert w.editor.text() == "my own template <q>" and w.session.template_path == ""
    assert w.session.placeholders == ["q"]
    assert "undid open template other.tmpl" in w.status.currentMessage()
    assert menu_text(redo) == "Redo open template other.tmpl"
    redo.trigger()
    assert w.editor.text() == "another one <x>"
    # opened, not edited since: the next one replaces it without a question, undoably
    start(w, "Open template")
    assert answers.asked == ["replace", "replace"]


def test_import_rows_is_an_undo_step_that_says_so(qtbot, make_window, tmp_path, monkeypatch):
    w = make_window(load=False)
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": "mine", "topic": "kept"}])
    rows = tmp_path / "rows.csv"
    rows.write_text("question,topic\nwhat,it\nwhy,that\n", encoding="utf-8")
    answer_file_dialogs(monkeypatch, open_path=str(rows))
    start(w, "Import rows")
    assert len(w.session.rows) == 2
    undo = action(w, "Undo")
    assert menu_text(undo) == "Undo import rows from rows.csv"
    undo.trigger()
    assert w.session.rows == [{"question": "mine", "topic": "kept"}]


def test_the_last_project_reopens_and_recent_projects_lists_it(qtbot, make_window, tmp_path,
                                                                monkeypatch):
    w = make_window(load=False)
    w.editor.set_text("kept <a>")
    w.session.set_rows([{"a": "one"}])
    proj = tmp_path / "work" / "mine.kvproj"
    proj.parent.mkdir()
    answer_file_dialogs(monkeypatch, save=(str(proj), ""))
    start(w, "Save project as")
    assert proj.is_file() and not w.session.dirty
    w.close()

    again = make_window(load=False, open_last=True, open_example=True)
    assert again.session.path == str(proj) and again.editor.text() == "kept <a>"
    assert again.session.rows == [{"a": "one"}] and not again.session.dirty
    assert not action(again, "Undo").isEnabled()  # what the window starts with is no edit
    recent = again.project.recent_menu.actions()
    assert [menu_text(a) for a in recent] == ["mine.kvproj"]
    assert recent[0].toolTip() == str(proj.resolve())
    again.editor.set_text("other <b>")
    recent[0].trigger()  # unsaved changes: asked (and discarded by the test's answers)
    assert again.editor.text() == "kept <a>" and again.ask.asked == ["unsaved"]

    proj.unlink()  # gone by the next start: a clear line, and the example instead
    again.close()
    third = make_window(load=False, open_last=True, open_example=True)
    assert any("the last project" in m and "no longer there" in m
               for m in third.errors.messages()), third.errors.messages()
    assert third.session.path == "" and third.session.template_path.endswith("rag.tmpl")


def test_server_results_are_saved_with_the_project_and_shown_again(qtbot, make_window, tmp_path):
    w = make_window(load=False)
    w.editor.set_text("intro <a>")
    row = ServerRow(row=1, prompt_tokens=40, prefix_tokens=30, cold_ms=50.0, warm_ms=10.0,
                    server_cached_tokens=29, server_evaluated_tokens=11, cold_cached_tokens=0,
                    text="hi", tokens=[5, 6], tokens_equal=True, server_cold_equal=True,
                    local_cold_ms=40.0)
    url = "http://127.0.0.1:8080"
    w.session.set_server_bench(ServerBench(url, "llama", "llama-server", "the same file", True,
                                           [row]))
    w.session.set_deployed(DeployResult(url, 0, "/slots/kvprimer-x.bin", 30, 691_200, 30, 5.0,
                                        29, 1, "the same file"))
    assert w.server_view.table.rowCount() == 1 and w.session.dirty
    proj = tmp_path / "s.kvproj"
    assert w.project.save(proj)

    again = make_window(load=False)
    assert again.server_view.table.rowCount() == 0
    assert again.project.open(proj)
    v = again.server_view
    assert again.session.server.rows == [row] and again.session.server.url == url
    assert again.session.deployed == w.session.deployed
    assert v.table.rowCount() == 1 and v.ttft_chart.bar_count == 3
    assert v.status.text().startswith("deployed 30 prefix tokens")


def test_file_dialogs_start_in_documents_then_where_the_user_went(qtbot, make_window, tmp_path,
                                                                   monkeypatch):
    w = make_window(load=False)
    chosen = tmp_path / "mine" / "t.tmpl"
    chosen.parent.mkdir()
    chosen.write_text("hi <a>", encoding="utf-8")
    asked = []

    def fake_open(_parent, _title, folder, _filters):
        asked.append(folder)
        return str(chosen), ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(fake_open))
    start(w, "Open template")
    checkout = REPO_ROOT
    assert asked == [str(documents_dir())]
    assert not Path(asked[0]).resolve().is_relative_to(checkout)
    start(w, "Import rows")  # another kind of file: the folder last used for any
    assert asked[1] == str(chosen.parent)
    # and a later window remembers it
    w.close()
    again = make_window(load=False)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(fake_open))
    start(again, "Open template")
    assert asked[2] == str(chosen.parent)


class StatusTexts(QObject):
    """The status bar's job line after each progress report of a benchmark (the bar's own slot
    was connected first, so it has shown the report when this one runs), and the Benchmark
    view's summary while no row has ended."""

    def __init__(self, w):
        super().__init__(w)
        self.w, self.texts, self.in_view, self.summaries = w, [], [], []
        w.worker.progress.connect(self._seen)

    @Slot(object, object)
    def _seen(self, job, _p) -> None:
        if job.kind is JobKind.BENCH:
            self.texts.append(self.w.status.last_text)
            self.in_view.append(self.w.bench.progress.text())  # the Benchmark tab's line
            if self.w.session.bench is None:
                self.summaries.append(self.w.bench.summary.text())


def test_the_status_bar_names_row_k_of_n_and_cancel_keeps_the_finished_rows(qtbot, make_window):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": q, "topic": "it"} for q in ("what", "why", "how")])
    w.bench.mode_boxes["chain"].setChecked(False)
    w.bench.repeat.setValue(1)
    seen = StatusTexts(w)
    assert trigger(qtbot, w, BENCH).outcome == "done"
    for k in (1, 2, 3):
        assert any(t.startswith(f"benchmark: row {k} of 3 · prefix · warm") for t in seen.texts), \
            seen.texts
    assert any(t.endswith(" left") for t in seen.texts if "row 3 of 3" in t), seen.texts
    assert seen.in_view == seen.texts and w.bench.progress.isHidden()  # shown while it ran

    def cancel_after_two(job, p):  # on the worker thread: the cancel lands before row 3 starts
        if job.kind is JobKind.BENCH and p.whole and p.job.done == 2:
            job.task.cancel()

    w.worker.progress.connect(cancel_after_two, Qt.DirectConnection)
    trigger(qtbot, w, BENCH)
    bench = w.session.bench
    assert bench.cancelled and [r.row for r in bench.rows] == [1, 2]
    assert all(r.error is None for r in bench.rows) and w.bench.table.rowCount() == 2
    assert "cancelled before every row ran" in w.bench.summary.text()
    assert "the 2 finished rows are kept" in w.status.currentMessage()


def test_a_running_benchmark_says_so_and_cancel_counts_rows_not_rows_times_modes(
        qtbot, make_window):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": q, "topic": "it"} for q in ("what", "why")])
    w.session.set_options(bench_modes=("prefix", "chain", "compose"), repeat=1)
    assert w.bench.summary.text().startswith("No benchmark yet")
    seen = StatusTexts(w)

    def cancel_after_one_row(job, p):  # on the worker thread: row 1 ran in its 3 modes
        if job.kind is JobKind.BENCH and p.whole and p.job.done == 3:
            job.task.cancel()

    w.worker.progress.connect(cancel_after_one_row, Qt.DirectConnection)
    trigger(qtbot, w, BENCH)
    # under the progress line, before the first row: not "No benchmark yet"
    assert seen.summaries and not any(t.startswith("No benchmark yet") for t in seen.summaries), \
        seen.summaries
    bench = w.session.bench
    assert bench.cancelled and [(r.row, r.reuse) for r in bench.rows] == [
        (1, "prefix"), (1, "chain"), (1, "compose")]
    assert "benchmark cancelled; the 1 finished row in 3 modes is kept: " in \
        w.status.currentMessage()


def test_a_loaded_state_can_be_undone_back_to_the_primed_one(qtbot, make_window, tmp_path,
                                                            monkeypatch):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    path = tmp_path / "states" / "first.kvstate"
    answer_file_dialogs(monkeypatch, save=(str(path), STATE_FILTERS[0]), open_path=str(path))
    assert trigger(qtbot, w, PRIME).outcome == "done"
    assert trigger(qtbot, w, SAVE_STATE).outcome == "done"
    assert trigger(qtbot, w, PRIME).outcome == "done"
    primed = w.session.state
    assert w.session.state_ref.path == ""
    assert trigger(qtbot, w, LOAD_STATE).outcome == "done"
    assert w.session.state is not primed and w.session.state_ref.path == str(path)
    undo = action(w, "Undo")
    assert menu_text(undo) == "Undo load state first.kvstate"
    undo.trigger()
    assert w.session.state is primed and w.session.state_ref.path == ""


def test_the_server_tab_refuses_a_blank_row_as_a_benchmark_does(qtbot, make_window):
    w = make_window()
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": "what", "topic": "it"}, {"question": " ", "topic": "x"}])
    v = w.server_view
    assert v.max_tokens.value() == w.session.options.max_tokens  # the CLI's default too
    qtbot.mouseClick(v.bench_button, Qt.LeftButton)
    assert "row 2" in v.status.text() and "<question>" in v.status.text(), v.status.text()
    assert w.session.server is None and not w.engine_status.working  # nothing was sent


def test_a_dropped_project_asks_about_unsaved_work_first(qtbot, make_window, tmp_path):
    answers = Answers(unsaved="cancel")
    w = make_window(load=False, ask=answers)
    proj = tmp_path / "p.kvproj"
    w.editor.set_text("saved <a>")
    assert w.project.save(proj)
    w.editor.set_text("unsaved <b>")
    w.project.open_path(str(proj))  # what a drop on the window does
    assert answers.asked == ["unsaved"] and w.editor.text() == "unsaved <b>"
    answers.answers["unsaved"] = "discard"
    w.project.open_path(str(proj))
    assert w.editor.text() == "saved <a>"


def test_a_start_without_engine_options_loads_the_reopened_projects_model(
        qtbot, make_window, other_tiny_model, tmp_path):
    """The project open at exit comes back with its model: a start without -m or any other
    engine option loads the project's settings; options given at the start win over them."""
    from dataclasses import replace

    from PySide6.QtCore import QSettings

    from app.ui.main_window import MainWindow

    w = make_window(load=False)
    w.editor.set_text("kept <a>")
    w.session.set_options(engine=replace(w.config, model_path=str(other_tiny_model), n_ctx=2048))
    proj = tmp_path / "with-model.kvproj"
    assert w.project.save(proj)
    w.close()

    def start_app(config):
        again = MainWindow(config, settings=QSettings(str(tmp_path / "settings.ini"),
                                                      QSettings.IniFormat),
                           states_dir=tmp_path / "states", autosave_dir=tmp_path / "autosave",
                           log_path=tmp_path / "kvprimer.log", ask=Answers(),
                           offer_restore=False, open_last=True)
        qtbot.addWidget(again)
        qtbot.waitUntil(lambda: again.engine_status.info is not None
                        and not again.engine_status.busy, timeout=20000)
        return again

    plain = start_app(None)
    assert plain.session.path == str(proj)
    loaded = plain.engine_status.config
    assert loaded.model_path == str(other_tiny_model) and loaded.n_ctx == 2048
    plain.session.mark_clean()
    plain.close()

    given = replace(loaded, model_path=str(Path(w.config.model_path)), n_ctx=1024)
    chosen = start_app(given)  # e.g. `kvprimer-gui -m model.gguf -c 1024`
    assert chosen.engine_status.config.model_path == given.model_path
    assert chosen.engine_status.config.n_ctx == 1024
    chosen.session.mark_clean()
