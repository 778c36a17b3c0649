"""A benchmark (not a test): how long the GUI event loop stalls while the model primes a prefix.

The real window primes the RAG example's static prefix on the worker thread while a 10 ms
QTimer heartbeat runs on the GUI thread. A stall is how much later than its interval a tick
arrives; with llama.cpp off the GUI thread it should stay well under 50 ms.

    from app.ui.responsiveness import measure_prime_stalls
    print(measure_prime_stalls())   # {'max_stall_ms': ..., 'p99_stall_ms': ..., ...}
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path


def _wait_idle(window, timeout_s: float) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    status = window.engine_status
    if not status.busy:
        return
    loop = QEventLoop()

    def on_busy(busy: bool) -> None:
        if not busy:
            loop.quit()

    status.events.busy.connect(on_busy)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    status.events.busy.disconnect(on_busy)


def measure_prime_stalls(model_path: str | None = None, *, n_threads: int = 0,
                         heartbeat_ms: int = 10, timeout_s: float = 900.0) -> dict:
    """Prime the RAG prefix in the window; return stall figures (ms) and the prime's size/time.

    Returns {"max_stall_ms", "p99_stall_ms", "median_stall_ms", "ticks", "stalls_over_50ms",
    "max_stall_at_s" (seconds after the prime started), "prefix_tokens", "prime_s",
    "heartbeat_ms"}. Raises RuntimeError with a one-line reason when the model does
    not load or the prime fails. Creates a QApplication when there is none (offscreen works).
    """
    from PySide6.QtCore import QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from ..engine import EngineConfig
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory(prefix="kvprimer-resp-") as tmp:
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.IniFormat)
        w = MainWindow(EngineConfig(model_path=model_path, n_threads=n_threads), settings=settings,
                       states_dir=Path(tmp) / "states", autosave_dir=Path(tmp),
                       ask=lambda kind, text: "discard", offer_restore=False)
        try:
            w.show()
            _wait_idle(w, timeout_s)
            if w.engine_status.info is None:
                errs = w.errors.messages("error")
                raise RuntimeError(errs[-1] if errs else "the model did not load")
            ticks: list[float] = []
            beat = QTimer()
            beat.setTimerType(Qt.PreciseTimer)
            beat.setInterval(heartbeat_ms)
            beat.timeout.connect(lambda: ticks.append(time.perf_counter()))
            beat.start()
            t0 = time.perf_counter()
            ticks.append(t0)
            job = w.jobs.prime()
            if job is None:
                raise RuntimeError(w.errors.messages("error")[-1])
            _wait_idle(w, timeout_s)
            prime_s = time.perf_counter() - t0
            beat.stop()
            if job.outcome != "done":
                raise RuntimeError(job.error or f"the prime was {job.outcome}")
            gaps = [(max(0.0, (b - a) * 1000 - heartbeat_ms), a - t0) for a, b in zip(ticks, ticks[1:])]
            if not gaps:
                raise RuntimeError("the heartbeat never ticked")
            stalls = sorted(g for g, _ in gaps)
            worst_at = max(gaps)[1]

            def pct(q: float) -> float:
                return stalls[min(len(stalls) - 1, int(q * len(stalls)))]

            return {"max_stall_ms": round(stalls[-1], 1), "p99_stall_ms": round(pct(0.99), 1),
                    "median_stall_ms": round(pct(0.5), 1), "ticks": len(stalls),
                    "stalls_over_50ms": sum(g > 50 for g in stalls),
                    "max_stall_at_s": round(worst_at, 2),
                    "prefix_tokens": job.result.value.n_tokens, "prime_s": round(prime_s, 2),
                    "heartbeat_ms": heartbeat_ms}
        finally:
            w.session.mark_clean()
            w.close()
            w.deleteLater()
            app.processEvents()


if __name__ == "__main__":  # python -m app.ui.responsiveness [--threads N]
    import argparse
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    print(json.dumps(measure_prime_stalls(a.model, n_threads=a.threads)))
