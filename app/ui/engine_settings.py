"""Every setting of the engine (``EngineConfig``), one control each, bound to the session.

The session's ``options.engine`` is the one engine configuration: these controls show it and
write the user's changes to it through ``SessionEdits`` (so each is undoable); the Model dock's
Apply loads what it holds. Names follow llama.cpp's tools: ``-t`` generation threads, ``-tb``
batch threads, ``-b``, ``-ngl``, ``-ctk``/``-ctv``, ``-fa``. The less common settings are in an
Advanced group.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from ..engine.llama.ggml_types import KV_TYPES as GGML_KV_TYPES
from ..engine.llama.native import GPU_OFFLOAD_MISSING
from ..engine.session import Options, Session
from .file_folders import documents_dir
from .setting_boxes import ElidedCombo, grouped
from .session_edits import OptionPath, SessionEdits, option_at

NGL_UNKNOWN = "Layers offloaded to the GPU (llama.cpp's -ngl): known once a model is loaded"
NGL_TIP = "Layers offloaded to the GPU (llama.cpp's -ngl); -1: all, 0: none"
KV_TYPES = ["f16", *(t for t in GGML_KV_TYPES if t != "f16")]  # the default first
FLASH_ATTN_CHOICES = (("auto", "auto (the faster, measured)"), ("on", "on"), ("off", "off"))
MB = 1 << 20


def pending_text(loaded, want, state) -> str:
    """What Apply will do, when the loaded model (``loaded``: its EngineConfig, None if none)
    runs with other settings than ``want``: load the file chosen with the context shown beside
    it, and, with a prefix primed (``state``), drop that prefix from the KV cache."""
    if loaded is None or loaded == want:
        return ""
    text = "The loaded model runs with other settings: Apply to reload."
    if loaded.model_path != want.model_path:
        name = Path(want.model_path).name if want.model_path else "the default model"
        text = (f"The loaded model runs with other settings: Apply loads {name} with a context "
                f"of {want.n_ctx:,} tokens (set it above first if it needs another).")
    if state is not None:
        text += (f" Reloading empties the KV cache: the primed prefix ({state.n_tokens:,} "
                 "tokens) will need priming again.")
    return text


@dataclass
class Binding:
    """One control and the setting it shows: how to read it, show a value, and hear changes."""
    path: OptionPath
    widget: QWidget
    read: Callable[[], Any]
    show: Callable[[Any], None]
    merge: bool  # spin boxes and text: consecutive changes undo as one


def spin(lo: int, hi: int, tip: str, special: str = "", step: int = 1) -> QSpinBox:
    s = grouped(QSpinBox())
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setToolTip(tip)
    if special:
        s.setSpecialValueText(special)
    return s


def combo(items: list[tuple[str, str]], c: QComboBox | None = None) -> QComboBox:
    c = c if c is not None else QComboBox()
    for value, text in items:
        c.addItem(text, value)
    return c


class EngineSettingsForm(QWidget):
    # a model file was chosen in the dialog: it loads with Apply, with the context set beside it
    file_chosen = Signal(str)
    recent_chosen = Signal(str)  # a model of the drop-down ("": the default), set with Apply

    def __init__(self, session: Session, edits: SessionEdits, parent: QWidget | None = None):
        super().__init__(parent)
        self.session, self.edits = session, edits
        self.bindings: dict[OptionPath, Binding] = {}

        self.path = QLineEdit()
        self.path.setObjectName("modelPath")
        self.path.setPlaceholderText("default model (SmolLM2-135M-Instruct)")
        browse = QPushButton("Open…")
        browse.clicked.connect(self.open_dialog)
        self.recent = ElidedCombo("A model loaded lately, or the default one: Apply loads it")
        self.recent.setObjectName("recentModels")
        self.recent.setPlaceholderText("recent models")
        self.recent.activated.connect(lambda i: self.recent_chosen.emit(self.recent.itemData(i)))
        self.n_ctx = spin(64, 1 << 17, "Context size in tokens (llama.cpp's -c)", step=512)
        self.ngl = spin(-1, 999, NGL_UNKNOWN, "all (-1)")
        self.ngl.setObjectName("nGpuLayers")
        self.ngl.setEnabled(False)  # whether the build can offload comes with a model's facts
        self.type_k, self.type_v = (combo([(t, t) for t in KV_TYPES]) for _ in range(2))
        self.type_k.setToolTip("K cache type (llama.cpp's -ctk)")
        self.type_v.setToolTip("V cache type (llama.cpp's -ctv)")
        # beside Measure again: its long choice elides rather than widen the panel
        self.flash_attn = combo(list(FLASH_ATTN_CHOICES), ElidedCombo(
            "llama.cpp's attention kernel (-fa); auto times both on this model once and keeps "
            "the faster (the times show below)", elide=Qt.ElideRight))
        self.flash_attn.setObjectName("flashAttn")
        # advanced
        self.threads_gen = spin(0, 256, "Threads generating tokens (llama.cpp's -t). Default: "
                                "as the batch threads, warm and cold runs still bit-identical; "
                                "1 on sliding-window models, whose warm runs generate in the "
                                "cache's shared cells", "default")
        self.threads_gen.setObjectName("threadsGen")
        self.threads = spin(0, 256, "Threads evaluating prompts in batches (llama.cpp's -tb). "
                            "Auto: the cores other programs leave free, measured as it runs, "
                            "up to one per physical core", "auto")
        self.threads.setObjectName("threadsBatch")
        self.batch = spin(1, 8192, "Tokens per decode batch (llama.cpp's -b)")
        self.ubatch = spin(0, 8192, "Tokens per physical batch inside a decode call "
                           "(llama.cpp's -ub)", "as the batch")
        self.ubatch.setObjectName("ubatch")
        # the radix cache needs 6 sequences; llama.cpp's contexts hold at most 64
        self.n_seq_max = spin(6, 64, "Sequences in the context: 0 is yours, the radix cache "
                              "uses the rest")
        self.cache_resident = spin(0, 1 << 22, "Cap on cached prompts' cells kept in the "
                                   "context", "¾ of the context")
        self.cache_ram = spin(0, 1 << 22, "Cap on snapshots of evicted prompts kept in memory "
                              "(auto: room for a prefix as long as the context, within half "
                              "the memory the engine leaves)", "auto")
        self.cache_file = spin(0, 1 << 22, "Cap on snapshots spilled to files")
        for name, s in (("cacheResidentMb", self.cache_resident), ("cacheRamMb", self.cache_ram),
                        ("cacheFileMb", self.cache_file)):
            s.setObjectName(name)
            s.setSuffix(" MB")
        self.cache_folder = QLineEdit()
        self.cache_folder.setPlaceholderText("a temporary folder, removed on close")
        self.cache_folder.setToolTip("Where spilled snapshots go")
        self.kv_debug_log = QCheckBox("cell map for the KV view")
        self.kv_debug_log.setToolTip("Read llama.cpp's cell debug log (LLAMA_KV_CACHE_DEBUG) to "
                                     "draw every cell; off, the KV view shows position ranges")

        self._bind_all()
        self._lay_out(browse)
        session.events.options.connect(self.show_options)
        self.show_options(session.options)

    # ---- bindings: each control reads and shows one setting of the session
    def _bind_all(self) -> None:
        E = ("engine",)
        for path, box, merge in ((E + ("n_ctx",), self.n_ctx, True),
                                 (E + ("n_gpu_layers",), self.ngl, True),
                                 (E + ("n_threads_gen",), self.threads_gen, True),
                                 (E + ("n_threads",), self.threads, True),
                                 (E + ("n_batch",), self.batch, True),
                                 (E + ("n_ubatch",), self.ubatch, True),
                                 (E + ("n_seq_max",), self.n_seq_max, True)):
            self._bind(path, box, box.value, box.setValue, box.valueChanged, merge)
        for name, box in (("resident_bytes", self.cache_resident), ("ram_bytes", self.cache_ram),
                          ("file_bytes", self.cache_file)):
            self._bind(E + ("cache", name), box, lambda b=box: b.value() * MB,
                       lambda v, b=box: b.setValue(round(v / MB)), box.valueChanged, True)
        for name, box in (("type_k", self.type_k), ("type_v", self.type_v),
                          ("flash_attn", self.flash_attn)):
            self._bind(E + (name,), box, box.currentData,
                       lambda v, b=box: b.setCurrentIndex(max(b.findData(v), 0)),
                       box.currentIndexChanged, False)
        self._bind(E + ("model_path",), self.path, lambda: self.path.text().strip() or None,
                   lambda v: self.path.setText(v or ""), self.path.editingFinished, False)
        self._bind(E + ("cache", "folder"), self.cache_folder,
                   lambda: self.cache_folder.text().strip() or None,
                   lambda v: self.cache_folder.setText(v or ""), self.cache_folder.editingFinished,
                   False)
        self._bind(E + ("kv_debug_log",), self.kv_debug_log, self.kv_debug_log.isChecked,
                   self.kv_debug_log.setChecked, self.kv_debug_log.toggled, False)

    def _bind(self, path: OptionPath, widget, read, show, changed, merge: bool) -> None:
        b = Binding(path, widget, read, show, merge)
        self.bindings[path] = b
        changed.connect(lambda *_a: self.edits.set_option(
            path, b.read(), merge=b.merge, text=f"set {path[-1]}"))

    def commit_text(self) -> None:
        """Text being typed (the model file, the cache folder) reaches the session now."""
        for w in (self.path, self.cache_folder):
            b = next(b for b in self.bindings.values() if b.widget is w)
            self.edits.set_option(b.path, b.read(), text=f"set {b.path[-1]}")

    def show_options(self, options: Options) -> None:
        """The session's values in the controls; shown values are not written back."""
        for b in self.bindings.values():
            value = option_at(options, b.path)
            if b.read() != value:
                was = b.widget.blockSignals(True)
                try:
                    b.show(value)
                finally:
                    b.widget.blockSignals(was)
        self._show_recent()

    # ---- layout
    def _lay_out(self, browse: QPushButton) -> None:
        basic = QFormLayout()
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        basic.addRow("Model file (-m)", row)
        basic.addRow("", self.recent)
        basic.addRow("Context (-c)", self.n_ctx)
        basic.addRow("GPU layers (-ngl)", self.ngl)
        kv = QHBoxLayout()
        for text, box in (("K", self.type_k), ("V", self.type_v)):
            kv.addWidget(QLabel(text))
            kv.addWidget(box)
        basic.addRow("KV types", kv)
        self.flash_row = QHBoxLayout()  # the Model dock adds its Measure again button here
        self.flash_row.addWidget(self.flash_attn, 1)
        basic.addRow("Flash attention (-fa)", self.flash_row)

        self.advanced = QGroupBox("Advanced")
        self.advanced.setObjectName("engineAdvanced")
        adv = QFormLayout(self.advanced)
        adv.addRow("Generation threads (-t)", self.threads_gen)
        adv.addRow("Batch threads (-tb)", self.threads)
        adv.addRow("Batch size (-b)", self.batch)
        adv.addRow("Micro-batch size (-ub)", self.ubatch)
        adv.addRow("Sequences", self.n_seq_max)
        adv.addRow("Cache: in context", self.cache_resident)
        adv.addRow("Cache: in memory", self.cache_ram)
        adv.addRow("Cache: in files", self.cache_file)
        adv.addRow("Cache files in", self.cache_folder)
        adv.addRow("", self.kv_debug_log)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(basic)
        lay.addWidget(self.advanced)

    # ---- the model file
    def set_recent(self, entries: list[tuple[str, str]]) -> None:
        """(name, path) of each model in the drop-down; path "" is the default model."""
        self.recent.clear()
        for name, path in entries:
            self.recent.addItem(name, path)
            self.recent.setItemData(self.recent.count() - 1, path or name, Qt.ToolTipRole)
        self._show_recent()

    def _show_recent(self) -> None:
        """The drop-down shows the model the settings name, when it lists it."""
        self.recent.setCurrentIndex(self.recent.findData(self.session.options.engine.model_path
                                                         or ""))

    def open_dialog(self) -> None:
        # the model's own folder, else Documents: never the folder the app was started from
        start = str(Path(self.path.text()).parent) if self.path.text() else str(documents_dir())
        path, _ = QFileDialog.getOpenFileName(self, "Open model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.edits.set_engine("model_path", path)
            self.file_chosen.emit(path)

    def show_gpu_offload(self, known: bool, supported: bool = False) -> None:
        self.ngl.setEnabled(known and supported)
        self.ngl.setToolTip(NGL_UNKNOWN if not known else NGL_TIP if supported
                            else GPU_OFFLOAD_MISSING)
