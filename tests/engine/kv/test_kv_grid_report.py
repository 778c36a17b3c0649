"""The KV grid draws cells whose owners llama.cpp does not report apart: striped grey, with a
legend line and a tooltip that says so (never a guessed sequence colour)."""
import numpy as np
from PySide6.QtGui import QColor

from app.engine.kv.kv_view import KvCacheView, SeqUsage
from app.ui.kv_grid import EMPTY, UNREPORTED, KvGrid, seq_color


def test_unreported_cells_are_striped_grey_with_a_legend_line(qtbot):
    n = 256
    pos = np.full(n, -1, dtype=np.int64)
    pos[:10] = np.arange(10)
    owners = np.zeros(n, dtype=np.uint64)
    owners[:5] = 1 << 3
    unreported = np.zeros(n, dtype=bool)
    unreported[5:10] = True
    view = KvCacheView(n, 10, "debug-log", (SeqUsage(3, 10, 0, 9, 0),), 512, 8,
                       "5 cells: owner not reported", pos, owners, cell_unreported=unreported)
    g = KvGrid()
    qtbot.addWidget(g)
    g.resize(420, 300)
    g.set_view(view)
    g.show()
    qtbot.waitExposed(g)
    img = g.grab().toImage()
    cs, cols, _rows = g.cell_size()

    def colours(cell):
        x0, y0 = (cell % cols) * cs, (cell // cols) * cs
        return {img.pixelColor(x0 + i, y0 + j).name() for i in range(cs - 1) for j in range(cs - 1)}

    assert colours(7) == {QColor(c).name() for c in UNREPORTED}
    assert colours(2) == {seq_color(3).name()} and colours(20) == {QColor(EMPTY).name()}
    assert "owners not reported" in g.tooltip_for(7) and "sequence 3" in g.tooltip_for(2)
    assert g.unreported_line().startswith("▨ owner not reported: 5 used cells") and g.bottom() > 0
    g.set_view(KvCacheView(n, 5, "debug-log", (), 512, 8, "", pos, owners))
    assert g.unreported_line() == "" and g.bottom() == 0
