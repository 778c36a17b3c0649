"""The worker thread: jobs run off the GUI thread, outcomes arrive on it, cancel works."""
import threading

from app.engine import EngineConfig, Template
from app.ui.engine_worker import EngineWorker, JobKind

TPL = Template.parse("hello world of the answer and question. " * 20 + "<q>")


def test_load_run_and_outcome_on_gui_thread(qtbot, tiny_model):
    w = EngineWorker()
    try:
        w.load(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1))
        qtbot.waitUntil(lambda: w.engine_status.info is not None, timeout=10000)
        assert w.engine_status.info.n_layer == 2
        threads, results = [], []

        def job(engine, task):
            threads.append(threading.current_thread().name)
            return engine.prime(TPL, task=task).n_tokens

        # waits poll the GUI side: pytest-qt's waitSignal on a signal emitted from the worker
        # thread can crash PySide6
        w.submit(JobKind.PRIME, job, on_done=lambda r: results.append((r, threading.current_thread())))
        qtbot.waitUntil(lambda: bool(results), timeout=10000)
        assert threads[0].startswith("kvprimer-llama")
        assert results[0][0] > 100 and results[0][1] is threading.main_thread()
    finally:
        w.shutdown()


def test_new_job_cancels_the_running_one_and_errors_are_messages(qtbot, tiny_model):
    w = EngineWorker()
    try:
        w.load(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=8, n_threads=1))
        qtbot.waitUntil(lambda: w.engine_status.info is not None, timeout=10000)
        gate = threading.Event()

        def slow(engine, task):
            gate.wait(5)
            return engine.prime(TPL, task=task)

        outcomes = []
        first = w.submit(JobKind.TASK, slow, label="slow",
                         on_cancelled=lambda j: outcomes.append("cancelled"))
        second = w.submit(JobKind.LOAD_STATE, lambda e, t: e.load_state("/nonexistent.kvstate"),
                          on_error=outcomes.append)
        gate.set()
        qtbot.waitUntil(lambda: len(outcomes) == 2, timeout=10000)
        assert first.cancelled and outcomes[0] == "cancelled"
        assert "no state file" in outcomes[1] and second.outcome == "error"
        assert not w.engine_status.busy
    finally:
        w.shutdown()
