"""The status bar: the last message, the loaded model, context use, memory (against the
engine's total, when it says one), the running job's progress + Cancel, and the attention-kernel
measurement that runs between jobs ("measuring attention kernels: 6 s left (flash attention off
until measured)"), or its latest news.

The model and the job shown come from the engine status (app/engine/engine_status.py), which
the bar observes; the progress of that job from the worker's progress signal, in the words of
the engine's ``progress_line`` (the CLI's too): the whole job, the current pass, the time left,
on one line. Each field is a label of its own that ends in "…" when it is short of room, its
whole text in its tooltip; none is painted over another."""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QProgressBar, QPushButton, QSizePolicy, QStatusBar, QWidget

from ..engine import ModelInfo, Progress
from ..engine.engine_kernels import KernelStatus
from ..engine.task_state import progress_line
from .engine_worker import EngineWorker, Job
from .model_events import follow
from .narrow_widgets import ElidedLabel

BAR_STEPS = 1000
QUIET_STAGES = {"generate"}  # one token at a time: too fast and too small to be worth a bar


def one_line(label: str, line: str) -> str:
    """The progress line on one line, without its job's name twice ("prime: prime 256/1,761"
    reads "prime 256/1,761")."""
    line = " ".join(line.split())
    if label and line.startswith(f"{label}: {label} "):
        line = line[len(label) + 2:]
    return line


def rss_bytes() -> int | None:
    """Resident memory of this process (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except Exception:
            return None


def engine_memory_total(info: ModelInfo | None) -> int | None:
    """The engine's planned total in bytes (``info.memory.total``), None when it has none."""
    total = getattr(getattr(info, "memory", None), "total", None)
    return int(total) if total else None


def memory_text(rss: int, info: ModelInfo | None) -> tuple[str, str]:
    """(text, tooltip) of the memory line: this process's resident memory, against the
    engine's own sum of what it allocates (model, contexts, the cache's caps) when it has one."""
    total = engine_memory_total(info)
    if not total:
        return f"memory {rss / 1e6:,.0f} MB", "This process's resident memory"
    return (f"RAM {rss / 1e6:,.0f} / {total / 1e6:,.0f} MB",
            f"This process uses {rss / 1e6:,.0f} MB; the engine counts {total / 1e6:,.0f} MB for "
            "the model, its contexts and the cache's caps")


class JobBar(QProgressBar):
    """The job's progress: wide enough for "row 7 of 10 · chain · warm 1,280/1,836 · 3 min 10 s
    left" when there is room, narrower (the whole line in its tooltip) when there is not."""
    WIDTH = (200, 520)

    def text(self) -> str:  # Qt paints this: one line, elided to the bar, never wrapped
        room = self.width() - 8
        full = super().text()
        return self.fontMetrics().elidedText(full, Qt.ElideRight, room) if room > 0 else full

    def sizeHint(self) -> QSize:
        return QSize(self.WIDTH[1], super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self.WIDTH[0], super().minimumSizeHint().height())


class StatusBar(QStatusBar):
    # the kernel measurement's news (why it measures, a switch and what it dropped), once each,
    # for the Log
    kernel_news = Signal(str)

    def __init__(self, worker: EngineWorker, parent: QWidget | None = None):
        super().__init__(parent)
        self.engine_status = worker.engine_status
        # the labels elide (whole text in the tooltip): their text must not widen the window.
        # Messages go to a label of their own, not QStatusBar's, which is cut without an
        # ellipsis and painted under the labels on its right.
        self.message = ElidedLabel("")
        self.message.setObjectName("statusMessage")
        self.addWidget(self.message, 1)
        self._message_timer = QTimer(self, singleShot=True)
        self._message_timer.timeout.connect(self.clearMessage)
        self.model = ElidedLabel("no model")
        self.model.setObjectName("statusModel")
        self.context = ElidedLabel("")
        self.context.setObjectName("statusContext")
        self.memory = ElidedLabel("")
        self.memory.setObjectName("statusMemory")
        self.kernels = ElidedLabel("")
        self.kernels.setObjectName("kernelStatus")
        self.kernels.hide()
        # the long lines (a message, the kernel measurement) give up width, down to a few words;
        # the short figures (context, memory) keep theirs
        for label in (self.message, self.kernels):
            label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
            label.setMinimumWidth(label.fontMetrics().averageCharWidth() * 16)
        for label in (self.context, self.memory):
            label.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Preferred)
        self._kernel_note = ""
        self.bar = JobBar()
        self.bar.setObjectName("jobProgress")
        self.bar.setTextVisible(True)
        self.bar.setFormat("")
        self.cancel = QPushButton("Cancel (Esc)")
        self.cancel.setObjectName("cancelJob")
        self.cancel.clicked.connect(worker.cancel)
        for w in (self.bar, self.cancel):
            w.hide()
            self.addPermanentWidget(w)
        self.addPermanentWidget(self.kernels, 1)
        for w in (self.context, self.memory, self.model):
            self.addPermanentWidget(w)
        worker.progress.connect(self.on_progress)
        follow(self, self.engine_status.events.info, self.show_model)
        follow(self, self.engine_status.events.info, lambda _i: self.update_memory())
        follow(self, self.engine_status.events.job, self.show_job)
        follow(self, self.engine_status.events.kernel_measurement, self.show_kernels)
        follow(self, self.engine_status.events.working, lambda _w: self.show_kernels(
            self.engine_status.kernel_measurement))
        self.last_text = ""
        self._mem = QTimer(self, interval=2000)
        self._mem.timeout.connect(self.update_memory)
        self._mem.start()
        self.update_memory()

    def showMessage(self, text: str, timeout: int = 0) -> None:  # Qt's name
        self.message.setText(" ".join(text.split()))
        self.message.setToolTip(text)
        if timeout > 0:
            self._message_timer.start(timeout)
        else:
            self._message_timer.stop()

    def clearMessage(self) -> None:  # Qt's name
        self.message.setText("")

    def currentMessage(self) -> str:  # Qt's name
        return self.message.text()

    def fields(self) -> list[QWidget]:
        """The labels and the bar, left to right as shown."""
        return [self.message, self.bar, self.kernels, self.context, self.memory, self.model]

    def show_job(self, label: str) -> None:
        """The user's job that runs now ("" when none): a busy bar until its first progress."""
        if not label:
            self.bar.hide()
            self.cancel.hide()
            return
        self.bar.setRange(0, 0)
        self.bar.setFormat(label + "…")
        self.bar.setToolTip(label)
        self.bar.show()
        self.cancel.show()

    def show_kernels(self, m: KernelStatus | None) -> None:
        """The measurement between jobs, paused while the user's job runs; then its news."""
        if m is not None and m.note and m.note != self._kernel_note:
            self._kernel_note = m.note
            self.kernel_news.emit(m.note)
        text = "" if m is None else m.text()
        if m is not None and m.active and self.engine_status.working:
            text = text.replace("measuring attention kernels:", "attention kernels: measuring "
                                "paused while your job runs,", 1)
        self.kernels.setText(text)
        self.kernels.setToolTip(text)
        self.kernels.setVisible(bool(text))

    def on_progress(self, job: Job, p: Progress) -> None:
        if p.stage in QUIET_STAGES or job.kind.background:
            return
        self.bar.show()
        self.cancel.show()
        if p.stage == "load":
            self.bar.setRange(0, 0)
        else:  # the whole job with the running pass (a run of one row fills as it runs)
            self.bar.setRange(0, BAR_STEPS)
            self.bar.setValue(round(p.fraction * BAR_STEPS))
        self.last_text = one_line(job.label, progress_line(job.label, p))
        self.bar.setToolTip(self.last_text)
        self.bar.setFormat(self.last_text)

    def show_model(self, info: ModelInfo | None) -> None:
        if info is None:
            self.model.setText("no model")
            self.context.setText("")
            return
        self.model.setText(f"{info.name or Path(info.path).name} · {info.architecture} · "
                           f"KV {info.type_k}/{info.type_v}")
        self.show_context(0, info.n_ctx, info.kv_bytes_per_token)  # a new context is empty

    def show_context(self, used: int, n_ctx: int, kv_bytes_per_token: int) -> None:
        self.context.setText(f"context {used:,}/{n_ctx:,} tokens · KV {used * kv_bytes_per_token / 1e6:,.1f} MB")

    def update_memory(self) -> None:
        rss = rss_bytes()
        if rss:
            text, tip = memory_text(rss, self.engine_status.info)
            self.memory.setText(text)
            self.memory.setToolTip(f"{text}: {tip}")
