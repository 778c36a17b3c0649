"""Choosing a model file and its context is one Apply: the file chosen in the dialog waits for
Apply with the context beside it (it used to load at once with the old context, and the Apply
that followed loaded it again). A reload that empties the KV cache says so when a prefix was
primed, and offers to prime it again. The status bar's memory is against the engine's total
when the engine gives one."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import QFileDialog

from app.ui.engine_worker import JobKind
from app.ui.status_bar import engine_memory_total, memory_text
from tests.ui.test_ui_window_ux import button, prime
from tests.ui_actions import idle, job_log, wait_for_job


def test_a_chosen_model_file_and_its_context_load_with_one_apply(qtbot, make_window,
                                                                  other_tiny_model, monkeypatch):
    w = make_window()
    log = job_log(w)
    loads = lambda: [j for j in log.jobs if j.kind is JobKind.LOAD_MODEL]  # noqa: E731
    before = len(loads())
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(other_tiny_model), "")))
    w.model_panel.open_dialog()
    idle(qtbot, w)
    assert len(loads()) == before and not w.worker.engine_status.working  # nothing loads yet
    assert w.session.options.engine.model_path == str(other_tiny_model)
    pending = w.model_panel.pending.text()
    assert "other settings" in pending and "Apply loads tiny-other.gguf" in pending
    assert "4,096 tokens" in pending
    w.model_panel.form.n_ctx.setValue(2048)  # the context too, before loading
    assert "2,048 tokens" in w.model_panel.pending.text()
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, button(w, "applyModel").click, timeout=20000)
    assert len(loads()) == before + 1  # one load, of both
    info = w.engine_status.info
    assert info.path == str(other_tiny_model) and info.n_ctx == 2048
    assert w.model_panel.pending.text() == ""


def test_a_context_change_says_the_primed_prefix_was_dropped_and_offers_to_prime_it(
        qtbot, make_window):
    w = make_window()
    prime(qtbot, w)
    n = w.session.state.n_tokens
    notice = w.model_panel.notice
    assert notice.isHidden()
    w.model_panel.form.n_ctx.setValue(2048)
    assert f"the primed prefix ({n:,} tokens) will need priming again" in \
        w.model_panel.pending.text()
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, button(w, "applyModel").click, timeout=20000)
    said = w.status.currentMessage()
    assert (f"the context is now 2,048 tokens (was 4,096): the primed prefix ({n:,} tokens) is "
            "no longer in the KV cache") in said
    assert not notice.isHidden() and "2,048 tokens" in notice.text.text()
    assert w.errors.messages("info")[-1] == said  # in the Log too
    # Prime again: the prefix is evaluated into the new cache, and the line goes
    old = w.session.state
    wait_for_job(qtbot, w, JobKind.PRIME, notice.button.click, timeout=20000)
    assert w.session.state is not old and w.session.state.n_tokens == n
    assert notice.isHidden()


@dataclass
class Budget:
    total: int


def test_memory_is_shown_against_the_engines_total(qtbot, make_window):
    w = make_window()
    info = w.engine_status.info
    assert engine_memory_total(None) is None
    if engine_memory_total(info) is None:  # an engine that does not say its total: as before
        w.status.update_memory()
        assert w.status.memory.text().startswith("memory ")
        assert memory_text(812_000_000, info)[0] == "memory 812 MB"

    class WithMemory:  # the engine's info with its sum (engine.info.memory, a MemoryBudget)
        memory = Budget(1_500_000_000)

    assert engine_memory_total(WithMemory()) == 1_500_000_000
    text, tip = memory_text(812_000_000, WithMemory())
    assert text == "RAM 812 / 1,500 MB" and "1,500 MB for the model" in tip
