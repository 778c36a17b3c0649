"""The Model dock: the engine's settings (engine_settings.py), Apply, and the loaded model's
facts (the CPU level llama.cpp loaded among them), with what its architecture means for caching.
A model chosen from the recent ones, like one chosen in the file dialog, loads with Apply.

The settings are the session's; Apply asks the window to load what the session holds. The
loaded model's facts and settings come from the engine status (app/engine/engine_status.py),
which the panel observes. A note under Apply says when the loaded model runs with other
settings than those shown.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QDockWidget, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QScrollArea, QVBoxLayout, QWidget)

from .engine_settings import EngineSettingsForm, pending_text
from .model_events import follow
from .reload_notice import ReloadNotice
from .session_edits import SessionEdits
from .byte_sizes import size_text
from ..engine import EngineStatus, ModelInfo
from ..engine.session import Session


class ModelPanel(QDockWidget):
    apply_requested = Signal(bool)  # load the session's settings; True: time the kernels again

    def __init__(self, session: Session, engine_status: EngineStatus,
                 edits: SessionEdits | None = None, parent: QWidget | None = None):
        super().__init__("Model", parent)
        self.setObjectName("modelDock")
        self.session = session
        self.engine_status = engine_status
        self.form = EngineSettingsForm(session, edits or SessionEdits(session, self))
        self.form.file_chosen.connect(self._file_chosen)  # loads with Apply, not at once
        self.form.recent_chosen.connect(self.choose)
        self.remeasure = QPushButton("Measure again")
        self.remeasure.setObjectName("remeasureKernels")
        self.remeasure.setToolTip("Time both attention kernels again and reload")
        self.remeasure.clicked.connect(lambda: self._apply(remeasure=True))
        self.form.flash_row.addWidget(self.remeasure)
        self.apply = QPushButton("Apply (reload)")
        self.apply.setObjectName("applyModel")
        self.apply.setToolTip("Load the model with these settings; the loaded one stays until "
                              "the new one works")
        self.apply.clicked.connect(lambda: self._apply(remeasure=False))
        self.pending = QLabel("")
        self.pending.setObjectName("modelPending")
        self.pending.setWordWrap(True)
        self.pending.setStyleSheet("color: #a05a00")
        apply_row = QHBoxLayout()
        apply_row.addWidget(self.pending, 1)
        apply_row.addWidget(self.apply)
        self.notice = ReloadNotice(session)  # what the last reload dropped, and Prime again

        self.facts = QFormLayout()
        self.fact_labels: dict[str, QLabel] = {}
        for key in ("name", "architecture", "layers", "heads", "parameters", "file", "kv per token",
                    "context", "batch", "memory", "attention", "cpu level", "cpu kernels"):
            lab = QLabel("—")
            lab.setWordWrap(True)
            self.fact_labels[key] = lab
            self.facts.addRow(key.replace("cpu", "CPU") if key.startswith("cpu")
                              else key.capitalize(), lab)
        self.fact_labels["attention"].setObjectName("attentionKernel")
        self.fact_labels["memory"].setObjectName("memoryBudget")
        self.fact_labels["cpu level"].setObjectName("cpuLevel")
        self.fact_labels["cpu level"].setToolTip("The instruction-set level of the llama.cpp "
                                                 "CPU build loaded for this machine")
        facts_box = QGroupBox("Loaded model")
        facts_box.setLayout(self.facts)
        # what the architecture means for caching: window, recurrent layers, shifting positions
        self.notes = QLabel("—")
        self.notes.setObjectName("modelNotes")
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.RichText)
        notes_box = QGroupBox("Caching on this model")
        QVBoxLayout(notes_box).addWidget(self.notes)

        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.form)
        lay.addLayout(apply_row)
        lay.addWidget(self.notice)
        lay.addWidget(facts_box)
        lay.addWidget(notes_box)
        lay.addStretch(1)
        # scrolls rather than forcing its height on the window: it shares the side with the KV dock
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        scroll.setWidget(body)
        self.setWidget(scroll)
        session.events.options.connect(lambda _o: self._show_pending())
        session.events.state.connect(lambda _s: self._show_pending())
        follow(self, engine_status.events.info, self.show_info)
        follow(self, engine_status.events.config, lambda _config: self._show_pending())
        follow(self, engine_status.events.kernel_measurement, lambda _m: self._show_kernels())
        self.show_info(engine_status.info)
        self._show_pending()

    def _apply(self, remeasure: bool) -> None:
        self.form.commit_text()
        if remeasure:  # the measured choice is the one to use
            self.form.edits.set_engine("flash_attn", "auto")
        self.apply_requested.emit(remeasure)

    def _file_chosen(self, path: str) -> None:
        self.show()
        self.raise_()
        self.apply.setFocus()

    def _show_pending(self) -> None:
        # the settings the loaded model runs with, against the session's
        self.pending.setText(pending_text(self.engine_status.config, self.session.options.engine,
                                          self.session.state))

    def choose(self, path: str) -> None:
        """A model chosen from the recent ones ("": the default): set, loaded with Apply."""
        self.form.edits.set_engine("model_path", path or None)
        self._file_chosen(path)

    def open_dialog(self) -> None:
        self.form.open_dialog()

    def _show_kernels(self) -> None:
        """Flash attention on or off: the choice, the figures behind it (spread, the machine's
        load, when; provisional or not) and the measurement between jobs, if one is wanted."""
        info, m = self.engine_status.info, self.engine_status.kernel_measurement
        if info is None:
            return
        a = info.kernels
        lines = [a.describe()] + a.figure_lines() if a else ["—"]
        if m is not None and (m.active or m.note):
            lines.append(m.text())
        self.fact_labels["attention"].setText("\n".join(lines))

    def show_info(self, info: ModelInfo | None) -> None:
        f = self.fact_labels
        if info is None:
            for lab in f.values():
                lab.setText("—")
            self.notes.setText("—")
            return
        self.form.show_gpu_offload(True, info.gpu_offload)
        f["name"].setText(info.name or Path(info.path).name)
        f["architecture"].setText(info.architecture)
        f["layers"].setText(str(info.n_layer))
        f["heads"].setText(f"{info.n_head} (KV {info.n_head_kv}) × {info.n_embd // max(info.n_head, 1)}")
        f["parameters"].setText(f"{info.n_params / 1e6:,.1f} M")
        f["file"].setText(f"{Path(info.path).name} · {size_text(info.file_bytes)}")
        f["kv per token"].setText(f"{info.kv_bytes_per_token:,} bytes ({info.type_k}/{info.type_v})")
        f["context"].setText(f"{info.n_ctx:,} tokens (trained {info.n_ctx_train:,}) · "
                             f"full KV {size_text(info.n_ctx * info.kv_bytes_per_token)}")
        # the threads at load: a run on a busy machine may use fewer, and says how many
        f["batch"].setText(f"batch {info.n_batch}, {info.n_seq_max} sequences"
                           + (f"\nat load: {info.batch_threads}; each run names the batch "
                              "threads it used" if info.batch_threads else ""))
        f["memory"].setText(memory_text(info.memory))
        f["cpu level"].setText(info.cpu_backend or "—")
        self._show_kernels()
        # AMX / repacked weights: what llama.cpp runs this model with, why, and the crash check
        k = info.cpu_kernels
        f["cpu kernels"].setText(f"{k.summary()}\n{k.reason}\nCrash check: {k.probe}" if k else "—")
        self.notes.setText("".join(f"• {escape(n)}<br>" for n in info.traits.notes()).removesuffix("<br>"))


def memory_text(m) -> str:
    """The engine's memory budget (memory_budget.py): the sum against what is available, then
    each part on a line of its own."""
    if m is None:
        return "—"
    avail = f" of {size_text(m.available)} available" if m.available else ""
    lines = [f"{size_text(m.total)}{avail}", f"model {size_text(m.model)}"]
    lines += [f"{c.name}: KV {size_text(c.kv + c.recurrent)}, compute {size_text(c.compute)}"
              for c in m.contexts]
    lines.append(f"RAM tier cap {size_text(m.tiers_cap)}")
    return "\n".join(lines)
