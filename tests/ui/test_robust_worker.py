"""Errors from native code and from the worker thread reach the user as one-line messages and
the log (the "kvprimer" loggers, which the window sends to its log file), never only stderr."""
from __future__ import annotations

import logging

from app.engine import EngineConfig, Template
from app.ui.engine_worker import EngineWorker, JobKind
from tests.tiny_model import write_unknown_arch_model

TPL = Template.parse("hello world of the answer. " * 4 + "<q>")


def load(qtbot, w, path, outcomes):
    """Load and wait for the outcome. Waits poll the GUI side: pytest-qt's waitSignal on a
    signal emitted from the worker thread can crash PySide6."""
    job = w.load(EngineConfig(model_path=str(path), n_ctx=256, n_batch=32, n_threads=1),
                 on_error=outcomes.append)
    qtbot.waitUntil(lambda: not w.engine_status.loading, timeout=10000)
    return job


def test_native_and_python_failures_become_messages_and_log_lines(qtbot, tiny_model, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kvprimer")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:30_000])
    w = EngineWorker()
    outcomes: list[str] = []
    try:
        job = load(qtbot, w, cut, outcomes)
        assert job.outcome == "error" and "truncated" in outcomes[0] and "\n" not in outcomes[0]
        assert w.engine_status.info is None

        # llama.cpp refuses a model our checks let through; its own words reach the log
        odd = write_unknown_arch_model(tmp_path / "odd.gguf")
        caplog.clear()
        load(qtbot, w, odd, outcomes)
        assert "unknown model architecture" in outcomes[1]
        native = [r for r in caplog.records if r.name == "kvprimer.llama"]
        assert any("unknown model architecture" in r.getMessage() for r in native)

        # a bug in a job: a message for the user, the traceback in the log
        assert load(qtbot, w, tiny_model, outcomes).outcome == "done"
        caplog.clear()
        w.submit(JobKind.TASK, lambda e, t: {}["missing"], label="buggy", on_error=outcomes.append)
        qtbot.waitUntil(lambda: len(outcomes) == 3, timeout=10000)
        assert outcomes[2].startswith("internal error in buggy: KeyError") and "\n" not in outcomes[2]
        assert any("Traceback" in r.getMessage() for r in caplog.records if r.name == "kvprimer.ui")

        # and the engine still works
        results = []
        w.submit(JobKind.PRIME, lambda e, t: e.prime(TPL, task=t).n_tokens, on_done=results.append)
        qtbot.waitUntil(lambda: bool(results), timeout=10000)
        assert results[0] > 10
    finally:
        w.shutdown()


def test_reload_and_shutdown_while_a_job_runs(qtbot, tiny_model, other_tiny_model):
    import threading

    tpl = Template.parse("hello world of the answer and question. " * 5 + "<q>")
    w = EngineWorker()
    outcomes: list[str] = []
    reached, gate = threading.Event(), threading.Event()

    def prime_and_pause(engine, task):
        def pause(p):  # hold the job between two batches until the GUI side has acted
            if p.stage == "prime" and p.done >= 32:
                reached.set()
                gate.wait(10)
        task.on_progress = pause
        return engine.prime(tpl, task=task)

    try:
        assert load(qtbot, w, tiny_model, outcomes).outcome == "done"
        job = w.submit(JobKind.PRIME, prime_and_pause, on_cancelled=lambda j: outcomes.append("cancelled"))
        assert reached.wait(10), (job.error, job.cancelled)
        # loading another model cancels the prime; the old engine is closed on the worker thread
        w.load(EngineConfig(model_path=str(other_tiny_model), n_ctx=256, n_batch=8, n_threads=1))
        gate.set()
        qtbot.waitUntil(lambda: w.engine_status.info.path == str(other_tiny_model), timeout=10000)
        assert job.cancelled and "cancelled" in outcomes
        # closing the window mid-job: cancel, wait, free the context; nothing raises
        reached.clear()
        gate.clear()
        slow = w.submit(JobKind.PRIME, prime_and_pause, label="prime again")
        assert reached.wait(10), (slow.error, slow.cancelled, slow.future)
        threading.Timer(0.0, gate.set).start()
        w.shutdown(wait=True)
        assert slow.future.done() and w.engine_for_tests() is None
    finally:
        gate.set()
        w.shutdown()
