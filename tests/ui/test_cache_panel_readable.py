"""The Cache panel stays readable at 1366×768 with every panel open and in a 380-pixel column
(issue 34): the tree never scrolls sideways whatever the nodes' ages (each age short, its
time of day in the cell's tooltip), and each tier's text is shown whole, none of it over the
bar's fill; a column the user drags keeps its width. The real window on the tiny model,
offscreen; ages and sizes are the test's (a snapshot with its clock moved on), never waited
for."""
from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QLabel, QProgressBar

from app.engine.cache.radix_cache import TierUsage
from app.ui.cache_panel import AGE_COLUMN, COLUMNS, age_text
from app.ui.tier_bars import TierBar, tier_text
from tests.ui.test_ui_readable import drag_column
from tests.ui.test_ui_window import TPL
from tests.ui_actions import RUN_BOTH, idle, show_with_panels, trigger

ROWS = [{"question": f"question {i} of the rows", "topic": f"topic {i}"} for i in range(2)]
# a node's age as the panel may show it: from a run just now to one of last year
AGES = [0.4, 12, 59.6, 61, 754, 59 * 60 + 59, 3 * 3600 + 5, 23.9 * 3600, 3 * 86400, 400 * 86400]
# a real model's numbers for the tiny model's nodes: tokens added to the whole prompt, to a
# node's own, bytes and hits (the columns that keep their texts whole)
SCREENSHOT_RUN = (1_800, 50, 40_000_000, 10)  # "1,864 (+54)", "40.6 MB": the README's picture
LONG_RUN = (12_800, 1_050, 400_000_000, 100)  # "12,851 (+1,077)", "400.1 MB", hundreds of hits
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


def items(tree):
    stack = [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]
    while stack:
        item = stack.pop()
        yield item
        stack.extend(item.child(i) for i in range(item.childCount()))


def as_big_as(run: tuple[int, int, int, int], snap):
    tokens, own, nbytes, hits = run
    nodes = [replace(n, tokens=n.tokens + tokens, nbytes=n.nbytes + nbytes, hits=n.hits + hits,
                     own_tokens=n.own_tokens + (tokens if n.parent_id is None else own))
             for n in snap.nodes]
    return replace(snap, nodes=nodes)


def test_ages_are_whole_units_in_four_characters_at_most():
    assert [age_text(s) for s in (0.4, 12, 61, 754, 3 * 3600 + 5, 3 * 86400)] == \
        ["now", "12s", "1m", "12m", "3h", "3d"]
    assert age_text(59.6) == "59s" and age_text(23.9 * 3600) == "23h"  # never "60s" nor "24h"
    assert max(len(age_text(s)) for s in AGES) <= 4


@pytest.mark.parametrize("narrow, run", [(False, LONG_RUN), (True, SCREENSHOT_RUN)],
                         ids=["1366x768", "380px"])
def test_the_cache_tree_never_scrolls_sideways_whatever_the_ages(qtbot, cache_window, narrow,
                                                                 run):
    w = cache_window
    panel, columns = w.cache_panel, w.columns["cacheTree"]
    tree, header = panel.tree, panel.tree.header()
    if narrow:
        narrow_panel(qtbot, w)
    snap = as_big_as(run, panel.snapshot)
    newest = max(n.last_used for n in snap.nodes)
    for age in AGES:  # the clock moved on: every node at least ``age`` old
        panel.show_snapshot(replace(snap, now=newest + age))
        columns.fit()  # as its timer does once the cells changed
        shown = sorted({item.text(AGE_COLUMN) for item in items(tree)})
        widths = [header.sectionSize(c) for c in range(header.count())]
        assert header.length() <= tree.viewport().width(), (shown, widths)
        qtbot.waitUntil(lambda: tree.horizontalScrollBar().maximum() == 0, timeout=5000)
        for c in range(2, header.count()):  # the numbers and the tier whole
            assert header.sectionSize(c) >= tree.sizeHintForColumn(c), (c, shown, widths)
    for item in items(tree):  # when it was used is a hover away
        assert item.toolTip(AGE_COLUMN).startswith("Last used at "), item.text(AGE_COLUMN)
    if not narrow:  # the node's name is what the room left goes to first, not its text
        top = tree.topLevelItem(0)
        assert header.sectionSize(0) - tree.indentation() > \
            tree.fontMetrics().horizontalAdvance(top.text(0)), top.text(0)


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
    # each tier's name and text read as two: a space's width at least between them
    for tier in panel.findChildren(TierBar):
        fm = tier.title.fontMetrics()
        name_end = tier.title.geometry().left() + fm.horizontalAdvance(tier.title.text())
        assert tier.label.geometry().left() - name_end >= fm.horizontalAdvance(" "), tier.name
    # nor do they make the panel taller than its dock: its buttons are in sight
    evict = panel.evict_btn
    assert evict.visibleRegion().boundingRect() == evict.rect()


def test_the_cache_tree_fits_its_panel_at_1366x768_and_keeps_a_dragged_width(qtbot,
                                                                             cache_window):
    w = cache_window
    tree, header = w.cache_panel.tree, w.cache_panel.tree.header()
    # every column in the panel, the numbers whole: nothing scrolls off to the right
    qtbot.waitUntil(lambda: tree.horizontalScrollBar().maximum() == 0, timeout=5000)
    names = [c for c, _tip in COLUMNS]
    for name in ("tokens", "tier", "size", "hits", "used"):
        c = names.index(name)
        assert header.sectionSize(c) >= tree.sizeHintForColumn(c), name
        assert header.sectionViewportPosition(c) + header.sectionSize(c) <= \
            tree.viewport().width(), name
    # a dragged column keeps its width (the text column, shown last, fills what is left)
    used = names.index("used")
    before = header.sectionSize(used)
    drag_column(qtbot, header, used, 30)
    qtbot.waitUntil(lambda: header.sectionSize(used) >= before + 20, timeout=5000)
    dragged = header.sectionSize(used)
    w.columns["cacheTree"].fit()
    assert header.sectionSize(used) == dragged
    assert w.columns["cacheTree"].user == {used: dragged}
