"""The session's rows as a Qt table model: one column per placeholder, editable in place.

The session holds the rows; this model only presents them. Cell edits go to the session as
undoable edits, and the session's row events come back as model resets (rows or columns
changed) or dataChanged (one value), so every view of the rows shows the same data.
"""
from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, Qt

from ..engine.session import RowsChange, Session
from .session_edits import SessionEdits


class RowsModel(QAbstractTableModel):
    def __init__(self, session: Session, edits: SessionEdits | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.session = session
        self.edits = edits or SessionEdits(session, self)
        session.events.rows.connect(self._rows_changed)

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else self.session.row_count

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.session.placeholders)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or role not in (Qt.DisplayRole, Qt.EditRole, Qt.ToolTipRole):
            return None
        text = self.session.value(index.row(), self.session.placeholders[index.column()])
        if role == Qt.DisplayRole:
            return " ".join(text.split())  # one line per row in the table; the form shows it all
        return text

    def setData(self, index: QModelIndex, value, role: int = Qt.EditRole) -> bool:
        if not index.isValid() or role != Qt.EditRole:
            return False
        self.edits.set_value(index.row(), self.session.placeholders[index.column()], str(value))
        return True

    def flags(self, index: QModelIndex) -> Qt.ItemFlags:
        if not index.isValid():
            return Qt.NoItemFlags
        return Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsEditable

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):
        if role != Qt.DisplayRole:
            return None
        if orientation == Qt.Horizontal:
            names = self.session.placeholders
            return f"<{names[section]}>" if section < len(names) else None
        return str(section + 1)

    def _rows_changed(self, change: RowsChange) -> None:
        if change.kind == "values":
            col = self.session.placeholders.index(change.name) if change.name in \
                self.session.placeholders else -1
            if col >= 0:
                i = self.index(change.row, col)
                self.dataChanged.emit(i, i)
            return
        self.beginResetModel()
        self.endResetModel()
