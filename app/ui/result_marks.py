"""Results marked as from an earlier template, model or settings.

Runs and benchmarks stay on screen when the template is edited or another model is loaded:
they are kept for comparison, not blanked. Each carries its origin (ResultOrigin); this note
says, above the results, which ones came from what, and their rows are greyed, so that they
are never read as results of what is shown now.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QLabel, QTableWidget, QWidget

from ..engine.runs.result_origin import ResultOrigin, earlier_text

OWN_ROLE = Qt.UserRole + 41  # an item's own (colour, tooltip), while it is greyed
EARLIER = QColor("#8a8a8a")  # the text of a result from an earlier template or model
NOTE_COLOR = "#a05a00"


def changes(origins: list[ResultOrigin | None], now: ResultOrigin) -> list[list[str]]:
    """Per result, what changed since it was made ([] when nothing did, or when it has no
    origin: a project saved before results had one)."""
    return [o.changed(now) if o is not None else [] for o in origins]


class EarlierNote(QLabel):
    """The line above results that says which are from an earlier template, model or settings;
    hidden when none are. ``unit``: what a result is ("run", "benchmark")."""

    def __init__(self, unit: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.unit = unit
        self.setObjectName(f"earlier_{unit}")
        self.setWordWrap(True)
        self.setStyleSheet(f"color: {NOTE_COLOR}")
        self.hide()

    def show_for(self, origins: list[ResultOrigin | None], now: ResultOrigin) -> list[list[str]]:
        """Say what changed for the latest of ``origins`` that changed; return each one's
        changes (for greying its rows)."""
        changed = changes(origins, now)
        earlier = [(o, c) for o, c in zip(origins, changed) if c]
        if not earlier:
            self.setText("")
            self.hide()
            return changed
        origin, what = earlier[-1]
        if len(origins) == 1:
            head = f"This {self.unit} is"
        elif len(earlier) == len(origins):
            head = f"These {len(origins)} {self.unit}s are"
        else:
            head = f"{len(earlier)} of these {len(origins)} {self.unit}s are"
        self.setText(f"⚠ {head} {earlier_text(what, origin)}: kept for comparison"
                     f"{', greyed' if len(origins) > 1 else ''}; run again for results of "
                     f"the {' and '.join(what)} shown now.")
        self.setToolTip(f"Made with template {origin.template}, model {origin.model or '?'}"
                        f" ({origin.settings or 'settings unknown'})")
        self.show()
        return changed


def grey_rows(table: QTableWidget, rows_changed: list[list[str]],
              origins: list[ResultOrigin | None]) -> None:
    """Grey the table's rows whose result is from an earlier template, model or settings, and
    say so in their tooltips; give the others their own colour and tooltip back (a coloured
    verdict keeps its colour)."""
    for r, what in enumerate(rows_changed[:table.rowCount()]):
        for c in range(table.columnCount()):
            item = table.item(r, c)
            if item is None:
                continue
            if item.data(OWN_ROLE) is None:  # its own colour and tooltip, kept to give back
                brush = item.foreground()
                item.setData(OWN_ROLE, (brush.color().name() if brush.style() else "",
                                        item.toolTip()))
            colour, tip = item.data(OWN_ROLE)
            if what:
                item.setForeground(QBrush(EARLIER))
                item.setToolTip(f"{earlier_text(what, origins[r])}\n{tip}".strip())
            else:
                item.setForeground(QBrush(QColor(colour)) if colour else QBrush())
                item.setToolTip(tip)
