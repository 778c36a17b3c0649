"""The KV Cache dock on the tiny model: the grid's pixels by radix node, tooltips, operations."""
import pytest
from PySide6.QtGui import QColor

from app.engine import EngineConfig, Template
from app.ui.engine_worker import EngineWorker, JobKind
from app.ui.kv_dock import EMPTY, KvCacheDock, seq_color

TPL = Template.parse("hello world of the answer and question. " * 8 + "<q>")


@pytest.fixture
def dock(qtbot, tiny_model, request):
    debug = getattr(request, "param", True)
    w = EngineWorker()
    d = KvCacheDock(w)
    qtbot.addWidget(d)
    d.resize(520, 560)
    d.show()
    w.load(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_batch=32, n_threads=1,
                        kv_debug_log=debug))
    qtbot.waitUntil(lambda: d.view is not None, timeout=10000)  # the load's revision brings it
    yield d
    w.shutdown()


def pixel(d, cell, dx=0, dy=0):
    p = d.grid.cell_rect_center(cell)
    return d.grid.grab().toImage().pixelColor(p.x() + dx, p.y() + dy)


def cell_colours(d, cell):
    cs, cols, _ = d.grid.cell_size()
    img = d.grid.grab().toImage()
    x0, y0 = (cell % cols) * cs, (cell // cols) * cs
    return {img.pixelColor(x0 + i, y0 + j).name() for i in range(cs - 1) for j in range(cs - 1)}


def test_grid_colours_cells_by_radix_node_forks_hatched_and_trim_changes_it(qtbot, dock):
    assert dock.windowTitle() == "KV Cache"
    assert dock.view.used_cells == 0
    assert pixel(dock, 0) == QColor(EMPTY)
    n = {}
    dock.worker.submit(JobKind.PRIME, lambda e, t: n.setdefault("p", e.prime(TPL, task=t).n_tokens))
    qtbot.waitUntil(lambda: bool(n) and dock.view.used_cells == n["p"] and bool(dock.nodes),
                    timeout=10000)
    P = n["p"]
    (S, node), = dock.nodes.items()  # the primed prefix lives in a cache sequence, not 0
    assert S != 0 and node.label == "static prefix" and node.end == P
    assert cell_colours(dock, 0) == {seq_color(S).name()}
    assert cell_colours(dock, P - 1) == {seq_color(S).name()}
    assert cell_colours(dock, P) == {QColor(EMPTY).name()}
    assert dock.grid.tooltip_for(3) == f"cell 3: position 3, seq {S}: static prefix ({P:,} tokens)"
    assert f"seq {S}: static prefix ({P:,} tokens)" in dock.legend.text()
    assert f"{P:,} / 512 cells" in dock.summary.text()
    dock.select_seq(S)  # the cache's sequence: fork it, never change it here
    assert not dock.clear_btn.isEnabled() and not dock.trim_btn.isEnabled()
    assert dock.fork_btn.isEnabled() and "radix cache" in dock.status.text()

    dock.fork_btn.click()
    qtbot.waitUntil(lambda: dock.view.seq(0) is not None, timeout=10000)
    assert dock.view.seq(0).shared_cells == P
    assert cell_colours(dock, 0) == {seq_color(S).name(), seq_color(0).name()}  # hatched
    assert dock.grid.tooltip_for(3).endswith("; also in sequence 0")
    assert dock.grid.tooltip_for(P + 1) == f"cell {P + 1}: empty"
    assert dock.grid.cell_at(dock.grid.cell_rect_center(P + 1)) == P + 1

    Q = 10
    dock.select_seq(0)
    dock.trim_pos.setValue(Q)
    dock.trim_btn.click()
    qtbot.waitUntil(lambda: dock.view.seq(0).cells == Q, timeout=10000)
    assert cell_colours(dock, Q - 1) == {seq_color(S).name(), seq_color(0).name()}
    assert cell_colours(dock, Q) == {seq_color(S).name()}  # the node's alone from Q on

    dock.clear_btn.click()
    qtbot.waitUntil(lambda: dock.view.seq(0) is None, timeout=10000)
    assert cell_colours(dock, 0) == {seq_color(S).name()}


def test_refused_operation_shows_its_message(qtbot, dock):
    dock.worker.submit(JobKind.TASK, lambda e, t: (e.evaluate([5, 6, 7, 8], 1), e.seqs.fork(1, 0)))
    qtbot.waitUntil(lambda: dock.view.seq(0) is not None, timeout=10000)
    dock.select_seq(0)
    dock.shift_delta.setValue(5)
    dock.shift_btn.click()
    qtbot.waitUntil(lambda: "share cells" in dock.status.text(), timeout=10000)


@pytest.mark.parametrize("dock", [False], indirect=True)
def test_ranges_fallback_is_said_and_no_map_is_drawn(qtbot, dock):
    dock.worker.submit(JobKind.TASK, lambda e, t: e.evaluate([5, 6, 7, 8], 0))
    qtbot.waitUntil(lambda: dock.view.seq(0) is not None, timeout=10000)
    assert dock.view.source == "ranges"
    assert "no cell map" in dock.note.text().lower() and dock.note.isVisible()
    assert "? shared" in dock.legend.text() and "positions 0–3" in dock.legend.text()
    assert dock.grid.cell_at(dock.grid.cell_rect_center(0)) is None
    assert dock.grid.tooltip_for(0) == ""


def test_views_arrive_while_a_job_still_runs(qtbot, dock):
    import threading

    gate = threading.Event()

    def job(e, t):
        e.evaluate(list(range(5, 45)), 0)  # 32 + 8 tokens: the engine publishes as it goes
        gate.wait(10)  # hold the job open until the dock has shown the cells
        e.evaluate([5, 6], 0)

    dock.worker.submit(JobKind.PRIME, job)
    try:
        qtbot.waitUntil(lambda: (dock.view.used_cells or 0) >= 32, timeout=10000)
        assert dock.engine_status.busy  # shown live, not after the job
    finally:
        gate.set()
    qtbot.waitUntil(lambda: dock.view.used_cells == 42, timeout=10000)  # the refresh after it


def test_keep_only_empties_the_cache_as_the_flow_does(qtbot, dock):
    """The dock's Keep only is kv_flows.keep_only: the radix cache goes first, so no node is
    left claiming a sequence that lost its cells."""
    dock.worker.submit(JobKind.PRIME, lambda e, t: e.prime(TPL, task=t))
    qtbot.waitUntil(lambda: bool(dock.nodes), timeout=10000)
    (S, _node), = dock.nodes.items()
    dock.select_seq(S)
    dock.fork_btn.click()
    qtbot.waitUntil(lambda: dock.view.seq(0) is not None, timeout=10000)
    dock.select_seq(0)
    assert dock.keep_btn.isEnabled()
    dock.keep_btn.click()
    qtbot.waitUntil(lambda: "keep only: done" in dock.status.text(), timeout=10000)
    assert dock.nodes == {} and [u.seq for u in dock.view.sequences] == [0]
    assert dock.watch.picture.cache.nodes == []
