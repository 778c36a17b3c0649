"""Settings' boxes in the scrolling panels (issue 34): a spin box or drop-down added after the
panels were set up (a settings row made anew) leaves the wheel to the panel until it is clicked
into, as the first ones do; the charts and the spin boxes write numbers with one locale,
number_text.py's, the charts no longer borrowing it from the settings' boxes."""
from __future__ import annotations

import ast

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QWidget

from app.ui.charts import TtftChart
from app.ui.number_text import NUMBERS
from app.ui.setting_boxes import grouped
from tests.paths import REPO_ROOT
from tests.ui_actions import show_with_panels, wheel


def test_a_box_added_after_setup_takes_the_wheel_only_once_clicked_into(qtbot, make_window):
    w = make_window(load=False)
    show_with_panels(qtbot, w)
    w.model_panel.raise_()
    qtbot.waitUntil(w.model_panel.isVisible, timeout=5000)
    body = w.model_panel.widget().widget()  # the panel's contents, in its scroll area
    # a new row of settings (a box in a widget of its own) and a lone drop-down, on top
    row = QWidget()
    spin = QSpinBox()
    spin.setRange(0, 100)
    spin.setValue(50)
    QHBoxLayout(row).addWidget(QLabel("a setting added later"))
    row.layout().addWidget(spin)
    combo = QComboBox()
    combo.addItems(["first", "second", "third"])
    body.layout().insertWidget(0, row)
    body.layout().insertWidget(0, combo)
    qtbot.waitUntil(lambda: spin.isVisible() and combo.isVisible(), timeout=5000)
    # the wheel over them while scrolling the panel: the panel's, not their values'
    assert spin.focusPolicy() == Qt.StrongFocus and combo.focusPolicy() == Qt.StrongFocus
    assert wheel(spin, -1) is False and wheel(combo, -1) is False
    assert spin.value() == 50 and combo.currentIndex() == 0
    w.activateWindow()
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=5000)
    assert wheel(spin) is True and spin.value() == 51  # clicked into: its own
    combo.setFocus()
    qtbot.waitUntil(combo.hasFocus, timeout=5000)
    assert wheel(combo, -1) is True and combo.currentIndex() == 1


def ui_imports(module: str) -> set[str]:
    """The app/ui modules that app/ui/``module``.py imports (``from .name import …``)."""
    tree = ast.parse((REPO_ROOT / "app" / "ui" / f"{module}.py").read_text())
    return {n.module for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def test_the_charts_and_the_spin_boxes_write_numbers_alike_from_number_text(qtbot):
    assert "setting_boxes" not in ui_imports("charts")
    assert "number_text" in ui_imports("charts") and "number_text" in ui_imports("setting_boxes")
    chart = TtftChart()
    qtbot.addWidget(chart)
    box = grouped(QSpinBox())
    qtbot.addWidget(box)
    box.setRange(0, 100_000)
    box.setValue(4096)
    assert chart.chart().locale() == NUMBERS and box.locale() == NUMBERS
    assert box.text() == "4,096" == NUMBERS.toString(4096)
