"""Spin boxes and drop-downs for settings, made readable and safe in scrolling panels.

Numbers read as the rest of the window writes them ("4,096", number_text.py's locale); a
drop-down of file names shortens a long one in the middle (its start and its extension stay),
the whole name and path in its tooltip, instead of cutting it; and in a panel that scrolls, the
wheel scrolls the panel unless the box was clicked or tabbed into, so that scrolling past a
setting does not change it. That holds for boxes added to the panel later too (a settings row
made anew).
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (QAbstractSpinBox, QComboBox, QStyle, QStyleOptionComboBox,
                               QStylePainter, QWidget)

from .number_text import NUMBERS

COMBO_MIN_CHARS = 12  # an eliding drop-down keeps room for this many characters
BOXES = (QAbstractSpinBox, QComboBox)  # what the wheel would change unasked


def grouped(box: QAbstractSpinBox) -> QAbstractSpinBox:
    """``box`` with thousands separated as everywhere else in the window; typing "4096" still
    works."""
    box.setLocale(NUMBERS)
    box.setGroupSeparatorShown(True)
    return box


class FocusedWheel(QObject):
    """An event filter on every widget under a root: a box without the focus passes the wheel
    on to the panel around it, and a widget that comes under the root later (Qt polishes each
    one before it is first shown, and tells its parent) is guarded as it comes."""

    def eventFilter(self, obj, event) -> bool:
        kind = event.type()
        if kind == QEvent.Wheel and isinstance(obj, BOXES) and not obj.hasFocus():
            event.ignore()  # an ignored wheel event goes on to the parent: the scroll area
            return True
        if kind == QEvent.ChildPolished and isinstance(event.child(), QWidget):
            self.guard(event.child())
        return False

    def guard(self, widget: QWidget) -> None:
        """``widget`` and everything under it, once each however often it is called."""
        for w in [widget, *widget.findChildren(QWidget)]:
            if isinstance(w, BOXES):
                w.setFocusPolicy(Qt.StrongFocus)
            w.removeEventFilter(self)
            w.installEventFilter(self)


def wheel_when_focused(root: QWidget) -> None:
    """Every spin box and drop-down under ``root``, now or later, takes the wheel only once it
    has the focus (a click or Tab: StrongFocus, as the wheel no longer gives it)."""
    (root.findChild(FocusedWheel) or FocusedWheel(root)).guard(root)


class ElidedCombo(QComboBox):
    """A drop-down whose shown choice ends up "start…end" (or ``elide``'s way) when the box is
    narrower than it, the whole of it (the item's tooltip: a path) and ``tip`` in the box's
    tooltip. A long entry does not widen the panel."""

    def __init__(self, tip: str = "", parent: QWidget | None = None,
                 elide: Qt.TextElideMode = Qt.ElideMiddle):
        super().__init__(parent)
        self.tip, self.elide = tip, elide
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(COMBO_MIN_CHARS)
        self.currentIndexChanged.connect(lambda _i: self._show_tip())
        self.model().dataChanged.connect(lambda *_a: self._show_tip())  # an item's tooltip set
        self._show_tip()

    def _show_tip(self) -> None:
        whole = self.currentData(Qt.ToolTipRole) or self.currentText()
        self.setToolTip("\n".join(t for t in (whole, self.tip) if t))

    def shown_text(self) -> str:
        """The current choice as drawn: elided to the box's text field."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        field = self.style().subControlRect(QStyle.CC_ComboBox, opt,
                                            QStyle.SC_ComboBoxEditField, self)
        # the style draws the label 1 pixel in from each side of the field
        return self.fontMetrics().elidedText(self.currentText(), self.elide,
                                             max(field.width() - 2, 0))

    def paintEvent(self, _event) -> None:  # QComboBox's own, with the text elided
        painter = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        painter.drawComplexControl(QStyle.CC_ComboBox, opt)
        if self.currentIndex() < 0 and self.placeholderText():
            opt.palette.setBrush(QPalette.ButtonText, opt.palette.placeholderText())
            opt.currentText = self.placeholderText()
        else:
            opt.currentText = self.shown_text()
        painter.drawControl(QStyle.CE_ComboBoxLabel, opt)
