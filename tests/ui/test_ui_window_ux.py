"""The window a newcomer expects, driven through its actions, buttons and keys on the tiny
model: standard shortcuts, undo for rows and settings, every engine setting, one engine
configuration, Apply that keeps the working model, the sequences in use, the first layout."""
from __future__ import annotations

from dataclasses import fields

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QFileDialog, QPushButton

from app.engine import CacheLimits, EngineConfig
from app.engine.project.project_file import ProjectFile
from tests.ui.test_ui_window import SHORT_TPL, TPL
from app.ui.engine_worker import JobKind
from tests.ui_actions import idle, wait_for_job

MB = 1 << 20


def shown_active(qtbot, w):
    with qtbot.waitActive(w):  # window shortcuts need the active window
        w.show()
        w.activateWindow()


def button(w, name: str) -> QPushButton:
    return w.findChild(QPushButton, name)


def prime(qtbot, w):
    w.editor.set_text(TPL)
    w.actions_by_text["Prime prefix"].trigger()
    qtbot.waitUntil(lambda: w.session.state is not None, timeout=20000)
    idle(qtbot, w)


# ---- 1. standard shortcuts ---------------------------------------------------------------------

def test_ctrl_s_saves_the_project_and_state_files_live_under_prompt(qtbot, make_window, tmp_path,
                                                                     monkeypatch):
    w = make_window(load=False)
    keys = dict(w.shortcut_list())
    assert (keys["New project"], keys["Open project"], keys["Save project"],
            keys["Save project as"]) == ("Ctrl+N", "Ctrl+O", "Ctrl+S", "Ctrl+Shift+S")
    prompt = next(m for m in w.menuBar().actions() if m.text() == "&Prompt").menu()
    in_prompt = {a.text().replace("&", "").rstrip("…") for a in prompt.actions()}
    assert {"Save state", "Save state for llama.cpp", "Load state"} <= in_prompt
    assert all(keys.get(n) not in ("Ctrl+S", "Ctrl+Shift+S")
               for n in ("Save state", "Save state for llama.cpp", "Load state"))

    shown_active(qtbot, w)
    w.editor.set_text(SHORT_TPL)
    path = tmp_path / "p.kvproj"
    assert w.project.save(path)
    button(w, "rowsAdd").click()
    assert w.session.dirty
    qtbot.keyClick(w.fillings.table, Qt.Key_S, Qt.ControlModifier)
    assert not w.session.dirty and len(ProjectFile.load(path).rows) == 1

    other = tmp_path / "as.kvproj"
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (str(other), "")))
    qtbot.keyClick(w.fillings.table, Qt.Key_S, Qt.ControlModifier | Qt.ShiftModifier)
    assert other.is_file() and w.session.path == str(other)


# ---- 2. undo and redo --------------------------------------------------------------------------

def test_undo_and_redo_adding_editing_and_deleting_rows(qtbot, make_window):
    w = make_window(load=False)
    w.editor.set_text(SHORT_TPL)
    s, undo, redo = w.session, w.actions_by_text["Undo"], w.actions_by_text["Redo"]
    field = w.fillings.fields["question"]
    button(w, "rowsAdd").click()
    qtbot.keyClicks(field, "what")  # one edit, not four
    button(w, "rowsAdd").click()
    qtbot.keyClicks(field, "why")
    w.fillings.model.setData(w.fillings.model.index(0, 1), "it")  # typed into the table
    s.set_selection([0])
    button(w, "rowsDelete").click()
    after = [{"question": "why", "topic": ""}]
    assert s.rows == after

    undo.trigger()  # the delete
    assert s.rows == [{"question": "what", "topic": "it"}, {"question": "why", "topic": ""}]
    assert s.selection == [0] and field.toPlainText() == "what"  # the form follows
    undo.trigger()  # the table edit
    assert s.value(0, "topic") == ""
    undo.trigger()  # "why"
    assert s.rows[1] == {"question": "", "topic": ""}
    undo.trigger()  # the second row
    assert s.rows == [{"question": "what", "topic": ""}]
    undo.trigger()
    undo.trigger()
    assert s.rows == [] and not w.edits.stack.canUndo()
    for _ in range(6):
        redo.trigger()
    assert s.rows == after

    shown_active(qtbot, w)  # and by key, from the rows table
    w.fillings.table.setFocus()
    qtbot.keyClick(w.fillings.table, Qt.Key_Z, Qt.ControlModifier)
    assert len(s.rows) == 2
    qtbot.keyClick(w.fillings.table, Qt.Key_Z, Qt.ControlModifier | Qt.ShiftModifier)
    assert s.rows == after
    # typing in the template: Undo is the editor's own, the rows stay
    w.editor.edit.setFocus()
    w.editor.edit.moveCursor(QTextCursor.End)
    qtbot.keyClicks(w.editor.edit, " more")
    undo.trigger()
    assert w.editor.text() == SHORT_TPL and s.rows == after


def test_undo_of_a_setting_restores_the_session_and_the_widgets_follow(qtbot, make_window):
    w = make_window(load=False)
    s, o = w.session, w.session.options
    mode, tokens, form = w.run_panel.reuse_mode, w.run_panel.max_tokens, w.model_panel.form
    mode.setCurrentIndex(mode.findData("compose"))
    for _ in range(3):  # three steps of a spin box: one undo step
        qtbot.keyClick(tokens, Qt.Key_Up)
    form.n_ctx.setValue(2048)
    form.cache_ram.setValue(64)
    w.bench.mode_boxes["prefix"].click()
    assert (s.options.reuse_mode, s.options.max_tokens, s.options.engine.n_ctx,
            s.options.engine.cache.ram_bytes) == ("compose", o.max_tokens + 3, 2048, 64 * MB)
    assert "prefix" not in s.options.bench_modes

    undo = w.actions_by_text["Undo"]
    undo.trigger()
    assert "prefix" in s.options.bench_modes and w.bench.mode_boxes["prefix"].isChecked()
    undo.trigger()
    assert s.options.engine.cache == o.engine.cache and form.cache_ram.value() == 0
    undo.trigger()
    assert s.options.engine.n_ctx == 4096 and form.n_ctx.value() == 4096
    undo.trigger()
    assert s.options.max_tokens == o.max_tokens and tokens.value() == o.max_tokens
    undo.trigger()
    assert s.options == o and mode.currentData() == "chain"
    w.actions_by_text["Redo"].trigger()
    assert s.options.reuse_mode == "compose" and mode.currentData() == "compose"


# ---- 3 and 4. every engine setting, one engine configuration -----------------------------------

def test_every_engine_setting_has_a_control_and_apply_loads_them(qtbot, make_window):
    w = make_window()
    form = w.model_panel.form
    want = {("engine", f.name) for f in fields(EngineConfig)
            if f.name not in ("cache", "remeasure_kernels")}  # measuring again is a button
    want |= {("engine", "cache", f.name) for f in fields(CacheLimits)}
    assert want <= set(form.bindings)

    form.threads_gen.setValue(2)  # llama.cpp's -t
    form.threads.setValue(1)  # -tb
    form.n_seq_max.setValue(8)
    form.cache_resident.setValue(1)
    form.cache_ram.setValue(64)
    form.cache_file.setValue(128)
    assert "other settings" in w.model_panel.pending.text()
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, button(w, "applyModel").click, timeout=20000)
    loaded = w.engine_status.config
    assert (loaded.n_threads_gen, loaded.n_threads, loaded.n_seq_max) == (2, 1, 8)
    assert loaded.cache == CacheLimits(1 * MB, 64 * MB, 128 * MB)
    assert w.engine_status.info.n_seq_max == 8 and w.model_panel.pending.text() == ""


def test_the_session_holds_the_one_engine_configuration(qtbot, make_window, tmp_path,
                                                        monkeypatch):
    w = make_window()
    assert w.config is w.session.options.engine
    assert not hasattr(w.model_panel, "config") and "config" not in vars(w)
    proj = w.session.to_project()
    proj.settings["engine"]["n_ctx"] = 2048
    path = tmp_path / "other.kvproj"
    proj.save(path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(path), "")))
    w.actions_by_text["Open project"].trigger()
    # the panel shows the session's settings; the loaded model stays until Apply
    assert w.model_panel.form.n_ctx.value() == 2048 and w.engine_status.info.n_ctx == 4096
    assert "other settings" in w.model_panel.pending.text()
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, button(w, "applyModel").click, timeout=20000)
    assert w.engine_status.info.n_ctx == 2048 and w.model_panel.pending.text() == ""


# ---- 5. a failed Apply keeps the working model -------------------------------------------------

def test_a_failed_apply_keeps_the_loaded_model_and_says_why_in_one_line(qtbot, make_window,
                                                                        tiny_model, tmp_path):
    w = make_window()
    prime(qtbot, w)
    state = w.session.state
    form, apply = w.model_panel.form, button(w, "applyModel")

    form.path.selectAll()
    qtbot.keyClicks(form.path, str(tmp_path / "missing.gguf"))
    qtbot.keyClick(form.path, Qt.Key_Return)
    errors = len(w.errors.messages("error"))
    apply.click()
    qtbot.waitUntil(lambda: len(w.errors.messages("error")) > errors, timeout=20000)
    idle(qtbot, w)
    msg = w.errors.messages("error")[-1]
    assert "missing.gguf" in msg and "stays loaded" in msg and "\n" not in msg
    assert w.engine_status.info.path == str(tiny_model) and w.session.state is state
    # the file that failed does not stay in the field: it names the loaded model again
    assert form.path.text() == str(tiny_model) and w.model_panel.pending.text() == ""

    # a context that cannot be made: a quantized V cache without flash attention
    w.actions_by_text["Undo"].trigger()
    assert w.session.options.engine.model_path == str(tiny_model)
    form.type_v.setCurrentIndex(form.type_v.findData("q4_0"))
    form.flash_attn.setCurrentIndex(form.flash_attn.findData("off"))
    errors = len(w.errors.messages("error"))
    apply.click()
    qtbot.waitUntil(lambda: len(w.errors.messages("error")) > errors, timeout=20000)
    idle(qtbot, w)
    assert "flash attention" in w.errors.messages("error")[-1]
    assert w.engine_status.info.path == str(tiny_model)

    # still usable: a warm run from the state primed before
    w.session.set_rows([{"question": "what", "topic": "it"}])
    w.session.set_selection([0])
    assert w.actions_by_text["Run cold + warm"].isEnabled()
    w.actions_by_text["Run cold + warm"].trigger()
    qtbot.waitUntil(lambda: bool(w.session.runs), timeout=60000)
    idle(qtbot, w)
    assert w.session.runs[-1].report.warm.reused_tokens > 0


# ---- 6. the KV dock's sequences ----------------------------------------------------------------

def test_the_sequence_box_lists_the_sequences_in_use(qtbot, make_window):
    w = make_window()
    dock = w.kv_dock
    listed = lambda: [dock.seq_box.itemData(i) for i in range(dock.seq_box.count())]  # noqa: E731
    qtbot.waitUntil(lambda: dock.view is not None, timeout=10000)
    assert listed() == [0]
    prime(qtbot, w)
    qtbot.waitUntil(lambda: bool(dock.nodes), timeout=10000)
    (seq, _node), = dock.nodes.items()
    qtbot.waitUntil(lambda: listed() == [0, seq], timeout=10000)
    dock.select_seq(seq)
    assert dock.selected_seq == seq and dock.fork_btn.isEnabled()
    w.cache_panel.clear_btn.click()
    qtbot.waitUntil(lambda: listed() == [0], timeout=10000)
    assert dock.selected_seq == 0


# ---- 7. the first start ------------------------------------------------------------------------

def test_first_start_leads_with_the_work_and_the_layout_is_kept(qtbot, make_window):
    w = make_window(load=False)
    w.show()
    qtbot.waitExposed(w)
    advanced = [w.model_panel, w.kv_dock, w.cache_panel, w.library, w.errors]
    assert w.editor.isVisible() and w.fillings.table.isVisible() and w.run_panel.isVisible()
    assert not any(d.isVisible() for d in advanced)
    toggle = w.actions_by_text["Advanced panels"]
    assert not toggle.isChecked() and toggle in w.toolbar.actions()
    assert w.editor.edit.height() > 200  # room to read the template
    toggle.trigger()
    assert all(not d.isHidden() for d in advanced) and toggle.isChecked()
    assert w.model_panel.isVisible() and w.kv_dock.isVisible() and w.cache_panel.isVisible()
    w.close()

    w2 = make_window(load=False)  # the layout left is the layout found
    w2.show()
    qtbot.waitExposed(w2)
    assert w2.model_panel.isVisible() and w2.actions_by_text["Advanced panels"].isChecked()
    w2.kv_dock.toggleViewAction().trigger()  # one panel hidden from the View menu
    assert w2.actions_by_text["Advanced panels"].isChecked()
    w2.actions_by_text["Advanced panels"].trigger()
    assert not w2.model_panel.isVisible()
    w2.close()
    w3 = make_window(load=False)
    w3.show()
    qtbot.waitExposed(w3)
    assert not w3.model_panel.isVisible() and not w3.actions_by_text["Advanced panels"].isChecked()

