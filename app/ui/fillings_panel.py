"""Fillings: a form generated from the template's placeholders over a table of the session's rows.

The form edits the current row. Rows come from CSV/JSONL files (read and checked by
app.engine.prompts.rows), from the clipboard (parsed there too: tab- or comma-separated, quoted),
or by hand. The session holds the rows and the selection; this panel shows them and writes the
user's edits back through SessionEdits, so each can be undone.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QItemSelection, QItemSelectionModel, QSettings, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QAbstractItemView, QFormLayout, QHBoxLayout,
                               QHeaderView, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSplitter, QTableView, QVBoxLayout, QWidget)

from ..engine import KvPrimerError, read_rows
from ..engine.prompts.rows import parse_pasted
from ..engine.session import RowsChange, Session
from .file_folders import FileFolders
from .rows_model import RowsModel
from .session_edits import SessionEdits


class FillingsPanel(QWidget):
    error = Signal(str)

    def __init__(self, session: Session, edits: SessionEdits | None = None,
                 parent: QWidget | None = None, folders: FileFolders | None = None):
        super().__init__(parent)
        self.session = session
        self.edits = edits or SessionEdits(session, self)
        self.folders = folders or FileFolders(QSettings("kvprimer", "KV Primer"))
        self.placeholders: list[str] = []
        self.fields: dict[str, QPlainTextEdit] = {}
        self._syncing = False

        self.form_box = QWidget()
        self.form = QFormLayout(self.form_box)
        self.form.setFieldGrowthPolicy(QFormLayout.ExpandingFieldsGrow)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form_box)

        self.model = RowsModel(session, self.edits, self)
        self.table = QTableView()
        self.table.setObjectName("rowsTable")
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.selectionModel().selectionChanged.connect(self._view_selection_changed)
        self.table.selectionModel().currentRowChanged.connect(self._view_selection_changed)
        QShortcut(QKeySequence.Paste, self.table, self.paste, context=Qt.WidgetShortcut)

        buttons = QHBoxLayout()
        for text, slot, tip in (("Import…", self.import_dialog, "Import rows from CSV or JSONL"),
                                ("Add", self.add_row, "Add an empty row"),
                                ("Duplicate", self.duplicate_rows, "Duplicate the selected rows"),
                                ("Delete", self.delete_rows, "Delete the selected rows"),
                                ("Paste", self.paste, "Paste rows copied from a spreadsheet")):
            b = QPushButton(text)
            b.setObjectName("rows" + text.rstrip("…"))
            b.setToolTip(tip)
            b.clicked.connect(lambda _=False, slot=slot: slot())
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
        split.setSizes([130, 230])  # the rows table gets the more: 5 rows on a short screen
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)

        session.events.rows.connect(self._rows_changed)
        session.events.selection.connect(self._show_selection)
        self._rows_changed(RowsChange("reset"))

    # ---- the session changed
    def _rows_changed(self, change: RowsChange) -> None:
        if change.kind == "values":
            if change.row == self.session.current:
                self._load_form(change.name)
            return
        if self.session.placeholders != self.placeholders:
            self._build_form(self.session.placeholders)
        self.count_label.setText(f"{self.session.row_count} rows")
        self._show_selection()

    def _build_form(self, names: list[str]) -> None:
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

    def _show_selection(self) -> None:
        """Select in the view what the session has selected, and load the form."""
        s = self.session
        self._syncing = True
        try:
            sm = self.table.selectionModel()
            sel = QItemSelection()
            last = max(self.model.columnCount() - 1, 0)
            for r in s.selection:
                sel.select(self.model.index(r, 0), self.model.index(r, last))
            sm.select(sel, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
            if s.current >= 0:
                sm.setCurrentIndex(self.model.index(s.current, 0), QItemSelectionModel.NoUpdate)
        finally:
            self._syncing = False
        self._load_form()

    def _load_form(self, only: str | None = None) -> None:
        s = self.session
        self._syncing = True
        try:
            for n, f in self.fields.items():
                if only is not None and n != only:
                    continue
                text = s.value(s.current, n) if 0 <= s.current < s.row_count else ""
                if f.toPlainText() != text:
                    f.setPlainText(text)
        finally:
            self._syncing = False

    # ---- the user changed something
    def _view_selection_changed(self, *_args) -> None:
        if self._syncing:
            return
        rows = sorted({i.row() for i in self.table.selectionModel().selectedRows()})
        self.session.set_selection(rows, self.table.currentIndex().row())

    def _field_changed(self, name: str) -> None:
        if self._syncing:
            return
        s = self.session
        if s.row_count == 0:  # typing into an empty table starts its first row
            self.edits.add_rows([{n: f.toPlainText() for n, f in self.fields.items()}], "add a row")
            return
        self.edits.set_value(max(s.current, 0), name, self.fields[name].toPlainText(), merge=True)

    # ---- editing
    def add_row(self, values: dict[str, str] | None = None) -> None:
        self.edits.add_rows([values or {}], "add a row")

    def duplicate_rows(self) -> None:
        s = self.session
        self.edits.add_rows([s.row_values(i) for i in s.selection], "duplicate rows")

    def delete_rows(self) -> None:
        self.edits.remove_rows(self.session.selection)

    def paste(self, text: str | None = None) -> int:
        """Rows from the clipboard, parsed by rows.parse_pasted (tab- or comma-separated,
        quoted, with or without a header); a bad paste says why and changes nothing."""
        text = QGuiApplication.clipboard().text() if text is None else text
        try:
            rows = parse_pasted(text, self.session.placeholders)
        except KvPrimerError as e:
            self.error.emit(str(e))
            return 0
        self.edits.add_rows([r.values for r in rows], "paste rows")
        return len(rows)

    def import_file(self, path: str, undoable: bool = True) -> int:
        """``undoable=False``: part of opening something new (an example), not an edit."""
        try:
            rows = read_rows(path, self.session.placeholders)
        except KvPrimerError as e:
            self.error.emit(str(e))
            return 0
        values = [r.values for r in rows]
        if undoable:  # the rows it replaces come back with Undo
            self.edits.replace_rows(values, f"import rows from {Path(path).name}")
        else:
            self.session.set_rows(values)
        return len(rows)

    def import_dialog(self) -> None:
        path = self.folders.open_file(self, "rows", "Import rows",
                                      "Rows (*.csv *.tsv *.jsonl *.ndjson);;All files (*)")
        if path:
            self.import_file(path)
