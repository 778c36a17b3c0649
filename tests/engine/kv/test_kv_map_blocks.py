"""The KV map at the sizes people run: 32k cells in 64 sequences are gathered into blocks the
dock has room for (each drawn by its most common occupant, a mixed block with the next in its
corner), hover names a block's cells and sequences, and zoom halves the cells per block down to
one cell, the map then scrolling. What the painter makes follows the blocks, not the cells."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor

from app.engine.kv import cell_blocks
from app.engine.kv.kv_view import KvCacheView, SeqUsage
from app.engine.kv_flows import SeqNode
from app.ui.kv_grid import EMPTY, seq_color
from app.ui.kv_layout import fit_layout, zoomed
from app.ui.kv_map import KvMap

N_CELLS, N_SEQ, USED = 32768, 64, 497  # each sequence: 512 cells, 497 of them used


def big_view() -> KvCacheView:
    pos = np.full(N_CELLS, -1, dtype=np.int64)
    owners = np.zeros(N_CELLS, dtype=np.uint64)
    seqs = []
    for s in range(N_SEQ):
        a = s * 512
        pos[a:a + USED] = np.arange(USED)
        owners[a:a + USED] = np.uint64(1) << np.uint64(s)
        seqs.append(SeqUsage(s, USED, 0, USED - 1, 0))
    return KvCacheView(N_CELLS, N_SEQ * USED, "debug-log", tuple(seqs), 23040, N_SEQ, "", pos,
                       owners)


def test_blocks_count_each_blocks_occupants():
    keys = np.array([3, 3, 3, -1, 5, 5, 5, 5, -2, -2, 7], dtype=np.int64)
    sec = np.array([0, 0, -1, -1, -1, -1, -1, -1, -1, -1, -1], dtype=np.int64)
    b = cell_blocks.aggregate(keys, sec, 4)
    assert len(b) == 3 and b.cells(2) == (8, 11)
    assert b.first.tolist() == [3, 5, -2] and b.first_count.tolist() == [3, 4, 2]
    assert b.second.tolist() == [-1, cell_blocks.NONE, 7] and b.second_count.tolist() == [1, 0, 1]
    assert b.hatch.tolist() == [0, cell_blocks.NONE, cell_blocks.NONE]  # 2 of block 0's 3 are held by 0 too
    assert cell_blocks.occupants(keys, 0, 4) == [(3, 3), (-1, 1)]
    one = cell_blocks.aggregate(keys, sec, 1)
    assert len(one) == len(keys) and one.first.tolist() == keys.tolist()


@pytest.mark.parametrize("k", [2, 3, 8, 16])
def test_small_blocks_are_counted_as_large_ones_are(k):
    rng = np.random.default_rng(k)
    keys = rng.choice([-2, -1, 0, 1, 5, 63], size=1001).astype(np.int64)
    a, b = cell_blocks._top_two_small(keys, k, -(-1001 // k)), \
        cell_blocks._top_two_counted(keys, k, -(-1001 // k))
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_layouts_fit_the_room_then_zoom_in_to_one_cell_per_block():
    fit = fit_layout(N_CELLS, 420, 300)
    assert fit.k > 1 and fit.height <= 300 and fit.cols * fit.rows * fit.k >= N_CELLS
    assert fit_layout(256, 420, 300).k == 1  # a small context: a square per cell, as before
    assert zoomed(fit, 1, N_CELLS, 420).k == fit.k // 2
    steps = fit.k.bit_length() - 1
    deep = zoomed(fit, steps, N_CELLS, 420)
    assert deep.k == 1 and deep.px == fit.px and deep.height > 300  # it scrolls


@pytest.fixture
def big_map(qtbot):
    m = KvMap()
    qtbot.addWidget(m)
    m.resize(440, 340)
    nodes = {3: SeqNode(3, "static prefix", 0, USED)}
    m.grid.set_view(big_view(), nodes)
    m.show()
    qtbot.waitExposed(m)
    return m


def test_32k_cells_in_64_sequences_draw_as_blocks_with_a_legend_and_hover(qtbot, big_map):
    g = big_map.grid
    lay = g.map_layout()
    blocks = g.blocks()
    assert lay.k > 1 and len(blocks) == -(-N_CELLS // lay.k) < N_CELLS
    assert len(blocks) <= lay.cols * lay.rows
    assert f"1 block = {lay.k:,} cells" in big_map.scale.text()
    assert "whole context" in big_map.scale.text()
    img = g.grab().toImage()
    # what the painter made: pictures no larger than the widget, not one per cell
    assert 1 <= g.images_built <= 3
    # sequence 10's first block is its colour; the block where its cells end is mixed: its
    # most common occupant fills it, the other shows in its corner
    s, k = 10, lay.k
    first = s * 512 // k
    c = g.cell_rect_center(s * 512)
    assert img.pixelColor(c).name() == seq_color(s).name()
    end_block = (s * 512 + USED) // k
    assert blocks.mixed[end_block]
    assert {int(blocks.first[end_block]), int(blocks.second[end_block])} == {s, cell_blocks.EMPTY}
    x0 = (end_block % lay.cols) * lay.px
    y0 = (end_block // lay.cols) * lay.px
    colours = {img.pixelColor(x0 + i, y0 + j).name() for i in range(lay.px - 1)
               for j in range(lay.px - 1)}
    assert {seq_color(s).name(), QColor(EMPTY).name()} <= colours  # mixed: both show
    # hover names the block's cells, positions and who holds them
    tip = g.tooltip_at(c)
    a = first * k
    assert tip.startswith(f"cells {a:,}–{a + k - 1:,} ({k} cells), positions ")
    assert f"sequence {s}: {k} cells" in tip and tip.endswith(f"held by sequence {s}")
    tip3 = g.tooltip_at(g.cell_rect_center(3 * 512))
    assert f"seq 3: static prefix ({USED:,} tokens): {k} cells" in tip3
    end_tip = g.block_tooltip(end_block)
    assert "empty:" in end_tip and f"sequence {s}:" in end_tip
    # a click selects the block's sequence
    assert g.cell_at(c) == s * 512


def test_zoom_halves_the_cells_per_block_and_the_map_scrolls(qtbot, big_map):
    g, m = big_map.grid, big_map
    k0 = g.cells_per_block
    assert not m.zoom_out.isEnabled() and m.zoom_in.isEnabled()
    m.zoom_in.click()
    assert g.cells_per_block == k0 // 2 and "whole context" not in m.scale.text()
    qtbot.waitUntil(lambda: m.scroll.verticalScrollBar().maximum() > 0)
    built = g.images_built
    g.grab()
    assert g.images_built > built  # only the rows shown were drawn: the map is taller
    assert g.height() > m.scroll.viewport().height()
    # Ctrl+= and Ctrl+- on the map; Ctrl+0 shows the whole again
    g.setFocus()
    qtbot.keyClick(g, Qt.Key_Equal, Qt.ControlModifier)
    assert g.cells_per_block == k0 // 4
    qtbot.keyClick(g, Qt.Key_Minus, Qt.ControlModifier)
    assert g.cells_per_block == k0 // 2
    qtbot.keyClick(g, Qt.Key_0, Qt.ControlModifier)
    assert g.cells_per_block == k0 and g.zoom_steps == 0
    # all the way in: one cell per block, and each cell's tooltip is a cell's
    g.set_zoom(g.max_zoom())
    assert g.cells_per_block == 1 and not m.zoom_in.isEnabled()
    assert g.tooltip_at(g.cell_rect_center(3 * 512 + 3)).startswith(
        "cell 1,539: position 3, seq 3: static prefix")
    m.reset_zoom()
    assert g.cells_per_block == k0


def test_ctrl_wheel_zooms_at_the_mouse(qtbot, big_map):
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QWheelEvent

    g, m = big_map.grid, big_map
    k0 = g.cells_per_block
    vp, bar = m.scroll.viewport(), m.scroll.verticalScrollBar()
    at = QPointF(100, 250)
    under = g.cell_at(at.toPoint())
    ev = QWheelEvent(at, vp.mapToGlobal(at), QPoint(0, 0), QPoint(0, 120), Qt.NoButton,
                     Qt.ControlModifier, Qt.NoScrollPhase, False)
    m.scroll.wheelEvent(ev)
    assert g.cells_per_block == k0 // 2
    # the map scrolled so that the cells under the mouse are still there (within a row)
    qtbot.waitUntil(lambda: bar.value() > 0)
    lay = g.map_layout()
    now = g.cell_at(QPoint(100, 250 + bar.value()))
    assert abs(now - under) <= lay.cols * lay.k
