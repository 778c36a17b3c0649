"""Settings' boxes and the charts (issue 34): both write numbers with one locale,
number_text.py's, the charts no longer borrowing it from the settings' boxes."""
from __future__ import annotations

import ast

from PySide6.QtWidgets import QSpinBox

from app.ui.charts import TtftChart
from app.ui.number_text import NUMBERS
from app.ui.setting_boxes import grouped
from tests.paths import REPO_ROOT


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
