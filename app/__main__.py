"""``python -m app``: the KV Primer window on qasync's event loop.

    python -m app                      the default model, the RAG example open
    python -m app -m PATH -c 8192      another GGUF model, another context size (every model
                                       and context option of `kvprimer`, llama.cpp's names)
    python -m app --screenshot OUT.png load, prime the RAG example, run two rows that share a
                                       passage in chain mode, save a window grab, exit
                  [--size 1366x768]    the window's size for the grab (default 1400x900)
    python -m app --version
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

SCREEN_SIZE = (1400, 900)
# the window's class (X11's WM_CLASS, from the program name Qt is given and the application's
# name) and the .desktop file's name: the taskbar groups the window under its menu entry, and
# names it "kvprimer", not "__main__.py"
APP_ID = "kvprimer"


def name_app(app) -> None:
    app.setOrganizationName(APP_ID)
    app.setApplicationName(APP_ID)
    app.setApplicationDisplayName("KV Primer")
    app.setDesktopFileName(APP_ID)


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is WIDTHxHEIGHT, like 1366x768, not {text!r}")
    if w < 640 or h < 480:
        raise argparse.ArgumentTypeError(f"{text} is too small for the window; 640x480 at least")
    return w, h


def engine_options_given(config):
    """``config`` (the command line's engine settings), or None when the command line gave
    none (no -m, -c...): the window then loads the reopened project's model and settings."""
    from app.cli.engine_options import engine_config

    return None if config == engine_config(_parser().parse_args([])) else config


def _parser() -> argparse.ArgumentParser:
    from app.cli.engine_options import engine_options

    p = argparse.ArgumentParser(prog="kvprimer-gui", description="KV Primer's desktop app.")
    engine_options(p)  # -m, -c, -b, -ub, -t, -tb, ... as `kvprimer` and llama.cpp take them
    p.add_argument("--screenshot", metavar="OUT.png",
                   help="open the RAG example, prime it, run two rows in chain mode, save a "
                        "screenshot, exit")
    p.add_argument("--size", metavar="WxH", type=_size, default=SCREEN_SIZE,
                   help="with --screenshot: the window's size in pixels (default 1400x900)")
    p.add_argument("--version", action="store_true", help="print versions and exit")
    return p


async def until_idle(worker) -> None:
    """Wait until the worker has no job (the engine status's busy flag drops)."""
    status = worker.engine_status
    if not status.busy:
        return
    fut = asyncio.get_event_loop().create_future()

    def on_busy(busy: bool) -> None:
        if not busy and not fut.done():
            fut.set_result(None)

    status.events.busy.connect(on_busy)
    try:
        await fut
    finally:
        status.events.busy.disconnect(on_busy)


async def _job(window, job) -> None:
    """Wait for a job the scenario started; raise with the window's reason when it failed."""
    from app.engine import KvPrimerError

    if job is None:
        raise KvPrimerError(window.errors.messages("error")[-1])
    await until_idle(window.worker)
    if job.error or job.cancelled:
        raise KvPrimerError(job.error or f"{job.label} was cancelled")


async def screenshot_scenario(window, out: Path) -> str:
    """Load (already started), prime the RAG example, run a row and then a later row sharing
    its first passage in chain mode (so the Run panel shows reuse past the static prefix and
    the verdict), save the state, grab the window. Raises on failure."""
    from app.engine import KvPrimerError
    from app.resources_path import examples_dir

    await until_idle(window.worker)
    if window.engine_status.info is None:
        errs = window.errors.messages("error")
        raise KvPrimerError(errs[-1] if errs else "the model did not load")
    s = window.session
    window.fillings.import_file(str(examples_dir() / "rag-recurring.csv"))
    s.set_options(reuse_mode="chain")
    await _job(window, window.jobs.prime())
    rows = s.rows
    again = next((i for i in range(1, len(rows)) if rows[i]["c1"] == rows[0]["c1"]), None)
    s.set_selection([0] if again is None else [0, again])
    await _job(window, window.jobs.run("both", oneshot=False))
    # save the primed prefix so that the States library shows what a saved state looks like
    await _job(window, window.jobs.save_state(window.library.folder / "rag.kvstate"))
    window.docks.show_advanced(True)  # the picture shows every panel
    window.cache_panel.raise_()
    await asyncio.sleep(0.3)  # let the docks repaint after the last job
    img = window.grab()
    if not img.save(str(out)):
        raise KvPrimerError(f"cannot write the screenshot to {out}; check the folder exists")
    return f"wrote {out} ({img.width()}×{img.height()}); " + s.runs[-1].summary()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        from app.versions import version_text

        print(version_text())
        return 0
    from app.cli.engine_options import engine_config
    from app.cli.exit_codes import ExitCode
    from app.engine import KvPrimerError

    try:  # before any window or event loop exists
        config = engine_config(args)
        started_with = engine_options_given(config)
    except KvPrimerError as e:
        print(f"kvprimer-gui: error: {e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    from app.desktop_check import exit_if_xcb_libs_missing
    exit_if_xcb_libs_missing()  # before Qt, which would abort on a missing xcb library

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.ui.error_panel import setup_file_logging
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([APP_ID])
    name_app(app)
    from PySide6.QtGui import QIcon

    from app.resources_path import resources_dir

    app.setWindowIcon(QIcon(str(resources_dir() / "icon.svg")))
    log_path = setup_file_logging()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)

    if args.screenshot:
        from PySide6.QtCore import QSettings

        tmp = tempfile.TemporaryDirectory(prefix="kvprimer-shot-")
        # a fresh layout and no autosave: the picture must not depend on the user's last session
        settings = QSettings(str(Path(tmp.name) / "settings.ini"), QSettings.IniFormat)
        window = MainWindow(config, settings=settings, autosave_dir=Path(tmp.name),
                            states_dir=Path(tmp.name) / "states",
                            log_path=log_path, offer_restore=False)
        window.resize(*args.size)
        window.show()
        code = 0
        with loop:
            try:
                print(loop.run_until_complete(screenshot_scenario(window, Path(args.screenshot))))
            except Exception as e:  # one line for the user, as the CLI does
                print(f"kvprimer-gui: error: {e}", file=sys.stderr)
                code = 1
            window.session.mark_clean()
            window.close()
        tmp.cleanup()
        return code

    window = MainWindow(started_with, log_path=log_path)
    window.show()
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    return 0


if __name__ == "__main__":
    sys.exit(main())
