"""The scale section (bench/scale.py) in words: the text `make bench` prints, and the Markdown
section of BENCHMARKS.md (`python -m bench.scale_report [results.json]` prints it, for the doc
to be written from a stored run, never by hand)."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _med(samples: list[dict] | None, key: str = "ttft_ms") -> float | None:
    return statistics.median(s[key] for s in samples) if samples else None


def _ms(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _r(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _gbs(nbytes: int, ms: float | None) -> str:
    return "-" if not ms else f"{nbytes / ms / 1e6:.2f}"


def _mb(n) -> str:
    return "-" if not n else f"{n / 1e6:,.0f}" if n >= 1e7 else f"{n / 1e6:,.2f}"


def _spread(x, lo, hi) -> str:
    """A median and the range of its samples: "1.19 (1.10–1.25)"."""
    return "-" if x is None else f"{x:.2f} ({lo:.2f}–{hi:.2f})"


def _load(m: dict) -> str:
    """The machine's load over the run: what was recorded (a run stopped early has no end)."""
    return (f"load average {m.get('loadavg_start')}"
            + (f" -> {m['loadavg_end']}" if m.get("loadavg_end") is not None else "")
            + (f", CPU share {m['cpu_share']}" if m.get("cpu_share") is not None else ""))


def run_rows(sc: dict) -> list[dict]:
    """One dict of display figures per run (failed runs: their error)."""
    rows = []
    for r in sc["runs"]:
        if "error" in r:
            rows.append({"run": f"{r['model']} {r['label']}", "error": r["error"]})
            continue
        o, s = r["ours"], r["ours"]["samples"]
        p = r.get("llamacpp") or {}
        q = r.get("llama_server") or {}
        nbytes = o["sizes"]["state_bytes"]
        ram_restore = _med(s["ram"], "restore_ms")
        file_restore = (statistics.median(x["load_ms"] + x["restore_ms"] for x in s["state_file"])
                        if s["state_file"] else None)
        lim = o["limits"]
        from .scale import file_floor

        floor = file_floor(o)
        verdicts = [v for vs in o["verdicts"].values() for v in vs] + [o["first_verdict"]]
        rows.append({
            "run": f"{r['model']} {r['label']}", "prefix": o["prefix_tokens"],
            "suffix": o["suffix_tokens"], "n_ctx": r["n_ctx"], "cold": o["cold"]["ttft_ms"],
            "resident": _med(s["resident"]), "ram": _med(s["ram"]),
            "file_tier": _med(s["file_tier"]), "state_file": _med(s["state_file"]),
            "cached_vs_limit": r["ratios"].get("warm_file_cached_vs_limit"),
            "limit": _med(s["limit"]), "prime": o["prime_ms"],
            "state_mb": _mb(o["sizes"]["state_file_bytes"]),
            "state_vs_raw": r["ratios"].get("state_bytes_vs_raw_kv"),
            "ram_restore": ram_restore, "ram_gbs": _gbs(nbytes, ram_restore),
            "memcpy_gbs": _gbs(nbytes, lim["memcpy_ms"]),
            "file_restore": file_restore, "file_gbs": _gbs(nbytes, file_restore),
            "read_cold_gbs": _gbs(nbytes, lim["read_cold_ms"]),
            "read_cached_gbs": _gbs(nbytes, lim["read_cached_ms"]),
            "dropped": lim["page_cache_dropped"],
            # warm from the file against the limit plus a read of the same bytes (its floor)
            "floor": _spread(floor["ratio"], floor["min"], floor["max"]),
            "floor_read_gbs": _gbs(nbytes, floor["read_ms"]),
            "floor_paired": floor["paired_read"], "floor_samples": len(s["state_file"]),
            "rss_ours": _mb(o["peak_rss"]["run"]),
            # what the RAM tier held then (its kept copies included): part of our RSS
            "ram_tier_mb": _mb(sum(t["used_bytes"] for t in o["tiers_after_run"]
                                   if t["name"] == "ram")),
            "rss_plain": _mb((p.get("peak_rss") or {}).get("plain")),
            "bit_identical": f"{sum(v == 'bit-identical' for v in verdicts)}/{len(verdicts)}",
            "plain_cold": (p.get("cold") or {}).get("ttft_ms"),
            "llamacpp_ram": _med(p.get("llamacpp_ram")),
            "llamacpp_disk": _med(p.get("llamacpp_disk")),
            "server_cache_ram": _med(q.get("cache_ram")),
            "server_reused": (q.get("cache_ram") or [{}])[0].get("reused_tokens"),
            "server_slot": _med(q.get("slot_restore")),
            "peer_errors": "; ".join(f"{k}: {v[e]}" for k, v in
                                     (("llama-cpp-python", p), ("llama-server", q))
                                     for e in ("error", "cache_ram_error", "slot_restore_error")
                                     if e in v),
            "path_errors": "; ".join(f"{k}: {v}" for k, v in (o.get("errors") or {}).items()),
            # a prefix over the resident tier's cap waits in the RAM tier between runs
            "resident_from": sorted({x.get("from_tier", "resident") for x in s["resident"]}),
            "kernels": o["kernels"],
        })
    return rows


def _per_run(rows: list[dict], title: str, line) -> list[str]:
    """A blank line, ``title``, then ``line(row)`` for each run that did not fail."""
    return ["", title] + [f"  {x['run']:<24} {line(x)}" for x in rows if "error" not in x]


def format_scale(sc: dict) -> str:
    m, st = sc["machine"], sc["settings"]
    lines = [f"Scale section: {', '.join(f'{k} ({v})' for k, v in st['models'].items())}",
             f"threads {st['n_threads']}, n_batch {st['n_batch']}, {st['repeats']} warm samples "
             f"per path, {st['max_tokens']} tokens generated; {_load(m)}",
             "", f"{'run':<24} {'prefix':>6} {'n_ctx':>6} {'cold ms':>9} {'resident':>9} "
             f"{'RAM tier':>9} {'file tier':>9} {'.kvstate':>9} {'limit':>8} {'state MB':>8} "
             f"{'/raw KV':>7} {'RSS MB':>7} {'plain':>6} {'exact':>6}"]
    if apart := _apart(sc):
        lines.insert(2, apart)
    rows = run_rows(sc)
    for x in rows:
        if "error" in x:
            lines.append(f"{x['run']:<24} failed: {x['error']}")
            continue
        lines.append(f"{x['run']:<24} {x['prefix']:>6} {x['n_ctx']:>6} {_ms(x['cold']):>9} "
                     f"{_ms(x['resident']):>9} {_ms(x['ram']):>9} {_ms(x['file_tier']):>9} "
                     f"{_ms(x['state_file']):>9} {_ms(x['limit']):>8} {x['state_mb']:>8} "
                     f"{_r(x['state_vs_raw'], 4):>7} {x['rss_ours']:>7} {x['rss_plain']:>6} "
                     f"{x['bit_identical']:>6}")
        if x["path_errors"]:
            lines.append(f"{'':<24} failed: {x['path_errors']}")
        if x["resident_from"] and x["resident_from"] != ["resident"]:
            lines.append(f"{'':<24} its \"resident\" runs found the prefix in: "
                         f"{', '.join(x['resident_from'])} (over the resident tier's cap)")
    lines += _per_run(rows, "restore (GB/s): RAM tier vs memcpy of the same bytes; .kvstate load "
                      "vs a sequential read of a file of its size (page cache dropped / cached)",
                      lambda x: f"RAM {x['ram_gbs']} vs memcpy {x['memcpy_gbs']}; file "
                                f"{x['file_gbs']} vs read {x['read_cold_gbs']} / cached "
                                f"{x['read_cached_gbs']}"
                                + ("" if x["dropped"] else " (page cache NOT dropped)"))
    lines += _per_run(rows, "warm from a .kvstate / its floor (the limit + a sequential read of the "
                      "same bytes, page cache dropped): median of the repeats' ratios (their range)",
                      lambda x: f"{x['floor']} over {x['floor_samples']} samples; read "
                                f"{x['floor_read_gbs']} GB/s; from the page cache, / limit "
                                f"{_r(x['cached_vs_limit'], 2)}"
                                + ("" if x["floor_paired"] else " (one read at the run's end, "
                                   "not paired)"))
    lines += _per_run(rows, "peers on the same prompts (time to first token, ms): plain "
                      "llama-cpp-python cold, LlamaRAMCache, LlamaDiskCache; llama-server "
                      "--cache-ram (tokens reused), slot restore",
                      lambda x: f"cold {_ms(x['plain_cold'])}, RAM {_ms(x['llamacpp_ram'])}, "
                                f"disk {_ms(x['llamacpp_disk'])}; server cache-ram "
                                f"{_ms(x['server_cache_ram'])} ({x['server_reused']}), slot "
                                f"{_ms(x['server_slot'])}"
                                + (f"  [{x['peer_errors']}]" if x["peer_errors"] else ""))
    lines += ["", f"{'goal (real sizes)':<92} {'value':>8} {'goal':>9}  verdict (worst run)"]
    for g in sc.get("goal_rows", []):
        verdict = "-" if g["met"] is None else "met" if g["met"] else "MISSED"
        if g.get("floor"):
            verdict += f" (this disk's floor alone: {g['floor']:.2f})"
        lines.append(f"{g['figure']:<92} {_r(g['value'], 4):>8} {g['goal']:>9}  {verdict} "
                     f"({g['worst']})")
    est = sc.get("full_run_estimate")
    if est:
        lines.append("" if est.get("seconds") is None else
                     f"\nestimated duration of the full scale run (sizes {est['sizes']}): "
                     f"about {est['seconds'] / 60:.0f} min at this run's speed"
                     + (f" (about {est['quiet_seconds'] / 60:.0f} min on a quiet machine: this "
                        f"run got {m.get('cpu_share')} of its cores)" if est.get("quiet_seconds")
                        else "") + "; "
                     f"16k on the 1B shape (--scale-1b-sizes 2048,8192,16384) would add about "
                     f"{est['extra_1b_16k_seconds'] / 60:.0f} min")
        if est.get("seconds") is None:
            lines.append(f"full run: no estimate ({est['note']})")
    lines.append(f"scale section {sc.get('duration_s')} s")
    return "\n".join(lines)


def scale_markdown(sc: dict, chart: str = "bench/results-scale.png") -> str:
    """BENCHMARKS.md's scale section, every figure as results.json stores it."""
    m, apart = sc["machine"], _apart(sc)
    out = ["## Real sizes (`scale`; `bench/scale.py`)", "",
           f"Models: {'; '.join(f'`{k}`: {v}' for k, v in sc['settings']['models'].items())}. "
           f"{m['nproc']} cores {m['cpu_model']}, {m['date_utc']}, {_load(m)}."
           + (f" Not run: {sc['not_run']}." if sc.get("not_run") else "")
           + (f" {apart}" if apart else ""),
           "", f"![time to first token against prefix length]({chart})", "",
           "| run | prefix | n_ctx | cold ms | warm resident | RAM tier | file tier | .kvstate "
           "| limit | state / raw KV | peak RSS MB (plain) | bit-identical |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = run_rows(sc)
    for x in rows:
        if "error" in x:
            out.append(f"| {x['run']} | failed: {x['error']} |||||||||||")
            continue
        out.append(f"| {x['run']} | {x['prefix']:,} | {x['n_ctx']:,} | {_ms(x['cold'])} | "
                   f"{_ms(x['resident'])} | {_ms(x['ram'])} | {_ms(x['file_tier'])} | "
                   f"{_ms(x['state_file'])} | {_ms(x['limit'])} | {_r(x['state_vs_raw'], 4)} | "
                   f"{x['rss_ours']} ({x['rss_plain']}; RAM tier {x['ram_tier_mb']}) | "
                   f"{x['bit_identical']} |")
    failed = [f"{x['run']}: {x['path_errors']}" for x in rows if x.get("path_errors")]
    if failed:
        out += ["", "Paths that failed: " + "; ".join(failed) + "."]
    out += ["", "| run | RAM restore GB/s (memcpy) | file load GB/s (read, dropped / cached) "
            "| .kvstate / floor (range) | .kvstate cached / limit | LlamaRAMCache ms "
            "| LlamaDiskCache ms | llama-server cache-ram ms | slot restore ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows:
        if "error" not in x:
            out.append(f"| {x['run']} | {x['ram_gbs']} ({x['memcpy_gbs']}) | {x['file_gbs']} "
                       f"({x['read_cold_gbs']} / {x['read_cached_gbs']}) | {x['floor']} | "
                       f"{_r(x['cached_vs_limit'], 2)} | {_ms(x['llamacpp_ram'])} | "
                       f"{_ms(x['llamacpp_disk'])} | {_ms(x['server_cache_ram'])} | "
                       f"{_ms(x['server_slot'])} |")
    measured = [x for x in rows if "error" not in x]
    unpaired = [x["run"] for x in measured if not x["floor_paired"]]
    out += ["", ".kvstate / floor: the warm run from a `.kvstate` against the limit plus a "
            "sequential read of the same bytes from a dropped page cache, per repeat; the median "
            "and the range of the repeats. .kvstate cached / limit: the same load again right "
            "after, the file in the page cache (`run --state` again soon after), against the "
            "limit: the median of the repeats' ratios"
            + ("" if not unpaired else " (samples without a read of their own, "
               + ("every run's" if len(unpaired) == len(measured) else ", ".join(unpaired))
               + ": the read of a file of the same size at the run's end)") + "."]
    out += ["", "| goal (real sizes) | value | goal | verdict | worst run |", "|---|---:|---|---|---|"]
    for g in sc.get("goal_rows", []):
        verdict = "-" if g["met"] is None else "met" if g["met"] else "**missed**"
        if g.get("floor"):
            verdict += f" (this disk's floor alone: {g['floor']:.2f})"
        out.append(f"| {g['figure']} | {_r(g['value'], 4)} | {g['goal'].replace('<=', '≤')} | "
                   f"{verdict} | {g['worst']} |")
    return "\n".join(out) + "\n"


APART_KEYS = ("nproc", "cpu_model", "date_utc", "loadavg_start", "loadavg_end", "cpu_share")


def add_runs(sc: dict, other: dict, source: str) -> None:
    """The runs of ``other`` (a scale section stored by another run) into ``sc``, each in place
    of a run of the same model and size, carrying where and under what load it was measured
    (``measured_apart``: the report says so beside the tables). Its failed runs are not taken.
    The caller rescores ``sc``."""
    import copy

    from .scale import MODEL_1B, MODEL_32K, ScaleConfig, plan

    for run in other["runs"]:
        if "error" in run:
            continue
        run = copy.deepcopy(run)
        run["measured_apart"] = {"source": source,
                                 **{k: other["machine"].get(k) for k in APART_KEYS},
                                 "duration_s": other.get("duration_s"),
                                 "peers": bool(run.get("llamacpp") or run.get("llama_server"))}
        same = (run["model"], run["target"])
        sc["runs"] = [r for r in sc["runs"] if (r["model"], r["target"]) != same] + [run]
    st = sc["settings"]
    st["sizes"] = sorted({r["target"] for r in sc["runs"] if r["model"] == MODEL_32K})
    st["sizes_1b"] = sorted({r["target"] for r in sc["runs"] if r["model"] == MODEL_1B})
    order = {key: i for i, key in enumerate(plan(ScaleConfig(sizes=tuple(st["sizes"]),
                                                             sizes_1b=tuple(st["sizes_1b"]))))}
    sc["runs"].sort(key=lambda r: order.get((r["model"], r["target"]), len(order)))


def _apart(sc: dict) -> str:
    """Which runs were measured apart from the section's own run, and how."""
    parts = []
    for r in sc["runs"]:
        a = r.get("measured_apart")
        if a:
            parts.append(f"{r['model']} {r['label']} from `{a['source']}` ({a['nproc']} cores "
                         f"{a['cpu_model']}, {a['date_utc']}, {_load(a)}"
                         + ("" if a["peers"] else "; peers not run") + ")")
    return ("Measured apart and added to this run (`python -m bench.scale_report --add-runs`): "
            + "; ".join(parts) + ".") if parts else ""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None


def main(argv=None) -> int:
    """`python -m bench.scale_report [--rescore] [--add-runs FILE] [results.json]`: the Markdown
    of a stored scale section; --rescore first computes its ratios and goals again from its
    figures (bench/scale.py's rescore) and writes them back, top-level scale_* entries included;
    --add-runs first puts FILE's scale runs in place of the same model and size (add_runs)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.scale_report")
    ap.add_argument("results", nargs="?", type=Path,
                    default=Path(__file__).resolve().parent / "results.json")
    ap.add_argument("--rescore", action="store_true")
    ap.add_argument("--add-runs", type=Path, metavar="FILE")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    path = args.results
    try:
        results = _read_json(path)
        other_results = _read_json(args.add_runs) if args.add_runs else None
    except (OSError, ValueError) as e:
        print(f"cannot read {e.filename if isinstance(e, OSError) else 'a results file'}: "
              f"{e.strerror if isinstance(e, OSError) else e}", file=sys.stderr)
        return 1
    sc = results.get("scale")
    if not sc or "runs" not in sc:
        print(f"{path} has no scale section; run `python -m bench --only-scale` first",
              file=sys.stderr)
        return 1
    if args.add_runs:
        other = other_results.get("scale")
        if not other or "runs" not in other:
            print(f"{args.add_runs} has no scale section to add", file=sys.stderr)
            return 1
        try:
            source = args.add_runs.resolve().relative_to(Path(__file__).resolve().parents[1])
        except ValueError:
            source = args.add_runs
        add_runs(sc, other, source.as_posix())
    if args.rescore or args.add_runs:
        from .scale import rescore

        for key in ("ratios", "goals"):  # this section's old entries, then its new ones
            top = results.setdefault(key, {})
            for k in [k for k in top if k in sc.get(key, {})]:
                del top[k]
        rescore(sc)
        results["ratios"].update(sc["ratios"])
        results["goals"].update(sc["goals"])
        path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(scale_markdown(sc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
