"""Driving the window as a user does: through its actions and buttons, waiting for the job an
action started to be delivered (never sleeping).

The window's menus and shortcuts change; tests name actions only through the constants below,
found by objectName first and then by their text (without "&" and a trailing "…"), so that a
renamed action is adapted here once.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QPoint, QPointF, Qt, Signal, Slot
from PySide6.QtGui import QAction, QWheelEvent
from PySide6.QtWidgets import QApplication

from app.ui.engine_worker import Job, JobKind
from app.ui.model_events import follow

PRIME = "Prime prefix"
SAVE_STATE = "Save state"
LOAD_STATE = "Load state"
RUN_BOTH = "Run cold + warm"
RUN_COLD = "Run cold only"
RUN_WARM = "Run warm only"
BENCH = "Benchmark rows"
SWEEP = "Prefix-length sweep"
CANCEL = "Cancel job"

# the job each action starts
KINDS = {PRIME: JobKind.PRIME, SAVE_STATE: JobKind.SAVE_STATE, LOAD_STATE: JobKind.LOAD_STATE,
         RUN_BOTH: JobKind.RUN, RUN_COLD: JobKind.RUN, RUN_WARM: JobKind.RUN,
         BENCH: JobKind.BENCH, SWEEP: JobKind.SWEEP}


def _text(a: QAction) -> str:
    return a.text().replace("&", "").rstrip("…").rstrip(".").strip()


def action(w, name: str) -> QAction:
    """The window's action called ``name`` (objectName, or text as shown in the menu)."""
    found = [a for a in w.findChildren(QAction) if a.objectName() == name]
    found = found or [a for a in w.findChildren(QAction) if _text(a) == name]
    if not found:
        raise LookupError(f"the window has no action {name!r}; adapt tests/ui_actions.py")
    return found[0]


def start(w, name: str) -> None:
    """Trigger an action without waiting (its job may be followed by progress signals)."""
    a = action(w, name)
    assert a.isEnabled(), f"{name} is disabled"
    a.trigger()


class JobLog(QObject):
    """Every job the worker delivered, in order. A child of the window, so Qt drops the
    connection with it (pytest-qt's waitSignal on this cross-thread signal left queued calls
    to a freed blocker behind on PySide6 6.11)."""

    def __init__(self, w):
        super().__init__(w)
        self.jobs: list[Job] = []
        w.worker.job_finished.connect(self._finished)  # after the worker's own delivery

    @Slot(object)
    def _finished(self, job: Job) -> None:
        self.jobs.append(job)


def job_log(w) -> JobLog:
    log = getattr(w, "_test_job_log", None)
    if log is None:
        log = w._test_job_log = JobLog(w)
    return log


def wait_for_job(qtbot, w, kind: JobKind, act, timeout: int = 60000) -> Job:
    """Run ``act()`` (a trigger or a click); return the job of ``kind`` it started once the
    window has its result."""
    log = job_log(w)
    seen = len(log.jobs)
    act()
    mine = lambda: next((j for j in log.jobs[seen:] if j.kind is kind), None)  # noqa: E731
    qtbot.waitUntil(lambda: mine() is not None, timeout=timeout)
    return mine()


def trigger(qtbot, w, name: str, timeout: int = 60000) -> Job:
    """Trigger an action and return the job it started, once the window has its result."""
    return wait_for_job(qtbot, w, KINDS[name], lambda: start(w, name), timeout)


def click(qtbot, w, button, kind: JobKind, timeout: int = 60000) -> Job:
    """Click a button that starts a job of ``kind``; return the job once delivered."""
    assert button.isEnabled(), f"{button.text()} is disabled"
    return wait_for_job(qtbot, w, kind, lambda: qtbot.mouseClick(button, Qt.LeftButton), timeout)


def answer_file_dialogs(monkeypatch, *, save: tuple[str, str] | None = None,
                        open_path: str | None = None) -> None:
    """What the file dialogs the actions open will answer: ``save`` (path, chosen filter)."""
    from PySide6.QtWidgets import QFileDialog

    if save is not None:
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: save))
    if open_path is not None:
        monkeypatch.setattr(QFileDialog, "getOpenFileName",
                            staticmethod(lambda *a, **k: (open_path, "")))


class Answers:
    """Stands in for the window's modal questions; records what was asked."""

    def __init__(self, **answers):
        self.answers = {"unsaved": "discard", "delete": "yes", "restore": "yes",
                        "replace": "yes", "for_fa": "auto", **answers}
        self.asked: list[str] = []

    def __call__(self, kind, text):
        self.asked.append(kind)
        return self.answers[kind]


def idle(qtbot, w, timeout=20000):
    qtbot.waitUntil(lambda: not w.engine_status.busy, timeout=timeout)


def show_with_panels(qtbot, w, size: tuple[int, int] = (1366, 768)) -> None:
    """The window shown at ``size`` (a 1366×768 screen's) with every advanced panel open."""
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()


def wheel(widget, notches: int = 1) -> bool:
    """Turn the wheel over ``widget``; True if it took the event (else it goes to its parent)."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre)), QPoint(),
                        QPoint(0, 120 * notches), Qt.NoButton, Qt.NoModifier, Qt.NoScrollPhase,
                        False)
    QApplication.sendEvent(widget, event)
    return event.isAccepted()


class StatusSignal(QObject):
    """A Qt signal for one of the engine status's events, for waits that must not poll
    (pytest-qt's waitSignal). The status is written on the GUI thread, so this is emitted there."""
    fired = Signal(object)  # the field's new value

    def __init__(self, w, name: str):
        super().__init__(w)
        follow(self, getattr(w.engine_status.events, name), self.fired.emit)


def status_signal(w, name: str) -> Signal:
    """The window's ``StatusSignal(w, name).fired``, made once per field."""
    made = getattr(w, "_test_status_signals", None)
    if made is None:
        made = w._test_status_signals = {}
    if name not in made:
        made[name] = StatusSignal(w, name)
    return made[name].fired
