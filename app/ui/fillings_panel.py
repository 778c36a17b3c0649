"""Fillings: a form generated from the template's placeholders and a table of rows.

The form edits the current row of the table. Rows come from CSV/JSONL files (read and checked
by app.engine.rows), from the clipboard (tab-separated, as spreadsheets copy), or by hand.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QFormLayout, QHBoxLayout, QHeaderView,
                               QLabel, QPlainTextEdit, QPushButton, QSplitter, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget, QScrollArea)

from ..engine import KvPrimerError, read_rows
from ..engine.rows import Row


class FillingsPanel(QWidget):
    modified = Signal()
    error = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.placeholders: list[str] = []
        self.fields: dict[str, QPlainTextEdit] = {}
        self._syncing = False

        self.form_box = QWidget()
        self.form = QFormLayout(self.form_box)
        self.form.setFieldGrowthPolicy(QFormLayout.ExpandingFieldsGrow)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form_box)

        self.table = QTableWidget(0, 0)
        self.table.setObjectName("rowsTable")
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.itemSelectionChanged.connect(self._load_form)
        self.table.itemChanged.connect(self._cell_changed)
        QShortcut(QKeySequence.Paste, self.table, self.paste, context=Qt.WidgetShortcut)

        buttons = QHBoxLayout()
        for text, slot, tip in (("Import…", self.import_dialog, "Import rows from CSV or JSONL"),
                                ("Add", self.add_row, "Add an empty row"),
                                ("Duplicate", self.duplicate_rows, "Duplicate the selected rows"),
                                ("Delete", self.delete_rows, "Delete the selected rows"),
                                ("Paste", self.paste, "Paste rows copied from a spreadsheet")):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            buttons.addWidget(b)
        buttons.addStretch(1)
        self.count_label = QLabel("")
        buttons.addWidget(self.count_label)

        table_box = QWidget()
        tl = QVBoxLayout(table_box)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addLayout(buttons)
        tl.addWidget(self.table, 1)
        split = QSplitter(Qt.Vertical)
        split.addWidget(scroll)
        split.addWidget(table_box)
        split.setSizes([160, 200])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)

    # ---- structure
    def set_placeholders(self, names: list[str]) -> None:
        if names == self.placeholders:
            return
        rows = self.rows()
        self.placeholders = list(names)
        while self.form.rowCount():
            self.form.removeRow(0)
        self.fields = {}
        for n in names:
            f = QPlainTextEdit()
            f.setObjectName(f"field_{n}")
            f.setTabChangesFocus(True)
            f.setFixedHeight(48)
            f.textChanged.connect(lambda n=n: self._field_changed(n))
            self.fields[n] = f
            self.form.addRow(f"<{n}>", f)
        if not names:
            self.form.addRow(QLabel("The template has no placeholders."))
        self.set_rows(rows)

    def rows(self) -> list[dict[str, str]]:
        out = []
        for r in range(self.table.rowCount()):
            out.append({n: (self.table.item(r, c).text() if self.table.item(r, c) else "")
                        for c, n in enumerate(self.placeholders)})
        return out

    def set_rows(self, rows: list[dict[str, str]]) -> None:
        self._syncing = True
        try:
            self.table.clear()
            self.table.setColumnCount(len(self.placeholders))
            self.table.setHorizontalHeaderLabels(self.placeholders)
            self.table.setRowCount(0)
            for values in rows:
                self._append(values)
        finally:
            self._syncing = False
        if rows:
            self.table.selectRow(0)
        self._load_form()
        self._count()

    def _append(self, values: dict[str, str]) -> int:
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, n in enumerate(self.placeholders):
            self.table.setItem(r, c, QTableWidgetItem(str(values.get(n, ""))))
        return r

    def _count(self) -> None:
        self.count_label.setText(f"{self.table.rowCount()} rows")

    # ---- selection
    def selected_indexes(self) -> list[int]:
        return sorted({i.row() for i in self.table.selectionModel().selectedRows()})

    def selected_rows(self) -> list[Row]:
        """Selected rows (or the current one), numbered as the table shows them (from 1)."""
        idx = self.selected_indexes()
        if not idx and self.table.currentRow() >= 0:
            idx = [self.table.currentRow()]
        rows = self.rows()
        return [Row(i + 1, rows[i]) for i in idx]

    def all_rows(self) -> list[Row]:
        return [Row(i + 1, v) for i, v in enumerate(self.rows())]

    # ---- editing
    def add_row(self, values: dict[str, str] | None = None) -> None:
        r = self._append(values or {})
        self.table.selectRow(r)
        self._changed()

    def duplicate_rows(self) -> None:
        rows = self.rows()
        for i in self.selected_indexes():
            self._append(rows[i])
        self._changed()

    def delete_rows(self) -> None:
        for i in reversed(self.selected_indexes()):
            self.table.removeRow(i)
        self._changed()

    def paste(self, text: str | None = None) -> int:
        """Rows of tab-separated cells; a first line naming the placeholders is a header."""
        text = QGuiApplication.clipboard().text() if text is None else text
        lines = [ln for ln in text.replace("\r\n", "\n").split("\n") if ln.strip()]
        if lines and [c.strip() for c in lines[0].split("\t")] == self.placeholders:
            lines = lines[1:]
        for ln in lines:
            cells = ln.split("\t")
            self._append(dict(zip(self.placeholders, cells)))
        if lines:
            self.table.selectRow(self.table.rowCount() - 1)
            self._changed()
        return len(lines)

    def import_file(self, path: str) -> int:
        try:
            rows = read_rows(path, self.placeholders)
        except KvPrimerError as e:
            self.error.emit(str(e))
            return 0
        self.set_rows([r.values for r in rows])
        self.modified.emit()
        return len(rows)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import rows", "",
                                              "Rows (*.csv *.tsv *.jsonl *.ndjson);;All files (*)")
        if path:
            self.import_file(path)

    def _changed(self) -> None:
        self._count()
        self.modified.emit()

    # ---- form <-> table
    def _load_form(self) -> None:
        if self._syncing:
            return
        r = self.table.currentRow()
        self._syncing = True
        try:
            for c, n in enumerate(self.placeholders):
                item = self.table.item(r, c) if r >= 0 else None
                self.fields[n].setPlainText(item.text() if item else "")
        finally:
            self._syncing = False

    def _field_changed(self, name: str) -> None:
        if self._syncing:
            return
        if self.table.rowCount() == 0:  # typing into an empty table starts its first row
            self._syncing = True
            try:
                self._append({n: f.toPlainText() for n, f in self.fields.items()})
                self.table.selectRow(0)
            finally:
                self._syncing = False
            self._changed()
            return
        r = max(self.table.currentRow(), 0)
        c = self.placeholders.index(name)
        self._syncing = True
        try:
            self.table.setItem(r, c, QTableWidgetItem(self.fields[name].toPlainText()))
        finally:
            self._syncing = False
        self.modified.emit()

    def _cell_changed(self, item: QTableWidgetItem) -> None:
        if self._syncing:
            return
        if item.row() == self.table.currentRow():
            self._load_form()
        self.modified.emit()
