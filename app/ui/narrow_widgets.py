"""Widgets that give up width instead of widening the window: a label that elides its text
(the whole text in its tooltip) and a row of controls that wraps onto more lines.

A QLabel's minimum width is its whole text, and a QHBoxLayout's the sum of its widgets': a long
model name in the status bar or a row of options above the results could make Qt widen the
window past a 1366-pixel screen. These keep their preferred size when there is room and shrink
(eliding, wrapping) when there is not; nothing is hidden without a way to read it.
"""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLabel, QLayout, QLayoutItem, QSizePolicy, QWidget

ELIDED_MIN_CHARS = 8  # an elided label keeps room for this many characters (and the "…")


class ElidedLabel(QLabel):
    """One line that ends in "…" when it is narrower than its text; the tooltip holds the whole
    text. ``text()`` is the whole text, as a QLabel's would be."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)
        self.setText(text)

    def text(self) -> str:  # the whole text, not the elided one shown
        return self._full

    def setText(self, text: str) -> None:  # Qt's name
        self._full = text
        self.setToolTip(text)
        self._elide()
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        m = self.contentsMargins()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + m.left() + m.right() + 2,
                     super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        m = self.contentsMargins()
        fm = self.fontMetrics()
        width = min(fm.horizontalAdvance(self._full),
                    fm.averageCharWidth() * ELIDED_MIN_CHARS + fm.horizontalAdvance("…"))
        return QSize(width + m.left() + m.right() + 2, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.ElideRight,
                                              max(self.contentsRect().width(), 0))
        if super().text() != shown:
            QLabel.setText(self, shown)


class FlowRow(QLayout):
    """Widgets left to right, wrapping onto another line when the row is too narrow: its minimum
    width is its widest widget's, not their sum."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # everything on one line
        shown = [i.sizeHint() for i in self._shown()]
        m = self.contentsMargins()
        width = sum(s.width() for s in shown) + self.spacing() * max(len(shown) - 1, 0)
        height = max((s.height() for s in shown), default=0)
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # one widget a line at the narrowest
        size = QSize()
        for item in self._shown():
            size = size.expandedTo(item.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _shown(self) -> list[QLayoutItem]:
        return [i for i in self._items if not (i.widget() and i.widget().isHidden())]

    def _place(self, rect: QRect, move: bool) -> int:
        """Lay the items out in ``rect`` (when ``move``), each line's items centred on it;
        return the height they take."""
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        lines: list[list[QLayoutItem]] = [[]]
        x = area.x()
        for item in self._shown():
            width = item.sizeHint().width()
            if lines[-1] and x + width > area.right() + 1:
                lines.append([])
                x = area.x()
            lines[-1].append(item)
            x += width + self.spacing()
        y = area.y()
        for line in lines:
            height = max((i.sizeHint().height() for i in line), default=0)
            x = area.x()
            for item in line if move else ():
                hint = item.sizeHint()
                top = y + (height - hint.height()) // 2
                item.setGeometry(QRect(QPoint(x, top), QSize(min(hint.width(), area.width()),
                                                               hint.height())))
                x += hint.width() + self.spacing()
            y += height + self.spacing()
        return max(y - self.spacing() - rect.y(), 0) + m.bottom()
