"""A long session in the real window: the RAG example's 48 recurring rows benchmarked in
prefix, chain and compose mode on the default model, through the window's own actions.

    xvfb-run -a .venv/bin/python -m bench.gui_long_session     # a real X server (xcb)
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m bench.gui_long_session --rows 6

It prints, every few rows and at the end, the reference counts of None, True and False and the
process's RSS, and exits 1 if the benchmark fails or a count fell by more than --max-drop (the
PySide6 6.12.0 bug that aborted the window: a count that falls reaches zero and Python aborts).
tests/ui/test_gui_soak.py runs the same kind of session on the tiny model in every `make test`;
this is its full-size version, for a machine with a display server.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path


def counts() -> tuple[int, int, int]:
    gc.collect()
    return sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)


def rss_mib() -> float:
    from .soak import rss_bytes

    return rss_bytes() / (1 << 20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gui_long_session", description=__doc__)
    ap.add_argument("--rows", type=int, default=48, help="rows of rag-recurring.csv (48)")
    ap.add_argument("--max-drop", type=int, default=1000,
                    help="how far a singleton's reference count may fall (1000)")
    ap.add_argument("--timeout-min", type=float, default=120.0)
    args = ap.parse_args(argv)

    from app.desktop_check import exit_if_xcb_libs_missing

    exit_if_xcb_libs_missing()  # one line naming the missing system libraries, not an abort
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.engine import EngineConfig, read_rows
    from app.engine.runs.prompt_runs import REUSE_MODES
    from app.resources_path import examples_dir
    from app.ui.engine_worker import JobKind
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="kvprimer-gui-session-"))
    ex = examples_dir()
    cfg = EngineConfig(n_ctx=8192)
    w = MainWindow(cfg, settings=QSettings(str(tmp / "settings.ini"), QSettings.IniFormat),
                   states_dir=tmp / "states", autosave_dir=tmp / "autosave",
                   log_path=tmp / "kvprimer.log", ask=lambda kind, text: "discard",
                   open_example=False, offer_restore=False, load_model=False)
    w.show()
    t0 = time.perf_counter()
    base = counts()
    result = {"code": 2, "dropped": False}  # 2: the benchmark did not finish
    done_rows = [0]

    def log(msg: str) -> None:
        now = counts()
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}; None {now[0] - base[0]:+,}, True "
              f"{now[1] - base[1]:+,}, False {now[2] - base[2]:+,}; RSS {rss_mib():,.0f} MiB",
              flush=True)
        drop = min(n - b for n, b in zip(now, base))
        if drop < -args.max_drop:
            print(f"a reference count fell by {-drop:,}: the bindings lose references", flush=True)
            result["dropped"] = True
            app.quit()

    def model_loaded(info) -> None:
        if not info or done_rows[0] or w.session.rows:
            return  # None while loading; only the first load starts the benchmark
        w.editor.set_text((ex / "rag.tmpl").read_text(encoding="utf-8"))
        rows = read_rows(ex / "rag-recurring.csv", w.session.template.placeholders)[:args.rows]
        w.session.set_rows([dict(r.values) for r in rows])
        w.bench.repeat.setValue(1)
        w.run_panel.max_tokens.setValue(8)
        for box in w.bench.mode_boxes.values():
            box.setChecked(True)
        assert w.session.options.bench_modes == REUSE_MODES
        log(f"model loaded; {len(w.session.rows)} rows; Benchmark rows")
        QTimer.singleShot(0, w.actions_by_text["Benchmark rows"].trigger)

    def progress(job, p) -> None:
        if job.kind is JobKind.BENCH and p.stage == "bench" and p.done != done_rows[0]:
            done_rows[0] = p.done
            if p.done % 6 == 0 or p.done == p.total:
                log(f"{p.done}/{p.total} row runs")

    def finished(job) -> None:
        if job.kind is not JobKind.BENCH:
            return
        rows = w.session.bench.rows if w.session.bench else []
        bad = [r.error for r in rows if r.error]
        ok = job.outcome == "done" and len(rows) == 3 * args.rows and not bad
        exact = {m: sum(r.equivalence == "bit-identical" for r in rows if r.reuse == m)
                 for m in REUSE_MODES}
        log(f"benchmark {job.outcome}: {len(rows)} rows, errors {len(bad)}, bit-identical "
            f"per mode {exact}")
        result["code"] = 0 if ok else 1
        QTimer.singleShot(500, app.quit)

    w.engine_status.events.info.connect(model_loaded)
    w.worker.progress.connect(progress)
    w.worker.job_finished.connect(finished)
    QTimer.singleShot(int(args.timeout_min * 60_000), app.quit)
    w.load_model(cfg)
    app.exec()
    w.close()
    if result["code"] == 2:
        print("the benchmark did not finish", flush=True)
    return 1 if result["dropped"] else result["code"]


if __name__ == "__main__":
    raise SystemExit(main())
