"""Every label and button can be read at 1366×768 with every panel open, on the tiny model, offscreen.

After a prime, a run and a benchmark of three modes: no label's text is cut without an
ellipsis (an elided one has its whole text as tooltip), the status bar's fields do not overlap
and QStatusBar paints no message of its own under them, every chart legend entry and the KV
map's legend are whole, and the progress shows on one line. Table columns fit, and the width
the user drags is kept in the settings and comes back in a new window (the cache tree's:
test_cache_panel_readable.py).
"""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QLabel, QPushButton, QStatusBar

from app.engine.task_state import Progress
from app.engine.kv.kv_view import RecurrentSlot
from app.ui.chart_legend import ChartLegend
from app.ui.engine_worker import Job, JobKind
from app.ui.kv_grid import KvGrid
from app.ui.narrow_widgets import ElidedLabel
from app.ui.status_bar import one_line
from tests.ui.test_ui_window import TPL
from tests.ui_actions import BENCH, PRIME, RUN_BOTH, idle, trigger
from tests.paths import REPO_ROOT

ROWS = [{"question": f"question {i} of the rows", "topic": f"topic {i}"} for i in range(4)]


def needed_width(label: QLabel) -> float:
    """Pixels the label's shown text takes on one line."""
    shown = QLabel.text(label)
    if label.textFormat() == Qt.RichText or (label.textFormat() == Qt.AutoText
                                             and GuiQt.mightBeRichText(shown)):
        doc = QTextDocument()
        doc.setDefaultFont(label.font())
        doc.setDocumentMargin(0)
        doc.setHtml(shown)
        return doc.idealWidth()
    return label.fontMetrics().horizontalAdvance(shown)


def cut_labels(window) -> list[str]:
    """Shown one-line labels whose text is wider than they are and does not end in "…", or
    that end in "…" without their whole text in the tooltip."""
    cut = []
    for label in window.findChildren(QLabel):
        shown = QLabel.text(label)
        if not shown or not label.isVisible() or label.visibleRegion().isEmpty() \
                or label.wordWrap():
            continue
        room = label.contentsRect().width() - 2 * label.margin()
        if shown.endswith("…"):
            if isinstance(label, ElidedLabel) and label.text() not in label.toolTip():
                cut.append(f"{label.objectName()}: {shown!r} without its whole text")
        elif needed_width(label) > room + 1:
            cut.append(f"{label.objectName() or shown!r}: {needed_width(label):.0f} px in {room}")
    for button in window.findChildren(QPushButton):  # a button narrower than its text cuts it
        if button.text() and button.isVisible() and not button.visibleRegion().isEmpty() \
                and button.width() < button.sizeHint().width():
            cut.append(f"button {button.text()!r}: {button.width()} px of "
                       f"{button.sizeHint().width()}")
    return cut


def overlapping(fields) -> list[tuple[str, str]]:
    shown = sorted((f for f in fields if f.isVisible() and f.width() > 0), key=lambda f: f.x())
    return [(a.objectName(), b.objectName()) for a, b in zip(shown, shown[1:])
            if a.geometry().right() >= b.geometry().left()]


def legend_cut(legend: ChartLegend) -> list[str]:
    """Entries narrower than their text, or outside the legend or the chart's view."""
    view = legend.view.rect()
    return [lab.property("entry") for lab in legend.labels
            if lab.width() < lab.sizeHint().width() or not legend.rect().contains(lab.geometry())
            or not view.contains(legend.geometry())]


@pytest.fixture
def busy_window(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_options(bench_modes=("prefix", "chain", "compose"), repeat=1)
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    w.session.set_selection([0, 1])
    assert trigger(qtbot, w, PRIME).outcome == "done"
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    assert trigger(qtbot, w, BENCH).outcome == "done"
    idle(qtbot, w)
    return w


def test_every_label_can_be_read_at_1366x768_with_every_panel_open(qtbot, busy_window):
    w = busy_window
    # a long message and a long model name: the status bar elides, it does not overprint
    w.status.showMessage("loaded a-model-with-a-rather-long-name.gguf: 30 layers, context "
                         "8,192 tokens; save the primed prefix with Ctrl+Alt+S to keep it", 0)
    w.status.model.setText("SmolLM2-360M-Instruct-a-long-quantisation-name · llama · KV f16/f16")
    qtbot.waitUntil(lambda: QLabel.text(w.status.message).endswith("…"), timeout=5000)
    assert w.status.message.toolTip().endswith("to keep it")
    assert QStatusBar.currentMessage(w.status) == ""  # Qt's own message would be cut mid-word
    assert overlapping(w.status.fields()) == []
    assert w.width() == 1366
    for tab in (w.run_panel, w.bench):
        w.central_tabs.setCurrentWidget(tab)
        for dock in (w.cache_panel, w.model_panel, w.library, w.errors):
            dock.raise_()
            qtbot.waitUntil(lambda: dock.isVisible(), timeout=5000)
            assert cut_labels(w) == [], (tab.objectName(), dock.objectName())
    # every chart's legend entry whole: the benchmark's modes can be told apart
    w.central_tabs.setCurrentWidget(w.bench)
    legend = w.bench.chart.legend_row
    qtbot.waitUntil(lambda: legend.isVisible() and legend.height() > 0, timeout=5000)
    names = legend.names()  # and the whiskers' entry when repeats spread
    assert names[:4] == ["cold", "warm: prefix", "warm: chain", "warm: compose"]
    assert names[4:] in ([], ["min–max"])
    assert legend_cut(legend) == []
    w.central_tabs.setCurrentWidget(w.run_panel)
    qtbot.waitUntil(lambda: w.run_panel.chart.legend_row.isVisible(), timeout=5000)
    assert legend_cut(w.run_panel.chart.legend_row) == []
    # the KV map's legend: every entry (the empty cells too), as tall as its text
    kv = w.kv_dock
    kv.raise_()
    assert "empty:" in kv.legend.text()
    qtbot.waitUntil(lambda: kv.legend.height() >= kv.legend.heightForWidth(kv.legend.width()),
                    timeout=5000)
    assert kv.legend_area.height() >= 5 * kv.fontMetrics().lineSpacing()


def test_progress_is_one_line_without_the_job_named_twice(qtbot, make_window):
    w = make_window()
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    assert one_line("prime", "prime: prime 256/1,761 · 2 s left") == "prime 256/1,761 · 2 s left"
    assert one_line("benchmark", "benchmark: row 2 of 10 · chain") == \
        "benchmark: row 2 of 10 · chain"
    job = Job(JobKind.BENCH, lambda *a: None,
              label="benchmark of the rows in three modes, " * 4)
    w.status.on_progress(job, Progress("warm", 1280, 1836, 3.0))
    bar = w.status.bar
    assert bar.isVisible() and "\n" not in bar.text()
    assert bar.fontMetrics().horizontalAdvance(bar.text()) <= bar.width()
    assert bar.toolTip() == w.status.last_text and bar.text().endswith("…")


def test_a_recurrent_chip_shows_what_fits_whole(qtbot):
    grid = KvGrid()
    qtbot.addWidget(grid)
    slot = RecurrentSlot(seq=1, pos=4_440, bytes=1_200_000)
    fm = grid.fontMetrics()
    for width in (400, 90, 60, 30):
        text = grid.slot_text(slot, width)
        assert fm.horizontalAdvance(text) <= width or text.endswith("…"), (width, text)
        assert "4,44" not in text or "4,440" in text  # a number is never cut
    assert grid.slot_text(slot, 400).startswith("seq 1 · at 4,440 ·")


def drag_column(qtbot, header, column: int, by: int) -> None:
    edge = header.sectionViewportPosition(column) + header.sectionSize(column) - 1
    y = header.height() // 2
    qtbot.mousePress(header.viewport(), Qt.LeftButton, pos=QPoint(edge, y))
    qtbot.mouseMove(header.viewport(), QPoint(edge + by // 2, y))
    qtbot.mouseMove(header.viewport(), QPoint(edge + by, y))
    qtbot.mouseRelease(header.viewport(), Qt.LeftButton, pos=QPoint(edge + by, y))


def test_columns_fit_and_keep_the_width_the_user_gave(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_selection([0])
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    table = w.run_panel.table
    header = table.horizontalHeader()
    verdict = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())].index(
        "verdict")
    # fitted: the verdict's word is whole
    qtbot.waitUntil(lambda: header.sectionSize(verdict) >= table.sizeHintForColumn(verdict),
                    timeout=5000)
    before = header.sectionSize(1)
    drag_column(qtbot, header, 1, 60)
    qtbot.waitUntil(lambda: header.sectionSize(1) >= before + 40, timeout=5000)
    dragged = header.sectionSize(1)
    w.session.set_selection([1])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"  # new rows: fitted again, but not it
    idle(qtbot, w)
    assert header.sectionSize(1) == dragged
    w.close()  # the layout and the widths are saved with the window
    w2 = make_window()
    w2.resize(1366, 768)
    w2.show()
    qtbot.waitExposed(w2)
    header2 = w2.run_panel.table.horizontalHeader()
    qtbot.waitUntil(lambda: header2.sectionSize(1) == dragged, timeout=5000)
    # "Fit columns" in the header's menu gives the column back to the fitting
    fit = next(a for a in header2.actions() if a.text() == "Fit columns")
    fit.trigger()
    assert header2.sectionSize(1) != dragged and w2.columns["runTable"].user == {}


def test_the_window_class_and_app_name_are_kvprimer(qapp):
    from app.__main__ import APP_ID, name_app

    names = (qapp.organizationName(), qapp.applicationName(), qapp.applicationDisplayName(),
             qapp.desktopFileName())
    try:
        name_app(qapp)
        assert (qapp.applicationName(), qapp.desktopFileName()) == (APP_ID, "kvprimer")
        assert qapp.applicationDisplayName() == "KV Primer"
    finally:
        for setter, value in zip((qapp.setOrganizationName, qapp.setApplicationName,
                                  qapp.setApplicationDisplayName, qapp.setDesktopFileName), names):
            setter(value)
    from pathlib import Path
    desktop = REPO_ROOT / "packaging" / "kvprimer.desktop"
    assert "StartupWMClass=kvprimer" in desktop.read_text()
