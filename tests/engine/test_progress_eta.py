"""A long pass's time left holds as it slows: attention costs more the further into the context a
token lies, so the time left comes from each batch's time fitted against its positions, not a
flat tokens/s. A run of one row shows a filling bar and a time left from its first batches.
Cancel stops within one batch, in the prime and in the cold run."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import Cancelled, GenerationConfig, Template, run_prompt
from app.engine.llama.native import NativeContext
from app.engine.task_state import (JobStep, Progress, TaskState, fit_batch_times, progress_line,
                                   time_left)

# a 1B model priming a 6,855-token prefix: 95 tok/s at the start, 60 at the end
A = 1 / 95
B = (1 / 60 - 1 / 95) / 6855
TOTAL, BATCH = 6855, 256


def token_seconds(a: int, b: int) -> float:
    p = np.arange(a, b)
    return float(np.sum(A + B * p))


def slowing_pass(clock, seen, noise=0.05, seed=7):
    """Report a prime of TOTAL tokens in batches whose time grows with position, each batch
    off by up to ``noise``, the first paying a one-off 0.5 s."""
    rng = np.random.default_rng(seed)
    task = TaskState(on_progress=seen.append)
    task.report("prime", 0, TOTAL)
    for a in range(0, TOTAL, BATCH):
        b = min(a + BATCH, TOTAL)
        clock.now += token_seconds(a, b) * (1 + rng.uniform(-noise, noise)) + (0.5 if a == 0 else 0)
        task.report("prime", b, TOTAL)


@pytest.mark.parametrize("seed", range(10))
def test_time_left_holds_while_the_pass_slows(clock, seed):
    seen: list[Progress] = []
    slowing_pass(clock, seen, seed=seed)
    for q in (0.25, 0.5, 0.75):
        p = min(seen[1:], key=lambda p: abs(p.done - q * TOTAL))
        truth = token_seconds(p.done, TOTAL)
        assert p.eta_s == pytest.approx(truth, rel=0.2), (q, p.eta_s, truth)
        # the mean rate so far says far less (what the window said: 40 s short of ~2 min)
        flat = (TOTAL - p.done) / (p.done / p.elapsed_s)
        assert flat < 0.9 * truth
    # the speed shown is the last batches', which falls as the pass goes
    assert seen[6].rate > 80 and seen[-1].rate < 70
    assert seen[-1].eta_s == 0


def test_the_fit_finds_a_and_b_and_falls_back_to_a_flat_rate():
    batches = [(a, a + 256, token_seconds(a, a + 256)) for a in range(0, 4096, 256)]
    a, b = fit_batch_times(batches)
    assert a == pytest.approx(A, rel=1e-6) and b == pytest.approx(B, rel=1e-6)
    assert time_left(a, b, 4096, 6855) == pytest.approx(token_seconds(4096, 6855), rel=1e-6)
    # two batches do not tell a slope; a pass that speeds up gets no negative slope
    assert fit_batch_times(batches[:2])[1] == 0
    faster = [(s, e, 1.0 / (1 + i)) for i, (s, e, _t) in enumerate(batches)]
    assert fit_batch_times(faster)[1] == 0
    assert fit_batch_times(batches, slope=False)[1] == 0


def test_items_are_not_fitted_against_positions(clock):
    seen: list[Progress] = []
    task = TaskState(on_progress=seen.append)
    task.report("bench", 0, 10)
    for k, secs in enumerate((10, 12, 14, 16), 1):
        clock.now += secs
        task.report("bench", k, 10)
    assert seen[-1].eta_s == pytest.approx(6 * 14.0)  # the mean of all but the first, flat


def test_a_run_of_one_row_shows_its_pass_in_the_bar_and_the_time_left(clock):
    seen: list[Progress] = []
    task = TaskState(on_progress=seen.append)
    task.begin_job("run", 1)
    task.begin_item(1, 1)
    task.report("cold", 0, 4000)
    for b in range(500, 4001, 500):
        clock.now += 5.0
        task.report("cold", b, 4000)
        if b == 2000:
            mid = seen[-1]
    assert mid.job.eta_s is None  # no row finished: the whole job's time left is unknown
    assert mid.fraction == pytest.approx(0.5)  # yet the bar fills with the pass
    line = progress_line("run both", mid)
    assert line == "run both: row 1 of 1 · cold 2,000/4,000 · 100 tok/s · 20 s left"
    # of a job of rows none has finished: the time left is the pass's, and says so
    two = JobStep("run", "row", 1, 2, 1, "", 0, 2, 20.0, None)
    assert progress_line("run", Progress("cold", 2000, 4000, 20.0, two, 20.0)).endswith(
        "cold 2,000/4,000 · 100 tok/s · 20 s left in this pass")
    # a job of rows: the finished rows, and the running pass within the next one
    step = JobStep("bench", "row", 3, 10, 3, "", 2, 10, 60.0, 240.0)
    assert Progress("warm", 50, 100, 1.0, step).fraction == pytest.approx(0.25)
    assert Progress("bench", 2, 10, 60.0, step).fraction == pytest.approx(0.2)
    assert Progress("prime", 30, 40, 1.0).fraction == pytest.approx(0.75)


TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 6
                     + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
VALUES = {"c": "the world is a question " * 3, "q": "hello?"}


@pytest.fixture
def decodes(monkeypatch):
    """Every llama_decode any context makes, in order."""
    calls: list[int] = []
    real = NativeContext.decode

    def counted(self, entries):
        calls.append(len(entries))
        return real(self, entries)

    monkeypatch.setattr(NativeContext, "decode", counted)
    return calls


def cancel_after_first_batch(stage: str, decodes: list[int]):
    at = {}

    def on(p: Progress) -> None:
        if p.stage == stage and p.done > 0 and not at:
            at["decodes"] = len(decodes)
            task.cancel()

    task = TaskState(on_progress=on)
    return task, at


def test_cancel_stops_the_prime_within_one_batch(engine, decodes):
    task, at = cancel_after_first_batch("prime", decodes)
    with pytest.raises(Cancelled):
        engine.prime(TPL, task=task)
    assert at["decodes"] >= 1 and len(decodes) == at["decodes"]  # none after the one reported
    assert len(engine.tokenize(TPL.prefix_prompt())) > 3 * engine.config.n_batch


def test_cancel_stops_the_cold_run_within_one_batch(engine, decodes):
    task, at = cancel_after_first_batch("cold", decodes)
    with pytest.raises(Cancelled):
        run_prompt(engine, TPL, VALUES, gen=GenerationConfig(max_tokens=2), warm=False,
                   oneshot=False, task=task)
    assert at["decodes"] >= 1 and len(decodes) == at["decodes"]


def test_a_cold_run_of_one_row_fills_the_window_bar_and_says_the_time_left(qtbot, make_window):
    from PySide6.QtCore import QObject, Slot

    from app.ui.engine_worker import JobKind
    from tests.ui.test_ui_window import TPL as WINDOW_TPL
    from tests.ui_actions import RUN_COLD, trigger

    class BarSeen(QObject):  # the bar after each report (its own slot was connected first)
        def __init__(self, w):
            super().__init__(w)
            self.w, self.seen = w, []
            w.worker.progress.connect(self._seen)

        @Slot(object, object)
        def _seen(self, job, p) -> None:
            bar = self.w.status.bar
            if job.kind is JobKind.RUN:
                self.seen.append((p, bar.value() / max(bar.maximum(), 1), self.w.status.last_text))

    w = make_window()
    w.editor.set_text(WINDOW_TPL)
    w.session.set_rows([{"question": "what", "topic": "it"}])
    got = BarSeen(w)
    assert trigger(qtbot, w, RUN_COLD).outcome == "done"
    cold = [(p, filled, text) for p, filled, text in got.seen
            if p.stage == "cold" and 0 < p.done < p.total]
    assert len(cold) >= 3, [t for _p, _f, t in got.seen]
    # the bar fills with the pass (it was empty: one row, none finished) and says the time left
    assert all(filled == pytest.approx(p.done / p.total, abs=0.002) for p, filled, _t in cold)
    assert all(text.startswith("run cold: row 1 of 1 · cold ") and text.endswith(" left")
               for _p, _f, text in cold[1:]), [t for _p, _f, t in cold]
