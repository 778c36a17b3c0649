"""The window's small dialogs: keyboard shortcuts, About, and the yes/no/save questions."""
from __future__ import annotations

from PySide6.QtWidgets import (QDialog, QHeaderView, QMessageBox, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from ..versions import version_text


def show_shortcuts(parent: QWidget, rows: list[tuple[str, str]]) -> QDialog:
    dlg = QDialog(parent)
    dlg.setWindowTitle("Keyboard shortcuts")
    t = QTableWidget(len(rows), 2, dlg)
    t.setHorizontalHeaderLabels(["Action", "Shortcut"])
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
    t.setEditTriggers(QTableWidget.NoEditTriggers)
    for i, (name, keys) in enumerate(rows):
        t.setItem(i, 0, QTableWidgetItem(name))
        t.setItem(i, 1, QTableWidgetItem(keys))
    QVBoxLayout(dlg).addWidget(t)
    dlg.resize(420, 520)
    dlg.show()
    parent.shortcuts_dialog = dlg  # kept alive while shown
    return dlg


def show_about(parent: QWidget) -> None:
    QMessageBox.about(parent, "About KV Primer",
                      "<b>KV Primer</b><br>Build and test cached prompts on local llama.cpp "
                      "models.<br><br>" + version_text().replace("\n", "<br>"))


def ask_dialog(parent: QWidget, kind: str, text: str) -> str:
    """"save" | "discard" | "cancel" for unsaved changes; "auto" | "on" | "off" | "cancel" for
    the kernel a llama.cpp state file is written for ("for_fa"); "yes" | "no" otherwise."""
    if kind == "for_fa":
        from .states_library import ask_for_fa
        return ask_for_fa(parent, text) or "cancel"
    if kind == "unsaved":
        r = QMessageBox.question(parent, "Unsaved changes", text,
                                 QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel)
        return {QMessageBox.Save: "save", QMessageBox.Discard: "discard"}.get(r, "cancel")
    r = QMessageBox.question(parent, "KV Primer", text)
    return "yes" if r == QMessageBox.Yes else "no"
