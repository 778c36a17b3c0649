"""The Cache panel stays readable at 1366×768 with every panel open and in a 380-pixel column
(issue 34): each tier's text is shown whole, none of it over the bar's fill. The real window on
the tiny model, offscreen; the tiers' sizes are the test's."""
from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QLabel, QProgressBar

from app.engine.cache.radix_cache import TierUsage
from app.ui.tier_bars import tier_text
from tests.ui.test_ui_window import TPL
from tests.ui_actions import RUN_BOTH, idle, show_with_panels, trigger

ROWS = [{"question": f"question {i} of the rows", "topic": f"topic {i}"} for i in range(2)]
NARROW = 380  # pixels: the advanced panels' narrowest column (window_layout.DOCK_WIDTH)
# the longest texts of the screenshot's run (a 1,761-token prefix on SmolLM2), kept copies more
TIERS = [TierUsage("resident", 44_000_000, 70_800_000, 5),
         TierUsage("ram", 44_000_000, 536_900_000, 0, 15, 44_000_000),
         TierUsage("file", 0, 2_100_000_000, 0)]


@pytest.fixture
def cache_window(qtbot, make_window):
    """The window at 1366×768 with every panel open, the Cache panel in front, after a chain
    run of two rows (a tree of a few nodes)."""
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_options(reuse_mode="chain")
    w.session.set_selection([0, 1])
    show_with_panels(qtbot, w)
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    w.cache_panel.raise_()
    tree = w.cache_panel.tree
    qtbot.waitUntil(lambda: tree.isVisible() and tree.topLevelItemCount() > 0, timeout=5000)
    return w


def narrow_panel(qtbot, w) -> None:
    w.resizeDocks([w.cache_panel], [NARROW], Qt.Horizontal)
    qtbot.waitUntil(lambda: w.cache_panel.width() <= NARROW + 2, timeout=5000)


def whole_and_clear(label: QLabel, bars: list[QProgressBar], panel) -> bool:
    """``label`` is shown whole (all its lines, nothing clipped) and lies over no bar."""
    if not label.isVisible():
        return False
    if label.wordWrap():
        whole = label.height() >= label.heightForWidth(label.width())
    else:
        whole = label.fontMetrics().horizontalAdvance(label.text()) <= label.contentsRect().width()
    shown = label.visibleRegion().boundingRect() == label.rect()

    def on_panel(widget) -> QRect:
        return QRect(widget.mapTo(panel, widget.rect().topLeft()), widget.size())

    return whole and shown and not any(on_panel(label).intersects(on_panel(b)) for b in bars)


@pytest.mark.parametrize("narrow", [False, True], ids=["1366x768", "380px"])
def test_each_tiers_text_is_whole_and_not_over_its_bar(qtbot, cache_window, narrow):
    w = cache_window
    panel = w.cache_panel
    if narrow:
        narrow_panel(qtbot, w)
    panel.show_snapshot(replace(panel.snapshot, tiers=TIERS))
    bars = [b for b in panel.findChildren(QProgressBar) if b.isVisible()]
    assert len(bars) == len(TIERS)
    # a bar's own text is drawn over its fill, half on it and half off at the fill's edge
    assert [b.objectName() for b in bars if b.isTextVisible()] == []
    assert [b.value() > 0 for b in bars] == [True, True, False]
    for t in TIERS:
        label = next(lab for lab in panel.findChildren(QLabel) if QLabel.text(lab) == tier_text(t))
        qtbot.waitUntil(lambda: whole_and_clear(label, bars, panel), timeout=5000)
    # nor do they make the panel taller than its dock: its buttons are in sight
    evict = panel.evict_btn
    assert evict.visibleRegion().boundingRect() == evict.rect()
