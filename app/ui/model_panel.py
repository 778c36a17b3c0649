"""The Model dock: which GGUF, the context settings, GPU offload, and the loaded model's facts,
with what its architecture means for caching.

Apply emits the new EngineConfig; the main window reloads the engine as a worker job.
"""
from __future__ import annotations

from dataclasses import replace
from html import escape
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDockWidget, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QScrollArea, QSpinBox,
                               QVBoxLayout, QWidget)

from .units import size_text
from ..engine import EngineConfig, ModelInfo
from ..engine.llama.ggml_types import KV_TYPES as GGML_KV_TYPES
from ..engine.llama.native import GPU_OFFLOAD_MISSING

NGL_UNKNOWN = "Layers offloaded to the GPU (llama.cpp's -ngl): known once a model is loaded"
NGL_TIP = "Layers offloaded to the GPU (llama.cpp's -ngl); -1: all, 0: none"

KV_TYPES = ["f16", *(t for t in GGML_KV_TYPES if t != "f16")]  # the default first
FLASH_ATTN_CHOICES = (("auto", "auto (the faster, measured)"), ("on", "on"), ("off", "off"))


class ModelPanel(QDockWidget):
    apply_requested = Signal(object)  # EngineConfig

    def __init__(self, config: EngineConfig, parent: QWidget | None = None):
        super().__init__("Model", parent)
        self.setObjectName("modelDock")
        self.config = config
        self.path = QLineEdit(config.model_path or "")
        self.path.setPlaceholderText("default model (SmolLM2-135M-Instruct)")
        browse = QPushButton("Open…")
        browse.clicked.connect(self.open_dialog)
        self.recent = QComboBox()
        self.recent.setPlaceholderText("recent models")
        self.recent.activated.connect(lambda i: self.path.setText(self.recent.itemData(i) or ""))
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)

        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(64, 1 << 17)
        self.n_ctx.setSingleStep(512)
        self.threads = QSpinBox()
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("auto")
        self.batch = QSpinBox()
        self.batch.setRange(1, 8192)
        self.ngl = QSpinBox()
        self.ngl.setObjectName("nGpuLayers")
        self.ngl.setRange(-1, 999)
        self.ngl.setSpecialValueText("all (-1)")
        # whether the build can offload comes with the model's facts, from the worker thread
        self.ngl.setEnabled(False)
        self.ngl.setToolTip(NGL_UNKNOWN)
        self.type_k, self.type_v = QComboBox(), QComboBox()
        for c in (self.type_k, self.type_v):
            c.addItems(KV_TYPES)
        self.flash_attn = QComboBox()
        self.flash_attn.setObjectName("flashAttn")
        for value, text in FLASH_ATTN_CHOICES:
            self.flash_attn.addItem(text, value)
        self.flash_attn.setToolTip("llama.cpp's attention kernel; auto times both on this model "
                                   "once and keeps the faster (the times show below)")
        self.remeasure = QPushButton("Measure again")
        self.remeasure.setObjectName("remeasureKernels")
        self.remeasure.setToolTip("Time both attention kernels again and reload")
        self.remeasure.clicked.connect(lambda: self.apply_requested.emit(
            replace(self.current_config(), flash_attn="auto", remeasure_kernels=True)))
        self.apply = QPushButton("Apply (reload)")
        self.apply.setObjectName("applyModel")
        self.apply.clicked.connect(lambda: self.apply_requested.emit(self.current_config()))

        settings = QFormLayout()
        settings.addRow("Model file", row)
        settings.addRow("", self.recent)
        settings.addRow("Context (n_ctx)", self.n_ctx)
        settings.addRow("Threads", self.threads)
        settings.addRow("Batch", self.batch)
        settings.addRow("GPU layers (-ngl)", self.ngl)
        kv = QHBoxLayout()
        kv.addWidget(QLabel("K"))
        kv.addWidget(self.type_k)
        kv.addWidget(QLabel("V"))
        kv.addWidget(self.type_v)
        settings.addRow("KV types", kv)
        fa = QHBoxLayout()
        fa.addWidget(self.flash_attn, 1)
        fa.addWidget(self.remeasure)
        settings.addRow("Flash attention", fa)
        settings.addRow("", self.apply)

        self.facts = QFormLayout()
        self.fact_labels: dict[str, QLabel] = {}
        for key in ("name", "architecture", "layers", "heads", "parameters", "file", "kv per token",
                    "context", "batch", "attention", "cpu kernels"):
            lab = QLabel("—")
            lab.setWordWrap(True)
            self.fact_labels[key] = lab
            self.facts.addRow("CPU kernels" if key == "cpu kernels" else key.capitalize(), lab)
        self.fact_labels["attention"].setObjectName("attentionKernel")
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
        lay.addLayout(settings)
        lay.addWidget(facts_box)
        lay.addWidget(notes_box)
        lay.addStretch(1)
        # scrolls rather than forcing its height on the window: it shares the side with the KV dock
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        scroll.setWidget(body)
        self.setWidget(scroll)
        self.set_config(config)

    def set_config(self, c: EngineConfig) -> None:
        self.config = c
        self.path.setText(c.model_path or "")
        self.n_ctx.setValue(c.n_ctx)
        self.threads.setValue(c.n_threads)
        self.batch.setValue(c.n_batch)
        self.ngl.setValue(c.n_gpu_layers)
        self.type_k.setCurrentText(c.type_k)
        self.type_v.setCurrentText(c.type_v)
        self.flash_attn.setCurrentIndex(max(self.flash_attn.findData(c.flash_attn), 0))

    def current_config(self) -> EngineConfig:
        return replace(self.config, model_path=self.path.text().strip() or None,
                       n_ctx=self.n_ctx.value(), n_threads=self.threads.value(),
                       n_batch=self.batch.value(), n_gpu_layers=self.ngl.value(),
                       type_k=self.type_k.currentText(),
                       type_v=self.type_v.currentText(),
                       flash_attn=self.flash_attn.currentData(), remeasure_kernels=False)

    def set_recent(self, paths: list[str]) -> None:
        self.recent.clear()
        for p in paths:
            self.recent.addItem(Path(p).name, p)
        self.recent.setCurrentIndex(-1)

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open model", str(Path(self.path.text()).parent),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.path.setText(path)
            self.apply_requested.emit(self.current_config())

    def show_info(self, info: ModelInfo | None) -> None:
        f = self.fact_labels
        if info is None:
            for lab in f.values():
                lab.setText("—")
            self.notes.setText("—")
            return
        self.ngl.setEnabled(info.gpu_offload)
        self.ngl.setToolTip(NGL_TIP if info.gpu_offload else GPU_OFFLOAD_MISSING)
        f["name"].setText(info.name or Path(info.path).name)
        f["architecture"].setText(info.architecture)
        f["layers"].setText(str(info.n_layer))
        f["heads"].setText(f"{info.n_head} (KV {info.n_head_kv}) × {info.n_embd // max(info.n_head, 1)}")
        f["parameters"].setText(f"{info.n_params / 1e6:,.1f} M")
        f["file"].setText(f"{Path(info.path).name} · {size_text(info.file_bytes)}")
        f["kv per token"].setText(f"{info.kv_bytes_per_token:,} bytes ({info.type_k}/{info.type_v})")
        f["context"].setText(f"{info.n_ctx:,} tokens (trained {info.n_ctx_train:,}) · "
                             f"full KV {size_text(info.n_ctx * info.kv_bytes_per_token)}")
        f["batch"].setText(f"batch {info.n_batch}, {info.n_seq_max} sequences")
        # flash attention on or off: the measured choice and the times behind it
        a = info.kernels
        f["attention"].setText(a.describe() if a else "—")
        # AMX / repacked weights: what llama.cpp runs this model with, why, and the crash check
        k = info.cpu_kernels
        f["cpu kernels"].setText(f"{k.summary()}\n{k.reason}\nCrash check: {k.probe}" if k else "—")
        self.notes.setText("".join(f"• {escape(n)}<br>" for n in info.traits.notes()).removesuffix("<br>"))
