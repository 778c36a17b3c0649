"""The scale section's chart (PNG, QPainter offscreen like bench/chart.py): time to first token
against prefix length, both axes logarithmic, one panel per model; cold and warm (RAM tier,
.kvstate file), the fastest limit, and the peers' warm paths dashed."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from .chart import titled_picture

# (label, colour, dashed, the run's median ms or None)
SERIES = (
    ("cold", "#c0392b", False, lambda r: r["ours"]["cold"]["ttft_ms"]),
    ("ours warm, RAM tier", "#2471a3", False, lambda r: _med(r["ours"]["samples"]["ram"])),
    ("ours warm, .kvstate", "#5dade2", False, lambda r: _med(r["ours"]["samples"]["state_file"])),
    ("fastest limit", "#7f8c8d", False, lambda r: _med(r["ours"]["samples"]["limit"])),
    ("llama-cpp-python cold", "#922b21", True, lambda r: (r.get("llamacpp") or {}).get(
        "cold", {}).get("ttft_ms")),
    ("LlamaRAMCache", "#c39bd3", True, lambda r: _med((r.get("llamacpp") or {}).get("llamacpp_ram"))),
    ("llama-server slot restore", "#1e8449", True,
     lambda r: _med((r.get("llama_server") or {}).get("slot_restore"))),
)
W, PANEL_H = 1500, 560


def _med(samples):
    return statistics.median(s["ttft_ms"] for s in samples) if samples else None


def render_scale_chart(sc: dict, path: Path) -> Path:
    from PySide6.QtCore import QRectF

    runs = [r for r in sc["runs"] if "error" not in r]
    models = list(dict.fromkeys(r["model"] for r in runs))
    m = sc["machine"]
    title = (f"KV Primer scale section: time to first token against prefix length (log-log), "
             f"{m['nproc']} cores {m['cpu_model']}, {m['date_utc']}")
    apart: dict[str, list[str]] = {}  # runs added from another run of the section, by model
    for r in runs:
        if r.get("measured_apart"):
            apart.setdefault(r["model"], []).append(r["label"])
    if apart:  # their dates are in the report: the line stays within the picture
        each = "; ".join(f"{model} {', '.join(labels)}" for model, labels in apart.items())
        title += f" ({each} apart)"
    with titled_picture(path, W, 60 + PANEL_H, title) as p:
        width = (W - 40) / max(len(models), 1)
        for i, model in enumerate(models):
            _panel(p, model, [r for r in runs if r["model"] == model],
                   QRectF(20 + i * width, 40, width - 20, PANEL_H))
    return path


def _panel(p, model: str, runs: list[dict], r):
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QPen

    runs = sorted(runs, key=lambda x: x["ours"]["prefix_tokens"])
    pts = {label: [(x["ours"]["prefix_tokens"], fn(x)) for x in runs if fn(x)]
           for label, _, _, fn in SERIES}
    xs = [x for series in pts.values() for x, _ in series]
    ys = [y for series in pts.values() for _, y in series]
    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.top(), r.width(), 20), Qt.AlignmentFlag.AlignLeft, model)
    if not xs:
        return
    plot = QRectF(r.left() + 60, r.top() + 30, r.width() - 80, r.height() - 190)
    x0, x1 = math.log2(min(xs)) - 0.3, math.log2(max(xs)) + 0.3
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    y1 = max(y1, y0 + 1)

    def at(x, y):
        return QPointF(plot.left() + plot.width() * (math.log2(x) - x0) / (x1 - x0),
                       plot.bottom() - plot.height() * (math.log10(y) - y0) / (y1 - y0))

    p.drawRect(plot)
    for e in range(y0, y1 + 1):  # a grid line per power of ten
        y = plot.bottom() - plot.height() * (e - y0) / (y1 - y0)
        p.setPen(QColor("#dddddd"))
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(QColor("black"))
        p.drawText(QRectF(r.left(), y - 8, 55, 16), Qt.AlignmentFlag.AlignRight,
                   f"{10 ** e:,} ms" if e < 3 else f"{10 ** (e - 3):,} s")
    for x in sorted(set(xs)):
        px = at(x, 10 ** y0).x()
        p.drawText(QRectF(px - 30, plot.bottom() + 4, 60, 16), Qt.AlignmentFlag.AlignHCenter,
                   f"{x:,}")
    p.drawText(QRectF(plot.left(), plot.bottom() + 22, plot.width(), 16),
               Qt.AlignmentFlag.AlignHCenter, "prefix tokens (then the same question)")
    for j, (label, color, dashed, _) in enumerate(SERIES):
        style = Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine
        p.setPen(QPen(QColor(color), 2.5, style))
        prev = None
        for x, y in pts[label]:
            pt = at(x, y)
            if prev is not None:
                p.drawLine(prev, pt)
            p.drawEllipse(pt, 3.5, 3.5)
            prev = pt
        ly = plot.bottom() + 46 + (j % 4) * 20
        lx = plot.left() + (j // 4) * plot.width() / 2
        p.setPen(QPen(QColor(color), 2.5, style))
        p.drawLine(QPointF(lx, ly + 6), QPointF(lx + 24, ly + 6))
        p.setPen(QColor("black"))
        p.drawText(QRectF(lx + 30, ly - 2, 260, 18), Qt.AlignmentFlag.AlignLeft, label)
