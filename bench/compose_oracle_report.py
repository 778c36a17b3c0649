"""The compose-oracle section's table (BENCHMARKS.md renders it from results.json's
"compose_oracle", pinned by tests/docs/test_doc_figures.py) and its chart (PNG, QPainter offscreen
like bench/chart.py): greedy tokens equal to cold, next-token KL median and warm time against
prefix mode's, each against the recomputed share, one line per way of choosing."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from .chart import titled_picture
from .compose_oracle_run import GOALS

NAMES = {"oracle": "oracle (true K/V deviation, all layers)",
         "layer1_v": "layer-1 V deviation (CacheBlend's scoring pass)",
         "first_k": "first k of each module (EPIC)"}
COLORS = {"oracle": "#1e8449", "layer1_v": "#2471a3", "first_k": "#c0392b"}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _row(label: str, c: dict) -> str:
    recall = f"{c['oracle_recall']:.2f}" if "oracle_recall" in c else ""
    return (f"| {label} | {_pct(c['recomputed_share'])} | {_pct(c['greedy_equal'])} | "
            f"{c['top1_mean']:.2f} | {c['kl_median']:.4f} | {c['kl_max']:.3f} | "
            f"{c['time_vs_prefix']:.2f} | {c['runs_median']:g} | {recall} |")


def oracle_markdown(sec: dict, chart: str = "bench/results-compose-oracle.png") -> str:
    """BENCHMARKS.md's compose-oracle table and goals, every figure as results.json has it."""
    s = sec["summary"]
    out = [f"![greedy-equal, KL and time against the recomputed share]({chart})", "",
           "| chosen by, share | recomputed | greedy equal | top-1 | KL median | KL max | "
           "time / prefix | runs | oracle recall |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
           _row("plain compose (0%)", s["plain"])]
    for m, pts in s["curves"].items():
        for share, c in pts.items():
            out.append(_row(f"{m} {_pct(float(share))}", c))
    out.append(_row("every module token (100%)", s["full"]))
    out += ["", f"{s['rows']} rows; full recompute bit-identical to the cold run on "
            f"{s['full_bit_identical']} of {s['rows']}. Time / prefix: the median over rows of "
            "the run's time to the first token's logits over prefix mode's on the same row "
            "(the layer-1 rows with their scoring pass's time added). Runs: decode calls of "
            "recomputed tokens, median."]
    parts = sec.get("parts") or [sec]
    out.append("Ran " + "; ".join(
        f"{p['date_utc']}, {p['duration_s']:,.0f} s, load average {p['loadavg_start'][0]} at "
        f"the start and {p['loadavg_end'][0]} at the end" for p in parts)
        + (f" ({len(parts)} processes side by side, each a part of the rows)"
           if len(parts) > 1 else "")
        + f"; prefix mode's two measurements on a row differed by "
          f"{_pct(s['prefix_drift_median'])} (median).")
    if s.get("layer1_rank_corr_median") is not None:
        out.append(f"Rank correlation of the layer-1 V deviation with the oracle's, median over "
                   f"rows: {s['layer1_rank_corr_median']:.2f}.")
    if s.get("score_vs_prefix_median") is not None:
        agree = [v for r in sec["rows"] for v in r.get("score_agrees", {}).values()]
        out.append(f"The scoring pass (layers 0-1 of every token after the prefix) took "
                   f"{s['score_vs_prefix_median']:.3f} of prefix mode's time (median over rows; "
                   f"{statistics.median(r['score_ms'] for r in sec['rows']):.0f} ms); its choice "
                   f"equals the cold run's layer-1 V's on {_pct(statistics.fmean(agree))} of "
                   "the tokens chosen.")
    out += [""] + best_points(s)
    if sec.get("shift_once", {}).get("rows"):
        out += ["", shift_once_line(sec["shift_once"])]
    out += ["", "| goal | figure | met by |", "|---|---:|---|"]
    for key, label in (("greedy_equal", "greedy tokens equal to cold"),
                       ("kl_median", "next-token KL, median"),
                       ("time_vs_prefix", "warm time / prefix mode's")):
        goal = (f"≥ {_pct(GOALS[key])}" if key == "greedy_equal" else f"≤ {GOALS[key]}")
        met = [f"{m} {_pct(float(sh))}" for m, pts in s["curves"].items() for sh, c in pts.items()
               if (c[key] >= GOALS[key] if key == "greedy_equal" else c[key] <= GOALS[key])]
        out.append(f"| {label} | {goal} | {', '.join(met) or 'no point'} |")
    best = {m: g["smallest_share_meeting_all"] for m, g in s["goals"].items()}
    out += ["", "All three goals at once: " + "; ".join(
        f"{m} {_pct(float(v)) if v else 'at no share measured'}" for m, v in best.items()) + "."]
    return "\n".join(out)


def shift_once_line(probe: dict) -> str:
    """The shift-once probe (bench/compose_oracle_shift.py) in one paragraph."""
    rows = probe["rows"]
    cells = [c for r in rows for c in r["cells"].values()]
    keys = sorted({k for r in rows for k in r["cells"]})
    med = {k: (statistics.median(r["cells"][k]["each_vs_prefix"] for r in rows),
               statistics.median(r["cells"][k]["once_vs_prefix"] for r in rows)) for k in keys}
    same = sum(c["each_equal"] == c["once_equal"] for c in cells)
    return (f"Shifting every module once per row (`python -m bench.compose_oracle_shift`, rows "
            f"{', '.join(str(r['number']) for r in rows)}, {probe['date_utc']}, load average "
            f"{probe['loadavg_start']}): time / prefix, each part shifted in turn → once: "
            + ", ".join(f"{k.replace('@', ' ')} {a:.2f} → {b:.2f}" for k, (a, b) in med.items())
            + f" (medians; the layer-1 choice from the cold run's layer-1 V, no scoring pass "
              f"counted); greedy-equal the same either way on {same} of {len(cells)} runs.")


def best_points(s: dict) -> list[str]:
    """One line per way of choosing: its best greedy-equal share and its lowest KL median, with
    the share and time they took, against plain compose's."""
    p = s["plain"]
    out = [f"- plain compose: greedy equal on {_pct(p['greedy_equal'])} of rows, KL median "
           f"{p['kl_median']:.4f}, time {p['time_vs_prefix']:.2f} of prefix mode's;"]
    for m, pts in s["curves"].items():
        eq_share, eq = max(pts.items(), key=lambda kv: (kv[1]["greedy_equal"], -float(kv[0])))
        kl_share, kl = min(pts.items(), key=lambda kv: (kv[1]["kl_median"], float(kv[0])))
        out.append(f"- {m}: at best greedy equal on {_pct(eq['greedy_equal'])} of rows (at "
                   f"{_pct(float(eq_share))}, time {eq['time_vs_prefix']:.2f}); lowest KL median "
                   f"{kl['kl_median']:.4f} (at {_pct(float(kl_share))}, time "
                   f"{kl['time_vs_prefix']:.2f});")
    out[-1] = out[-1][:-1] + "."
    return out


# ---- the chart -----------------------------------------------------------------------------

W, H = 1500, 560
PANELS = (("greedy_equal", "greedy tokens equal to cold (share of rows)", False),
          ("kl_median", "next-token KL, median (log)", True),
          ("time_vs_prefix", "warm time / prefix mode's, median", False))


def render_oracle_chart(sec: dict, path: Path) -> Path:
    from PySide6.QtCore import QRectF

    s = sec["summary"]
    title = (f"KV Primer compose with a recomputed share: {s['rows']} recurring rows, "
             f"{sec['date_utc']}; plain compose at 0%, goals dashed")
    with titled_picture(path, W, H, title) as p:
        width = (W - 40) / len(PANELS)
        for i, panel in enumerate(PANELS):
            _panel(p, s, panel, QRectF(20 + i * width, 40, width - 20, H - 60))
    return path


def _panel(p, s: dict, panel, r):
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QPen

    key, title, log = panel
    series = {m: [(0.0, s["plain"][key])] + [(float(sh), c[key]) for sh, c in pts.items()]
              for m, pts in s["curves"].items()}
    ys = [y for pts in series.values() for _, y in pts] + [GOALS[key]]
    xmax = max(x for pts in series.values() for x, _ in pts)
    if log:
        ys = [max(y, 1e-5) for y in ys]
        y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        y1 = max(y1, y0 + 1)
    else:
        y0, y1 = 0.0, (1.0 if key == "greedy_equal" else math.ceil(max(ys) * 1.1 * 4) / 4)
    p.setPen(QColor("black"))
    p.drawText(QRectF(r.left(), r.top(), r.width(), 20), Qt.AlignmentFlag.AlignLeft, title)
    plot = QRectF(r.left() + 55, r.top() + 30, r.width() - 70, r.height() - 150)

    def fy(y):
        v = (math.log10(max(y, 1e-5)) - y0) / (y1 - y0) if log else (y - y0) / (y1 - y0)
        return plot.bottom() - plot.height() * v

    def at(x, y):
        return QPointF(plot.left() + plot.width() * x / xmax, fy(y))

    p.drawRect(plot)
    ticks = [10.0 ** e for e in range(y0, y1 + 1)] if log else [y1 * k / 5 for k in range(6)]
    for t in ticks:
        p.setPen(QColor("#dddddd"))
        p.drawLine(QPointF(plot.left(), fy(t)), QPointF(plot.right(), fy(t)))
        p.setPen(QColor("black"))
        p.drawText(QRectF(r.left(), fy(t) - 8, 50, 16), Qt.AlignmentFlag.AlignRight,
                   f"{t:g}" if log else f"{t:.2f}")
    for x in sorted({x for pts in series.values() for x, _ in pts}):
        p.drawText(QRectF(at(x, ticks[0]).x() - 20, plot.bottom() + 4, 40, 16),
                   Qt.AlignmentFlag.AlignHCenter, _pct(x))
    p.drawText(QRectF(plot.left(), plot.bottom() + 22, plot.width(), 16),
               Qt.AlignmentFlag.AlignHCenter, "module tokens recomputed")
    p.setPen(QPen(QColor("#555555"), 1.5, Qt.PenStyle.DashLine))
    p.drawLine(QPointF(plot.left(), fy(GOALS[key])), QPointF(plot.right(), fy(GOALS[key])))
    for j, (m, pts) in enumerate(series.items()):
        p.setPen(QPen(QColor(COLORS.get(m, "#7f8c8d")), 2.5))
        prev = None
        for x, y in pts:
            pt = at(x, y)
            if prev is not None:
                p.drawLine(prev, pt)
            p.drawEllipse(pt, 3.5, 3.5)
            prev = pt
        ly = plot.bottom() + 46 + j * 20
        p.drawLine(QPointF(plot.left(), ly + 6), QPointF(plot.left() + 24, ly + 6))
        p.setPen(QColor("black"))
        p.drawText(QRectF(plot.left() + 30, ly - 2, plot.width() - 30, 18),
                   Qt.AlignmentFlag.AlignLeft, NAMES.get(m, m))
