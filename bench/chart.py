"""The PNG chart, drawn with QPainter offscreen (PySide6 is already a dependency; matplotlib is
not). Left: median time to first token of every warm path and the limit, with min-max whiskers.
Right: the prefix-length sweep, cold and warm time to first token against prefix length. Below,
when the reuse section ran: warm time to first token per row in each reuse mode."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from .report import LABELS

# the bar labels, short enough for the chart's label column (report.LABELS has the long ones)
SHORT = {"limit": "fastest limit", "warm_in_place": "ours warm, kept in place",
         "warm_memory": "ours warm, copied from cache", "warm_file": "ours warm, from .kvstate",
         "limit_cache_context": "old limit (shared context)"}
COLORS = {"cold": "#c0392b", "warm": "#2471a3", "limit": "#7f8c8d"}
MODE_COLORS = {"prefix": "#7f8c8d", "chain": "#2471a3", "compose": "#d68910"}
# the reuse section's peers (reuse_peers.py), drawn dashed: key of their rows, legend, colour
PEER_SERIES = (("llamacpp_ram_native_recurring", "llama-cpp-python native", "#922b21"),
               ("llamacpp_ram_recurring", "llama-cpp-python", "#c39bd3"),
               ("llama_server_recurring", "llama-server", "#1e8449"))
W, H = 1500, 640
H_REUSE = 420


def _app():
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    # a QApplication (not QGuiApplication): widget tests may share this process
    return QApplication.instance() or QApplication([])


@contextmanager
def titled_picture(path: Path, width: int, height: int, title: str):
    """A white picture with ``title`` on its first line: the block paints on the painter it
    gets, and the picture is written to ``path`` after it."""
    app = _app()  # noqa: F841 - fonts need a GUI application object
    from PySide6.QtCore import QRectF, Qt
    from PySide6.QtGui import QColor, QFont, QImage, QPainter

    img = QImage(width, height, QImage.Format.Format_ARGB32)
    img.fill(QColor("white"))
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setFont(QFont("DejaVu Sans", 10))
    p.drawText(QRectF(20, 8, width - 40, 24), Qt.AlignmentFlag.AlignLeft, title)
    try:
        yield p
    finally:
        p.end()
    if not img.save(str(path)):
        raise OSError(f"could not write {path}")


def render_chart(res: dict, path: Path) -> Path:
    from PySide6.QtCore import QRectF

    rz = res.get("reuse") if isinstance(res.get("reuse"), dict) and res["reuse"].get("rows") else None
    m = res["machine"]
    n = res["workload"]["prefix_tokens"]
    title = (f"KV Primer bench: {res['model']['name']}, RAG example ({n}-token prefix), "
             f"{m['nproc']} cores {m['cpu_model']}, {m['date_utc']}")
    with titled_picture(path, W, H + (H_REUSE if rz else 0), title) as p:
        _bars(p, res, QRectF(20, 50, 780, H - 70))
        if res.get("sweep"):
            _sweep(p, res["sweep"], QRectF(860, 50, W - 880, H - 70))
        if rz:
            _reuse(p, rz, QRectF(20, H + 10, W - 40, H_REUSE - 30))
    return path


def _bars(p, res, r):
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QPen

    sums = {k: v for k, v in res["summaries"].items() if k != "cold"}
    cold = res["summaries"].get("cold")
    head = "Time to first token, median ms (whiskers: min-max)"
    if cold:
        head += f"; cold: {cold['median']:,.0f} ms"
    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.top(), r.width(), 20), Qt.AlignmentFlag.AlignLeft, head)
    label_w, top = 270, r.top() + 34
    xmax = max(s["max"] for s in sums.values()) * 1.1
    plot_w = r.width() - label_w - 60
    bar_h = min(36.0, (r.height() - 60) / max(len(sums), 1) - 8)
    for i, (name, s) in enumerate(sums.items()):
        y = top + i * (bar_h + 8)
        color = QColor(COLORS["limit"] if "limit" in name else
                       "#d68910" if name.startswith("llamacpp") else COLORS["warm"])
        p.setPen(QColor("black"))
        p.drawText(QRectF(r.left(), y, label_w - 8, bar_h),
                   Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                   SHORT.get(name, LABELS.get(name, name)))
        x0 = r.left() + label_w
        p.fillRect(QRectF(x0, y, plot_w * s["median"] / xmax, bar_h), color)
        p.setPen(QPen(QColor("black"), 1.5))
        ymid = y + bar_h / 2
        p.drawLine(QPointF(x0 + plot_w * s["min"] / xmax, ymid),
                   QPointF(x0 + plot_w * s["max"] / xmax, ymid))
        p.drawText(QRectF(x0 + plot_w * s["max"] / xmax + 6, y, 80, bar_h),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, f"{s['median']:.0f}")
    ratios = res.get("ratios", {})
    notes = [f"{k} {v:.3f}" for k, v in ratios.items() if v is not None and k in (
        "warm_vs_fastest_limit", "warm_vs_llamacpp_ram", "warm_vs_llamacpp_disk",
        "state_bytes_vs_raw_kv")]
    m = res["machine"]
    notes.append(f"(load average {m.get('loadavg_start')} -> {m.get('loadavg_end')}, "
                 f"CPU share {m.get('cpu_share')})")
    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.bottom() - 40, r.width() + 600, 40), Qt.AlignmentFlag.AlignLeft,
               "   ".join(notes[:4]) + "\n" + notes[-1])


def _sweep(p, pts, r):
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QPen

    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.top(), r.width(), 20), Qt.AlignmentFlag.AlignLeft,
               "Prefix-length sweep: time to first token (median ms)")
    plot = QRectF(r.left() + 60, r.top() + 40, r.width() - 80, r.height() - 100)
    xmax = max(q["prefix_tokens"] for q in pts) * 1.05
    ymax = max(q["cold"]["median"] for q in pts) * 1.1
    p.drawRect(plot)
    for k in range(6):  # y grid and labels
        v = ymax * k / 5
        y = plot.bottom() - plot.height() * k / 5
        p.setPen(QColor("#dddddd"))
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(QColor("black"))
        p.drawText(QRectF(r.left(), y - 8, 55, 16), Qt.AlignmentFlag.AlignRight, f"{v:,.0f}")
    for q in pts:
        x = plot.left() + plot.width() * q["prefix_tokens"] / xmax
        p.drawText(QRectF(x - 30, plot.bottom() + 4, 60, 16), Qt.AlignmentFlag.AlignHCenter,
                   str(q["prefix_tokens"]))
    p.drawText(QRectF(plot.left(), plot.bottom() + 24, plot.width(), 16),
               Qt.AlignmentFlag.AlignHCenter, "prefix tokens (then the same suffix)")
    for key in ("cold", "warm", "limit"):
        p.setPen(QPen(QColor(COLORS[key]), 2.5))
        prev = None
        for q in pts:
            pt = QPointF(plot.left() + plot.width() * q["prefix_tokens"] / xmax,
                         plot.bottom() - plot.height() * q[key]["median"] / ymax)
            if prev is not None:
                p.drawLine(prev, pt)
            p.drawEllipse(pt, 3.5, 3.5)
            prev = pt
    for i, key in enumerate(("cold", "warm", "limit")):
        y = plot.top() + 10 + i * 20
        p.fillRect(QRectF(plot.left() + 12, y, 14, 10), QColor(COLORS[key]))
        p.setPen(QColor("black"))
        p.drawText(QRectF(plot.left() + 32, y - 4, 200, 18), Qt.AlignmentFlag.AlignLeft,
                   {"cold": "cold", "warm": "ours warm (restore)", "limit": "limit"}[key])


def _reuse(p, rz, r):
    """Warm time to first token per row (x: rows in file order), one line per reuse mode."""
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QPen

    rows = [x for x in rz["rows"] if x.get("error") is None]
    order = sorted({x["row"] for x in rows})
    ratios = rz.get("ratios", {})
    acc = rz.get("compose_accuracy", {})
    head = ("Reuse modes and peers on " + rz["settings"]["rows_file"] + ": time to first token "
            "per row (ms); " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()
                                         if v is not None and k in rz.get("goals", {})))
    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.top(), r.width(), 20), Qt.AlignmentFlag.AlignLeft, head)
    if acc.get("rows"):
        p.drawText(QRectF(r.left(), r.top() + 20, r.width(), 20), Qt.AlignmentFlag.AlignLeft,
                   f"compose accuracy: bit-identical {acc['bit_identical']:.0%}, within-noise "
                   f"{acc['within_noise']:.0%}, diverged {acc['diverged']:.0%}; KL median "
                   f"{acc['kl_median']:.3g}, max {acc['kl_max']:.3g}; top-1 agreement "
                   f"{acc['top1_agree_mean']:.0%}; greedy tokens equal {acc['tokens_equal']:.0%}")
    if not order:
        return
    series = [(mode, {x["row"]: x["warm_ms"] for x in rows if x["reuse"] == mode},
               MODE_COLORS.get(mode, "black"), Qt.PenStyle.SolidLine)
              for mode in rz["settings"]["modes"]]
    series += [(label, {x["row"]: x["ttft_ms"] for x in rz[key]}, color, Qt.PenStyle.DashLine)
               for key, label, color in PEER_SERIES if rz.get(key)]
    plot = QRectF(r.left() + 60, r.top() + 50, r.width() - 260, r.height() - 80)
    ymax = max(v for _, pts, _, _ in series for v in pts.values()) * 1.1 or 1.0
    p.drawRect(plot)
    for k in range(5):
        v = ymax * k / 4
        y = plot.bottom() - plot.height() * k / 4
        p.setPen(QColor("#dddddd"))
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(QColor("black"))
        p.drawText(QRectF(r.left(), y - 8, 55, 16), Qt.AlignmentFlag.AlignRight, f"{v:,.0f}")
    step = plot.width() / max(len(order), 1)
    for i, row in enumerate(order):
        p.drawText(QRectF(plot.left() + step * (i + 0.5) - 20, plot.bottom() + 4, 40, 16),
                   Qt.AlignmentFlag.AlignHCenter, str(row))
    for j, (label, pts, color, style) in enumerate(series):
        p.setPen(QPen(QColor(color), 2.5, style))
        prev = None
        for i, row in enumerate(order):
            if row not in pts:
                prev = None
                continue
            pt = QPointF(plot.left() + step * (i + 0.5),
                         plot.bottom() - plot.height() * pts[row] / ymax)
            if prev is not None:
                p.drawLine(prev, pt)
            p.drawEllipse(pt, 3.5, 3.5)
            prev = pt
        y = plot.top() + 10 + j * 20
        p.fillRect(QRectF(plot.right() + 16, y, 14, 10), QColor(color))
        p.setPen(QColor("black"))
        p.drawText(QRectF(plot.right() + 36, y - 4, 160, 18), Qt.AlignmentFlag.AlignLeft, label)
