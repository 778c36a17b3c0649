"""How long the KV dock takes to redraw a 32k-cell, 64-sequence view (a benchmark-style script,
not a test: wall time is reported, never asserted).

    QT_QPA_PLATFORM=offscreen python -m tests.kv_map_timing

Each figure is the median of 20 redraws of a new view (the grid's picture made again from the
cells, the legend and the sequence list rebuilt, then painted), at the whole context and
zoomed in two steps.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> int:
    from dataclasses import replace

    from PySide6.QtWidgets import QApplication

    from app.engine.kv_flows import SeqNode
    from app.ui.engine_worker import EngineWorker
    from app.ui.kv_dock import KvCacheDock
    from tests.engine.kv.test_kv_map_blocks import USED, big_view

    app = QApplication.instance() or QApplication(sys.argv)
    worker = EngineWorker()
    dock = KvCacheDock(worker)
    dock.resize(450, 700)
    dock.show()
    app.processEvents()
    view = big_view()
    nodes = {s: SeqNode(s, f"cached prompt {s}", 0, USED) for s in range(1, 64, 2)}
    out = []
    for zoom in (0, 2):
        dock.grid.set_zoom(zoom)
        times = []
        for i in range(20):
            v = replace(view, used_cells=view.used_cells - i)  # a new picture each time
            t0 = time.perf_counter()
            dock.set_view(v, nodes)
            dock.grid.repaint()  # paint now, as the event loop would
            app.processEvents()
            times.append((time.perf_counter() - t0) * 1000)
        lay = dock.grid.map_layout()
        out.append(f"zoom {zoom}: {lay.k} cells per block, {len(dock.grid.blocks()):,} blocks, "
                   f"{lay.px} px: median {statistics.median(times):.1f} ms, "
                   f"max {max(times):.1f} ms")
    worker.shutdown()
    print("KV dock redraw, 32,768 cells in 64 sequences, 450x700 dock")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
