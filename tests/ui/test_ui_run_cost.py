"""A Run in the window costs two evaluations when warm equals cold, and shows where the warm
time went; "always measure noise" adds the third. Driven through the window's actions."""
from __future__ import annotations

from PySide6.QtWidgets import QPushButton

from app.ui.engine_worker import JobKind
from app.engine import run_prompt
from app.ui.run_panel import breakdown_text
from tests.engine.runs.test_run_cost import GEN, SPLIT, VALS, _measured, _use_measurement
from tests.engine.runs.test_run_cost import TPL as CHAIN_TPL
from tests.engine.runs.test_run_cost import evaluations  # noqa: F401 (the spy fixture)
from tests.ui_actions import RUN_BOTH, click, trigger

TPL = ("<|im_start|>system\nYou are a helpful assistant. " + "hello world of the answer. " * 20
       + "<|im_end|>\n<|im_start|>user\n<question> about <topic><|im_end|>\n")


def test_a_run_in_the_window_makes_two_evaluations_and_shows_the_warm_breakdown(
        qtbot, make_window, evaluations):  # noqa: F811
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows([{"question": "what is it", "topic": "the world"}])
    w.session.set_selection([0])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    report = w.session.runs[-1].report
    assert report.verdict.equivalence == "bit-identical"
    assert evaluations == ["cold"] and report.oneshot is None  # and the warm one: two in all
    b = report.breakdown
    text = w.run_panel.breakdown.text()
    assert text.startswith("Warm time: ") and b.describe() in text
    assert f"evaluate {b.evaluated_tokens:,} tokens in {b.batches} batch" in text
    assert "2 evaluations (cold, warm)" in text and "noise" not in text

    # asked for: every run also measures the noise floor, and says so
    box = w.run_panel.noise
    assert not box.isChecked()
    box.click()
    assert w.session.options.measure_noise
    evaluations.clear()
    click(qtbot, w, w.run_panel.findChild(QPushButton, "run_both"), JobKind.RUN)
    again = w.session.runs[-1].report
    # the same prompt and batches: judged against the first run's kept cold run, and says so
    assert evaluations == ["oneshot"] and again.oneshot is not None and again.cold_kept
    assert again.verdict.equivalence == "bit-identical"
    assert ("2 evaluations (warm, noise); its cold run kept from an earlier run; noise floor "
            "measured") in w.run_panel.breakdown.text()
    assert w.run_panel.details.text().endswith("against a cold run kept from an earlier run")
    # the box is an option like the others: undone by Edit ▸ Undo, which names it
    assert "always measure noise" in w.edits.stack.undoText()
    w.edits.stack.undo()
    assert not w.session.options.measure_noise and not box.isChecked()


def test_the_result_explains_a_chain_run_slowed_by_its_batches(engine, monkeypatch):
    _use_measurement(monkeypatch, engine,
                     _measured(engine.kernels.flash_attn, 64.0, 64.0 + (SPLIT - 1) * 500.0))
    rep = run_prompt(engine, CHAIN_TPL, VALS, reuse="chain", gen=GEN, cold=False)
    first, note = breakdown_text(rep).split("\n")
    assert first.startswith("Warm time: ") and first.endswith("· 1 evaluation (warm)")
    assert note == f"Note: {rep.breakdown.batching_note}" and "prefix mode makes" in note
