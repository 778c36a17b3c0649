"""The window's first start: the model answers at once while the attention kernels are measured
between jobs, the status bar and the Model panel show the measurement, and the engine switches
to the measured kernel when the measurement ends."""
from __future__ import annotations

import threading

from app.engine.llama import kernel_choice as kc
from app.engine.llama import kernel_measure as km
from tests.ui_actions import RUN_BOTH, trigger

TPL = "You are a helpful assistant. hello world of the answer. <question> about <topic>"


def test_a_run_is_answered_before_the_background_measurement_ends(qtbot, make_window,
                                                                   monkeypatch):
    monkeypatch.setenv("KVPRIMER_FLASH_ATTN", "auto")
    kc._cache_path().unlink(missing_ok=True)  # no earlier measurement of the tiny model
    gate, steps = threading.Event(), []

    def hold(_m, task):  # the measurement cannot go on until the test says so, but yields
        steps.append(1)
        while not gate.is_set() and not (task is not None and task.cancelled):
            gate.wait(0.01)
    monkeypatch.setattr(km, "before_step", hold)
    try:
        w = make_window(n_ctx=1024)
        status = w.engine_status
        qtbot.waitUntil(lambda: bool(steps) and not w.status.kernels.isHidden(), timeout=20000)
        text = w.status.kernels.text()
        assert "measuring attention kernels" in text and "flash attention off until measured" in text
        assert "until measured" in w.model_panel.fact_labels["attention"].text()
        assert status.info.kernels.how == "until measured" and not status.busy  # idle work

        w.editor.set_text(TPL)
        w.session.set_rows([{"question": "what", "topic": "it"}])
        w.session.set_selection([0])
        job = trigger(qtbot, w, RUN_BOTH)  # stops the measurement between two steps
        assert job.outcome == "done"
        assert w.session.runs[-1].report.verdict.equivalence == "bit-identical"
        assert status.kernel_measurement.active and status.info.kernels.how == "until measured"

        gate.set()  # now it may finish, in idle time
        qtbot.waitUntil(lambda: not status.kernel_measurement.active, timeout=60000)
        assert status.info.kernels.how == "measured"
        assert "attention kernels measured" in w.status.kernels.text() \
            or "switched to flash attention" in w.status.kernels.text()
        assert status.kernel_measurement.note in w.errors.messages()  # the news is in the Log
        shown = w.model_panel.fact_labels["attention"].text()
        assert "(measured" in shown and "cores" in shown and "rounds" in shown
        # whichever kernel it picked, the window still runs (a switch emptied the cache)
        job = trigger(qtbot, w, RUN_BOTH)
        assert w.session.runs[-1].report.verdict.equivalence == "bit-identical"
    finally:
        gate.set()
