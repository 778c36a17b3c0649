"""Room to work and panels that follow every job, on the tiny model, offscreen.

- At 1366×768 and 1600×1000 with the Advanced panels open, the template shows at least 15 lines
  and each table (rows, benchmark results, server results) at least 5 rows; the screenshots
  are saved (to $KVPRIMER_SCREENSHOTS too, when set, to look at them).
- The Cache panel and the KV map agree during a benchmark (while it is held between rows) and
  after it; the RAM bar names the kept copies; a long error can be read and copied whole; the
  KV legend lists every sequence, scrolling; every chart has a visible legend.
- After a chain run with every panel open, long values and a long status line, the window is
  still 1366 pixels wide and asks no more (labels elide or wrap, the Run panel's options wrap).
"""
from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import pytest
from PySide6.QtCharts import QChartView, QLineSeries
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractItemView, QPushButton

from app.engine import BenchResult
from app.engine.cache.radix_cache import TierUsage
from app.engine.engine_kernels import KernelStatus
from app.engine.benchmarks import bench_rows
from app.engine.runs.server_results import ServerBench, ServerRow
from app.ui.byte_sizes import size_text
from app.ui.charts import WHISKERS, legend_entries
from app.ui.tier_bars import tier_text
from tests.ui.test_ui_window import TPL
from tests.ui_actions import BENCH, PRIME, RUN_BOTH, RUN_WARM, SWEEP, idle, start, trigger

SIZES = [(1366, 768), (1600, 1000)]
ROWS = [{"question": f"question {i} of the rows", "topic": f"topic {i}"} for i in range(8)]


def visible_lines(edit) -> float:
    return edit.viewport().height() / edit.fontMetrics().lineSpacing()


def visible_rows(table: QAbstractItemView) -> float:
    return table.viewport().height() / table.verticalHeader().defaultSectionSize()


def keep_screenshot(path) -> None:
    folder = os.environ.get("KVPRIMER_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        shutil.copy(path, folder)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_work_stays_readable_with_the_advanced_panels_open(qtbot, make_window, tmp_path, size):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    docks = [w.model_panel, w.kv_dock, w.cache_panel, w.library, w.errors]
    assert all(not d.isHidden() and not d.isFloating() for d in docks)
    # the template's first height is set once the window is laid out
    qtbot.waitUntil(lambda: visible_lines(w.editor.edit) >= 15, timeout=5000)
    assert w.width() == size[0] and w.height() == size[1]
    assert visible_rows(w.fillings.table) >= 5
    shots = []
    for tab, table in ((w.run_panel, None), (w.bench, w.bench.table),
                       (w.server_view, w.server_view.table)):
        w.central_tabs.setCurrentWidget(tab)
        if table is not None:
            qtbot.waitUntil(table.isVisible, timeout=5000)
            assert visible_rows(table) >= 5, (tab, visible_rows(table))
        shot = tmp_path / f"window-{size[0]}x{size[1]}-{tab.objectName() or type(tab).__name__}.png"
        assert w.grab().save(str(shot))
        keep_screenshot(shot)
        shots.append(shot)
    # the panels beside the work are usable too: the KV map and the cache tree are not squeezed
    assert w.kv_dock.grid.height() >= 100 and w.cache_panel.tree.height() >= 60
    assert all(s.stat().st_size > 10_000 for s in shots)


PASSAGE = "To restart, choose Settings, then System, then Restart in the app; it is back soon. "


def test_a_chain_run_with_every_panel_open_keeps_the_window_on_a_1366_screen(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    # two rows sharing a long first value: the reuse line names it, the breakdown follows
    w.session.set_rows([{"question": PASSAGE * 3, "topic": f"topic {i} " + PASSAGE * 2}
                        for i in range(3)])
    w.session.set_options(reuse_mode="chain")
    w.session.set_selection([0, 2])
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    # a kernel measurement waiting with its reason: the status bar's longest line during a job
    note = "the model changed since the last measurement of the attention kernels on this machine"
    w.engine_status.update(kernel_measurement=KernelStatus("wanted", False, note=note))
    assert trigger(qtbot, w, PRIME).outcome == "done"
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    assert "static prefix" in w.run_panel.reuse.text() and w.run_panel.breakdown.text()
    assert w.width() <= 1366 and w.minimumSizeHint().width() <= 1366, \
        (w.width(), w.minimumSizeHint().width(), w.centralWidget().minimumSizeHint().width(),
         w.status.minimumSizeHint().width())
    # the Run page asks for its widest control, not its row's sum (903 px), leaving the docks
    # their width; what a status label cannot show is in its tooltip
    assert w.run_panel.minimumSizeHint().width() <= 1366 // 2
    for label in (w.status.model, w.status.context, w.status.kernels):
        assert label.toolTip() == label.text()
    assert w.kv_dock.width() >= 300 and all(b.isVisible() for b in w.run_panel.run_buttons)


def resident_cells(view, nodes) -> int:
    """Cells held by the sequences of the radix cache's nodes, as the KV map draws them: with
    owners shown, or "owner not reported" where every sequence that may own it is a node's
    (sibling prompts' shared cells at one position, which llama.cpp's map does not tell apart)."""
    bits = np.uint64(0)
    for s in nodes:
        bits |= np.uint64(1) << np.uint64(s)
    known = (view.cell_owners & bits) != 0
    if view.cell_possible is not None:
        p = view.cell_possible
        known |= view.cell_unreported & (p != 0) & ((p & ~bits) == 0)
    return int(np.count_nonzero(known))


def agreement(w) -> tuple:
    """(nodes, cells) as the Cache panel shows them and as the KV map shows them."""
    panel, dock = w.cache_panel, w.kv_dock
    resident = [n for n in panel.snapshot.nodes if n.tier == "resident"]
    bar = next(t for t in panel.snapshot.tiers if t.name == "resident")
    per_token = w.engine_status.info.kv_bytes_per_token
    return ((len(resident), bar.used_bytes // per_token),
            (len(dock.nodes), resident_cells(dock.view, dock.nodes)))


def test_the_cache_panel_and_the_kv_map_agree_during_and_after_a_benchmark(
        qtbot, make_window, monkeypatch):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS[:3])
    w.session.set_options(bench_modes=("prefix", "chain"))
    assert trigger(qtbot, w, PRIME).outcome == "done"
    idle(qtbot, w)
    shown, drawn = agreement(w)
    assert shown == drawn and shown[0] == 1  # the static prefix
    hits = w.cache_panel.snapshot.nodes[0].hits

    # hold the benchmark after its first row (on the worker thread) until the test has looked
    held, release = threading.Event(), threading.Event()
    real = bench_rows._add_row

    def one_row(*args, **kw):
        out = real(*args, **kw)
        if not held.is_set():
            held.set()
            release.wait(20)
        return out

    monkeypatch.setattr(bench_rows, "_add_row", one_row)
    pictures = []
    w.cache_panel.watch.arrived.connect(lambda p: pictures.append(w.engine_status.working))
    start(w, BENCH)
    try:
        qtbot.waitUntil(held.is_set, timeout=20000)
        # what the first row did to the cache reaches both panels while the benchmark runs
        qtbot.waitUntil(lambda: any(pictures), timeout=10000)
        assert w.engine_status.working
        assert w.cache_panel.snapshot.nodes[0].hits > hits  # the prefix's reuse, counted live
        shown, drawn = agreement(w)
        assert shown == drawn, "during the benchmark"
    finally:
        release.set()
    qtbot.waitUntil(lambda: w.session.bench is not None and not w.engine_status.working,
                    timeout=60000)
    idle(qtbot, w)
    shown, drawn = agreement(w)
    assert shown == drawn, "after the benchmark"
    assert len(w.session.bench.rows) == 6


def test_the_ram_bar_names_the_kept_copies(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS[:1])
    w.session.set_selection([0])
    assert trigger(qtbot, w, RUN_WARM).outcome == "done"  # a copy into the work context, kept
    idle(qtbot, w)
    ram = next(t for t in w.cache_panel.snapshot.tiers if t.name == "ram")
    assert ram.kept_copies >= 1 and 0 < ram.kept_bytes <= ram.used_bytes
    bar = w.cache_panel.bars["ram"]
    assert f"{ram.nodes} node" in bar.text() and "kept cop" in bar.text(), bar.text()
    assert "kept copies" in bar.toolTip() and size_text(ram.kept_bytes) in bar.toolTip()
    assert tier_text(TierUsage("ram", 52_300_000, 536_900_000, 0, 3, 52_300_000)) == \
        "52.3 MB / 536.9 MB · 0 nodes + 3 kept copies"
    assert tier_text(TierUsage("file", 0, 2_000, 1)) == "0 B / 2.0 kB · 1 node"


def test_a_long_error_is_shown_whole_and_can_be_copied(qtbot, make_window, tmp_path):
    w = make_window()
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    w.cache_panel.raise_()  # the Log is behind another tab
    missing = tmp_path / ("a-folder-with-a-long-name-" * 4) / "a-model-that-is-not-there.gguf"
    log_rows = w.errors.list.count()
    w.open_model(str(missing))
    qtbot.waitUntil(lambda: w.errors.list.count() > log_rows and not w.engine_status.busy,
                    timeout=20000)
    message = w.errors.messages("error")[-1]
    assert str(missing) in message or missing.name in message
    # too long for the status bar, so the Log comes to the front with the whole text
    assert w.status.fontMetrics().horizontalAdvance(message) > w.status.width()
    assert w.errors.isVisible() and not w.errors.visibleRegion().isEmpty()
    assert message in w.errors.detail.toPlainText()
    assert w.errors.detail.isReadOnly() and w.errors.detail.isVisible()
    QGuiApplication.clipboard().clear()
    w.errors.findChild(QPushButton, "logCopy").click()
    assert message in QGuiApplication.clipboard().text()


def test_the_kv_legend_lists_every_sequence_and_scrolls(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS[:4])
    w.session.set_options(reuse_mode="chain")
    w.session.set_selection([0, 1, 2, 3])
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    dock = w.kv_dock
    seqs = [u.seq for u in dock.view.sequences]
    assert len(seqs) > 4  # more than the old legend showed
    text = dock.legend.text()
    # one entry per sequence, and one for the empty cells
    assert text.count("■") == len(seqs) + 1 and "more sequences" not in text
    assert "empty:" in text
    # the legend is never cut: it is as tall as its text, inside a scroll area
    area = dock.legend_area
    qtbot.waitUntil(lambda: dock.legend.height() >= dock.legend.heightForWidth(dock.legend.width()),
                    timeout=5000)
    dock.map_split.setSizes([400, 2 * dock.fontMetrics().lineSpacing()])
    qtbot.waitUntil(lambda: area.verticalScrollBar().maximum() > 0, timeout=5000)
    area.verticalScrollBar().setValue(area.verticalScrollBar().maximum())


def test_every_chart_has_a_visible_legend(qtbot, make_window):
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS[:2])
    w.session.set_selection([0])
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    assert trigger(qtbot, w, BENCH).outcome == "done"
    assert trigger(qtbot, w, SWEEP).outcome == "done"
    w.session.set_server_bench(ServerBench("http://127.0.0.1:1", "llama", "llama.cpp", "tiny", True, [
        ServerRow(row=r, prompt_tokens=90, prefix_tokens=60, cold_ms=40.0, warm_ms=9.0,
                  server_cached_tokens=59, server_evaluated_tokens=31, cold_cached_tokens=0,
                  text="x", local_cold_ms=35.0) for r in (1, 2)]))
    expected = {
        w.run_panel.chart: {"cold", "warm"},
        w.bench.chart: {"cold", *(f"warm: {m}" for m in w.session.options.bench_modes)},
        w.bench.sweep: {"cold", "warm", "suffix only (floor)"},
        w.server_view.ttft_chart: {"local cold", "server cold", "server warm"},
        w.server_view.cached_chart: {"static prefix", "reused by server"},
    }
    assert set(w.findChildren(QChartView)) == set(expected)  # no chart left out
    w.resize(1366, 768)  # legends are laid out, and fit, at the small screen's size
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    for view, names in expected.items():
        tab = next(t for t in (w.run_panel, w.bench, w.server_view) if t.isAncestorOf(view))
        w.central_tabs.setCurrentWidget(tab)
        charts = view.parentWidget().parentWidget()  # the tab widget holding the charts, if any
        if hasattr(charts, "setCurrentWidget"):
            charts.setCurrentWidget(view)
        # and "min–max" where whiskers are drawn, once
        qtbot.waitUntil(lambda: set(legend_entries(view)) - {WHISKERS} == names, timeout=5000)
        shown = legend_entries(view)
        whiskers = [s for s in view.chart().series() if isinstance(s, QLineSeries)
                    and view is not w.bench.sweep]
        assert len(shown) == len(set(shown)) and (WHISKERS in shown) == bool(whiskers), shown
    assert WHISKERS in legend_entries(w.bench.chart)  # 3 repeats: a min and a max per row
    assert isinstance(w.session.bench, BenchResult)


def test_the_screenshot_takes_the_size_of_a_screen(capsys):
    from app.__main__ import _parser

    args = _parser().parse_args(["--screenshot", "x.png", "--size", "1366x768"])
    assert args.size == (1366, 768)
    assert _parser().parse_args(["--screenshot", "x.png"]).size == (1400, 900)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--size", "wide"])
    assert "WIDTHxHEIGHT" in capsys.readouterr().err


def test_a_narrow_status_label_ends_in_an_ellipsis_and_keeps_its_whole_text(qtbot):
    from PySide6.QtWidgets import QLabel

    from app.ui.narrow_widgets import ElidedLabel

    text = "Smollm2 135M 8k Lc100K Mix1 Ep2 · llama · KV f16/f16"
    label = ElidedLabel(text)
    qtbot.addWidget(label)
    label.show()  # a hidden widget hears of its resizes only when shown
    qtbot.waitExposed(label)
    assert label.minimumSizeHint().width() < label.sizeHint().width() // 2
    label.resize(label.sizeHint())
    assert QLabel.text(label) == text  # room for all of it: shown whole
    label.resize(label.minimumSizeHint())
    shown = QLabel.text(label)
    assert shown.endswith("…") and len(shown) < len(text)
    assert label.text() == label.toolTip() == text


def test_the_run_charts_legend_stays_on_screen_when_a_note_marks_the_run_as_earlier(
        qtbot, make_window):
    # 1366x768, every panel open, a chain run shown: the Run page is as full as it gets. An
    # edit of the template adds the line that marks the run as earlier; the page's controls
    # wrap onto a second line. The page asks for that height, and the chart keeps its legend.
    w = make_window()
    w.editor.set_text(TPL)
    w.session.set_rows(ROWS)
    w.session.set_options(reuse_mode="chain")
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    w.actions_by_text["Advanced panels"].trigger()
    assert trigger(qtbot, w, PRIME).outcome == "done"
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    idle(qtbot, w)
    w.editor.set_text(TPL.replace("<question>", "<question>!"))
    panel = w.run_panel
    qtbot.waitUntil(lambda: panel.earlier.isVisible(), timeout=5000)
    legend = panel.chart.legend_row
    qtbot.waitUntil(lambda: legend.isVisible() and legend.height() > 0, timeout=5000)

    def whole(widget) -> bool:  # not cut by the page, the tabs or the window around it
        return widget.visibleRegion().boundingRect() == widget.rect()

    qtbot.waitUntil(lambda: whole(legend) and whole(panel.table), timeout=5000)
    assert w.height() == 768 and w.minimumSizeHint().height() <= 768
    assert visible_lines(w.editor.edit) >= 10


def test_the_run_pages_first_words_stay_on_one_line(qtbot, make_window):
    # the verdict's place beside its details: "Select rows and press Run." before any run
    w = make_window(load=False)
    w.resize(1366, 768)
    w.show()
    qtbot.waitExposed(w)
    verdict = w.run_panel.verdict
    assert verdict.text() == "Select rows and press Run."
    qtbot.waitUntil(lambda: verdict.height() > 0, timeout=5000)
    assert verdict.height() < 2 * verdict.fontMetrics().lineSpacing(), verdict.size()
