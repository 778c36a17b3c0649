"""The Model panel and the smaller things around choosing a model and saving a project: the
CPU level loaded is named; a model that fails to load does not stay in the file field; the
recent models (the default one too) are in the drop-down and in File ▸ Recent models, and
choosing one sets it for Apply rather than loading it, a long one elided in the middle; numbers
read "4,096" as elsewhere and the wheel scrolls the panel past a box not clicked into; the Save
dialogs never start in the examples that come with the app."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from app.resources_path import examples_dir
from app.ui.engine_worker import JobKind
from tests.ui.test_ui_window_ux import button
from tests.ui_actions import idle, job_log, show_with_panels, wait_for_job, wheel


def test_the_model_panel_names_the_cpu_level(qtbot, make_window):
    w = make_window()
    level = w.model_panel.fact_labels["cpu level"].text()
    assert level == (w.engine_status.info.cpu_backend or "—") and level != ""


def test_a_model_that_fails_to_load_leaves_the_loaded_ones_path(qtbot, make_window, tmp_path):
    w = make_window()
    loaded = w.session.options.engine.model_path
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    w.open_model(str(bad))
    qtbot.waitUntil(lambda: any("cannot load" in m for m in w.errors.messages("error")),
                    timeout=20000)
    idle(qtbot, w)
    assert w.session.options.engine.model_path == loaded
    assert w.model_panel.form.path.text() == (loaded or "")


def test_recent_models_are_chosen_for_apply_and_the_default_is_listed(
        qtbot, make_window, other_tiny_model, tiny_model):
    w = make_window()
    log = job_log(w)
    loads = lambda: [j for j in log.jobs if j.kind is JobKind.LOAD_MODEL]  # noqa: E731
    w.recent.add(str(other_tiny_model))
    combo = w.model_panel.form.recent
    names = [combo.itemText(i) for i in range(combo.count())]
    menu = [a.text() for a in w.recent.menu.actions()]
    assert names == menu and names[0] == "tiny-other.gguf"
    assert names[-1].startswith("default model (")
    assert combo.isEnabled() and w.recent.menu.isEnabled()
    # the drop-down shows the model the settings name (not a grey placeholder)
    assert combo.currentData() == (w.session.options.engine.model_path or "")
    before = len(loads())
    w.recent.menu.actions()[0].trigger()  # File ▸ Recent models: set, not loaded
    idle(qtbot, w)
    assert len(loads()) == before and w.session.options.engine.model_path == str(other_tiny_model)
    assert "Apply loads tiny-other.gguf" in w.model_panel.pending.text()
    assert combo.currentText() == "tiny-other.gguf"
    combo.activated.emit(combo.count() - 1)  # the default model, from the drop-down
    assert w.session.options.engine.model_path is None and len(loads()) == before
    combo.activated.emit(0)
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, button(w, "applyModel").click, timeout=20000)
    assert w.engine_status.info.path == str(other_tiny_model)


def test_the_model_panel_elides_paths_groups_thousands_and_leaves_the_wheel_to_the_panel(
        qtbot, make_window, tmp_path):
    w = make_window(load=False)
    show_with_panels(qtbot, w)
    w.model_panel.raise_()
    qtbot.waitUntil(w.model_panel.isVisible, timeout=5000)
    form = w.model_panel.form
    assert form.n_ctx.value() == 4096 and form.n_ctx.text() == "4,096"
    # a recent model with a long name: its start and extension shown, the whole path in the tip
    name = "SmolLM2-135M-Instruct-a-rather-long-fine-tune-name-Q4_K_M.gguf"
    path = tmp_path / "models" / "some folder" / name
    w.recent.add(str(path))
    combo = form.recent
    combo.setCurrentIndex(0)
    shown = combo.shown_text()
    assert shown.startswith("SmolLM2") and shown.endswith(".gguf") and "…" in shown
    assert combo.fontMetrics().horizontalAdvance(shown) < combo.width()
    assert str(path) in combo.toolTip() and w.width() == 1366
    # nor does a long choice widen the panel, which would then scroll sideways
    for box in (combo, form.flash_attn):
        longest = max(box.fontMetrics().horizontalAdvance(box.itemText(i))
                      for i in range(box.count()))
        assert box.minimumSizeHint().width() < longest, box.objectName()
    scroll = w.model_panel.widget().horizontalScrollBar()
    qtbot.waitUntil(lambda: scroll.maximum() == 0, timeout=5000)
    # the wheel over a box the pointer passes while scrolling: the panel's, not the value's
    for box in (form.n_ctx, form.batch, combo):
        assert box.focusPolicy() == Qt.StrongFocus
    index = combo.currentIndex()
    assert wheel(form.n_ctx, -1) is False and wheel(combo, -1) is False
    assert form.n_ctx.value() == 4096 and combo.currentIndex() == index
    w.activateWindow()
    form.n_ctx.setFocus()
    qtbot.waitUntil(form.n_ctx.hasFocus, timeout=5000)
    assert wheel(form.n_ctx) is True and form.n_ctx.value() > 4096  # clicked into: its own


def test_save_dialogs_do_not_start_in_the_examples(qtbot, make_window, monkeypatch):
    w = make_window(load=False)
    started = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda _p, _t, start, _f: (started.append(start), ("", ""))[1]))
    w.folders.remember("template", examples_dir() / "rag.tmpl")  # an example opened last
    w.project.save_as()
    w.project.save_template_dialog()
    assert len(started) == 2
    for start in started:
        assert not Path(start).resolve().is_relative_to(examples_dir().resolve()), start
    # a project that has its own file: its dialog starts on it
    w.session.mark_clean(str(w.folders.folder("project") / "mine.kvproj"))
    w.project.save_as()
    assert started[-1].endswith("mine.kvproj")
