"""Compose's recomputed share through the engine, each share paired with prefix mode, and the
default share they give (BENCHMARKS.md quotes bench/compose-shares.json; a test checks that
recompute_choice.DEFAULT_SHARE is what ``pick_default`` picks from it).

Each share is one run of the CLI on the example RAG rows:
`kvprimer bench rag.tmpl --rows rag-rows.csv --reuse prefix,compose --recompute P% --json-out F`
(every row runs both modes side by side, so the machine's load weighs on both alike).
`python -m bench.compose_shares F:LOAD0:LOAD1 ...` gathers them, with the load averages at the
start and the end of each run, into bench/compose-shares.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "compose-shares.json"
TIME_GOAL = 0.5  # a default share's warm time against prefix mode's, at most


def share_figures(bench: dict) -> dict:
    """One share's figures from a CLI benchmark's JSON: compose's accuracy columns and its warm
    time against prefix mode's, side by side (median over rows of each row's paired ratio)."""
    s = bench["summary"]
    c = s["compose"]
    pair = s["paired"]["compose_vs_prefix"]
    return {"setting": s["recompute"], "rows": c["rows"],
            "greedy_equal_rows": c["tokens_equal_rows"],
            "kl_median": c["kl_divergence_median"], "kl_max": c["kl_divergence_max"],
            "top1_mean": c["top1_agree_mean"],
            "recomputed_share": c["recompute_share_median"] or 0.0,
            "vs_prefix": pair["ratio"], "paired_rows": pair["rows"],
            "prefix_warm_ms_median": s["prefix"]["warm_ms_median"],
            "compose_warm_ms_median": c["warm_ms_median"]}


def setting_share(setting: str) -> float:
    """"30%" → 0.30."""
    return float(str(setting).rstrip("%")) / 100


def pick_default(shares: list[dict]) -> float:
    """The documented rule: of the shares above 0% within TIME_GOAL of prefix mode's time, the
    most accurate (lowest KL median; ties: the smaller share); none: 0%."""
    fit = [s for s in shares if setting_share(s["setting"]) > 0 and s["vs_prefix"] <= TIME_GOAL]
    if not fit:
        return 0.0
    best = min(fit, key=lambda s: (s["kl_median"], setting_share(s["setting"])))
    return setting_share(best["setting"])


def shares_markdown(data: dict) -> str:
    """BENCHMARKS.md's table of the stored shares and the default they give."""
    out = ["| setting | recomputed | greedy equal | top-1 | KL median | KL max | "
           "compose / prefix, paired | load average |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in data["shares"]:
        out.append(f"| {s['setting']} | {100 * s['recomputed_share']:.0f}% | "
                   f"{s['greedy_equal_rows']} of {s['rows']} | {s['top1_mean']:.2f} | "
                   f"{s['kl_median']:.4f} | {s['kl_max']:.3f} | {s['vs_prefix']:.2f} | "
                   f"{s['loadavg_start']:.1f} → {s['loadavg_end']:.1f} |")
    fit = [s["setting"] for s in data["shares"]
           if setting_share(s["setting"]) > 0 and s["vs_prefix"] <= data["time_goal"]]
    default = f"{100 * data['default_share']:g}%"
    out += ["", f"Within {data['time_goal']:g} of prefix mode's time: "
                f"{', '.join(fit) if fit else 'no share above 0%'}; the default share by the "
                f"rule: {default}. Gathered {data['date_utc']}."]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    shares = []
    for arg in argv:
        path, load0, load1 = arg.split(":")
        bench = json.loads(Path(path).read_text(encoding="utf-8"))
        shares.append({**share_figures(bench), "loadavg_start": float(load0),
                       "loadavg_end": float(load1)})
    shares.sort(key=lambda s: setting_share(s["setting"]))
    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "kvprimer bench resources/examples/rag.tmpl --rows "
                      "resources/examples/rag-rows.csv --reuse prefix,compose --recompute P% "
                      "--repeat 3 -n 16",
           "time_goal": TIME_GOAL, "shares": shares, "default_share": pick_default(shares)}
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
