"""The States library: the saved states in one folder, with what each one holds: KV Primer's
.kvstate files and llama.cpp's sequence-state files (.bin, told apart by content).

Listing reads only each file's header and metadata (a few KB), never the KV data, so a folder
of 30 MB states lists at once. A llama.cpp file names no model: the list says so. Loading is
the engine's job (it checks checksum, model and KV types, or for a llama.cpp file what can be
checked); its one-line reason is shown here when it refuses, and its warning when it loads.
"""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QDockWidget, QHeaderView, QInputDialog,
                               QLabel, QMessageBox, QPushButton, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from ..engine.states.llama_state_file import SUFFIX as LLAMA_SUFFIX
from ..engine.states.llama_state_file import state_file_info
from ..engine.states.prefix_state import SUFFIX
from .byte_sizes import size_text
from .narrow_widgets import FlowRow

LLAMA_MODEL = "llama.cpp state (names no model)"

COLUMNS = ["name", "model", "tokens", "size", "created", "template"]


class StatesLibrary(QDockWidget):
    load_requested = Signal(str)
    save_requested = Signal()

    def __init__(self, folder: Path, parent: QWidget | None = None, confirm=None):
        super().__init__("States library", parent)
        self.setObjectName("statesDock")
        self.folder = Path(folder)
        # asks yes/no before deleting; tests pass a function instead of the modal box
        self.confirm = confirm or (lambda text: QMessageBox.question(self, "Delete state", text)
                                   == QMessageBox.Yes)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("statesTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.doubleClicked.connect(lambda _i: self.load_selected())
        self.message = QLabel("")
        self.message.setObjectName("statesMessage")
        self.message.setWordWrap(True)
        buttons = FlowRow()  # onto a second line in a narrow dock, every button whole
        self.buttons: dict[str, QPushButton] = {}
        for text, slot in (("Save current…", self.save_requested.emit), ("Load", self.load_selected),
                           ("Rename…", self.rename_selected), ("Delete", self.delete_selected),
                           ("Show in folder", self.show_in_folder), ("Refresh", self.refresh)):
            b = QPushButton(text)
            b.clicked.connect(lambda _=False, slot=slot: slot())
            buttons.addWidget(b)
            self.buttons[text] = b
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(buttons)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.message)
        self.setWidget(body)
        self.paths: list[Path] = []
        self.refresh()

    # ---- listing
    def refresh(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        found = list(self.folder.glob(f"*{SUFFIX}")) + [
            p for p in self.folder.glob(f"*{LLAMA_SUFFIX}") if state_file_info(p).format]
        self.paths = sorted(found, key=lambda p: -p.stat().st_mtime)
        self.table.setRowCount(len(self.paths))
        for r, p in enumerate(self.paths):
            m = state_file_info(p)
            model = LLAMA_MODEL if m.format == "llama.cpp" else m.model_name or m.error or "?"
            cells = [p.stem, model, f"{m.n_tokens:,}" if m.n_tokens is not None else "?",
                     size_text(p.stat().st_size),
                     dt.datetime.fromtimestamp(m.created).strftime("%Y-%m-%d %H:%M")
                     if m.created is not None else "?", m.text[:60]]
            for c, v in enumerate(cells):
                item = QTableWidgetItem(v)
                item.setToolTip(str(p))
                self.table.setItem(r, c, item)

    def selected_path(self) -> Path | None:
        r = self.table.currentRow()
        return self.paths[r] if 0 <= r < len(self.paths) else None

    def select(self, path: Path) -> None:
        path = Path(path)
        if path in self.paths:
            self.table.selectRow(self.paths.index(path))

    def set_can(self, load: bool, save: bool) -> None:
        """Loading needs a model and an idle worker; saving also a primed state."""
        self.buttons["Load"].setEnabled(load)
        self.buttons["Save current…"].setEnabled(save)

    # ---- outcomes of the window's state jobs
    def on_saved(self, path: str, size: int) -> None:
        self.refresh()
        self.select(Path(path))
        self.show_message(f"saved {Path(path).name} ({size / 1e6:,.1f} MB)")

    def on_loaded(self, path: str, state) -> None:
        text = (f"loaded {Path(path).name}: {state.n_tokens:,} tokens, now in the radix cache "
                "(runs of a template with this prefix fork it)")
        if state.warning:
            self.show_message(f"{text}. Note: {state.warning}", warning=True)
        else:
            self.show_message(text)

    def on_load_failed(self, message: str) -> None:
        self.show_message(message, error=True)

    # ---- actions
    def show_message(self, text: str, error: bool = False, warning: bool = False) -> None:
        color = "#c62828" if error else "#b26a00" if warning else "#2e7d32"
        self.message.setStyleSheet(f"color: {color};")
        self.message.setText(text)

    def load_selected(self) -> None:
        p = self.selected_path()
        if p:
            self.load_requested.emit(str(p))

    def rename_selected(self, new_name: str | None = None) -> Path | None:
        p = self.selected_path()
        if p is None:
            return None
        if not isinstance(new_name, str):
            new_name, ok = QInputDialog.getText(self, "Rename state", "New name:", text=p.stem)
            if not ok:
                return None
        new_name = new_name.strip().removesuffix(p.suffix)
        if not new_name or "/" in new_name or os.sep in new_name:
            self.show_message("a state name cannot be empty or contain a slash", error=True)
            return None
        target = p.with_name(new_name + p.suffix)
        if target.exists():
            self.show_message(f"{target.name} already exists; choose another name", error=True)
            return None
        try:
            p.rename(target)
        except OSError as e:
            self.show_message(f"cannot rename {p.name}: {e.strerror}", error=True)
            return None
        self.refresh()
        self.select(target)
        return target

    def delete_selected(self) -> None:
        p = self.selected_path()
        if p and self.confirm(f"Delete {p.name}? This cannot be undone."):
            try:
                p.unlink()
            except OSError as e:
                self.show_message(f"cannot delete {p.name}: {e.strerror}", error=True)
            self.refresh()

    def show_in_folder(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.folder)))


# the choices of `prime --format llama --for-fa`, as the save dialog offers them
FOR_FA_CHOICES = (("auto", "auto: llama.cpp's own default (llama-server's -fa auto; on, on CPUs)"),
                  ("on", "on: a context with flash attention on"),
                  ("off", "off: a context without it (llama-cpp-python's Llama() default)"))


FOR_FA_QUESTION = "Flash attention in the context that will load the file:"


def ask_for_fa(parent: QWidget | None = None, question: str = FOR_FA_QUESTION) -> str | None:
    """Which attention kernel the context that will read a llama.cpp state file runs (its V
    is laid out for that kernel): "auto", "on" or "off"; None when cancelled."""
    labels = [label for _, label in FOR_FA_CHOICES]
    text, ok = QInputDialog.getItem(parent, "Save state for llama.cpp", question, labels, 0,
                                    False)
    if not ok:
        return None
    return FOR_FA_CHOICES[labels.index(text)][0]
