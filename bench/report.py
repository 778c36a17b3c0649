"""The stdout table, and the summaries results.json keeps next to the raw samples."""
from __future__ import annotations

import re

from .stats import summary

LABELS = {
    "cold": "cold (whole prompt, empty sequence)",
    "limit": "fastest limit (plain context, prefix resident, suffix only)",
    "limit_cache_context": "old limit (cache's shared context, small batches)",
    "warm_in_place": "ours warm, prefix kept in the work context",
    "warm_memory": "ours warm, prefix copied from the radix cache",
    "warm_file": "ours warm, from .kvstate file",
    "llamacpp_ram": "llama-cpp-python LlamaRAMCache",
    "llamacpp_disk": "llama-cpp-python LlamaDiskCache",
    "llamacpp_in_context": "llama-cpp-python in-context reuse",
    "q8_0_warm_memory": "ours q8_0 KV warm, from memory",
    "q8_0_limit": "q8_0 KV limit",
    "q8_0_warm_file": "ours q8_0 KV warm, from file",
}


def path_summaries(paths: dict) -> dict:
    out = {}
    for name, samples in paths.items():
        s = summary([x["ms"] for x in samples])
        s["evaluated_tokens"] = sorted({x["evaluated"] for x in samples})
        for extra in ("restore_ms", "load_ms"):
            vals = [x[extra] for x in samples if x[extra]]
            if vals:
                s[extra + "_median"] = summary(vals)["median"]
        out[name] = s
    return out


def _mb(n) -> str:
    return f"{n / 1e6:,.1f} MB" if n else "-"


def _r(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_report(res: dict) -> str:
    m, st, w = res["machine"], res["settings"], res["workload"]
    lines = [
        f"KV Primer bench: {res['model']['name']} on {m['cpu_model']} ({m['nproc']} cores), "
        f"{m['date_utc']}",
        f"threads {st['n_threads']}, n_batch = n_ubatch {st['n_batch']}, n_ctx {st['n_ctx']}, "
        f"{st.get('flash_attn', 'flash attention: not recorded')}; {st['repeats']} repeats x "
        f"{len(w['rows'])} rows; load average "
        f"{m['loadavg_start']} -> {m.get('loadavg_end')}, CPU share {m.get('cpu_share')}",
        f"prefix {w['prefix_tokens']} tokens; rows (tokens/boundary/suffix): " + ", ".join(
            f"{r['row']}: {r['tokens']}/{r['boundary']}/{r['suffix_tokens']}" for r in w["rows"]),
        "",
        f"{'time to first token':<40} {'median ms':>10} {'min-max ms':>17} {'evaluated':>10}",
    ]
    for name, s in res["summaries"].items():
        rng = f"{s['min']:.0f}-{s['max']:.0f}"
        ev = ",".join(str(x) for x in s["evaluated_tokens"])
        extra = ""
        if "load_ms_median" in s:
            extra += f"  (load {s['load_ms_median']:.0f} ms)"
        if "restore_ms_median" in s:
            extra += f"  (restore {s['restore_ms_median']:.1f} ms)"
        lines.append(f"{LABELS.get(name, name):<40} {s['median']:>10.0f} {rng:>17} {ev:>10}{extra}")
    same = res["same_suffix_tokens"]
    lines.append("every path evaluated the same suffix tokens: " + ("yes" if same["ok"] else
                 "NO: " + "; ".join(same["mismatches"][:5])))
    lines += ["", f"{'ratio (median of pairwise)':<40} {'value':>10} {'goal':>10}  verdict"]
    goals = res["goals"]
    for name, v in res["ratios"].items():
        g = goals.get(name)
        verdict = "" if g is None else ("met" if g["met"] else "MISSED")
        lines.append(f"{name:<40} {_r(v):>10} {g['goal'] if g else '':>10}  {verdict}")
    sz = res["sizes"]
    lines += ["", "sizes: " + ", ".join(f"{k} {_mb(sz.get(k))}" for k in (
        "state_file_bytes", "raw_kv_bytes", "llamacpp_ram_entry_bytes",
        "llamacpp_disk_entry_bytes", "q8_0_state_file_bytes", "q8_0_raw_kv_bytes") if k in sz)]
    if "llamacpp_ram_entry_parts" in sz:
        lines.append("  LlamaRAMCache entry = " + " + ".join(
            f"{k} {_mb(v)}" for k, v in sz["llamacpp_ram_entry_parts"].items()))
    lines += ["", "equivalence against cold f16 (same batch boundary), first "
              f"{st['equivalence_tokens']} greedy tokens and first-token logits:"]
    for row, per in res["equivalence"].items():
        for name, e in per.items():
            if name == "cold":
                continue
            lines.append(f"  row {row} {name:<22} tokens equal {str(e['tokens_equal']):<5} "
                         f"max |dlogit| {e['max_abs_logit_diff']:.4g}")
    rp = res.get("restore_probe")
    if rp:
        lines += ["", "restore cost ({prefix_tokens} tokens, {state_bytes:,} bytes): file load "
                  "{file_load_ms:.1f} ms, engine.restore {engine_restore_ms:.1f} ms, "
                  "llama_state_seq_set_data in place {set_data_in_place_ms:.1f} ms / after a "
                  "ctypes copy {set_data_after_copy_ms:.1f} ms, state_get {state_get_ms:.1f} ms"
                  .format(**rp)]
    if res.get("sweep"):
        lines += ["", f"{'sweep: prefix tokens':<22} {'cold ms':>9} {'warm ms':>9} "
                  f"{'limit ms':>9} {'cold/warm':>10} {'warm/limit':>11}"]
        for p in res["sweep"]:
            lines.append(f"{p['prefix_tokens']:<22} {p['cold']['median']:>9.0f} "
                         f"{p['warm']['median']:>9.0f} {p['limit']['median']:>9.0f} "
                         f"{_r(p['cold_vs_warm']):>10} {_r(p['warm_vs_limit']):>11}")
    lines.append(f"\nmain paths, restore probe and sweep: {m.get('duration_s')} s")
    return "\n".join(lines)


def format_reuse(rz: dict) -> str:
    """The reuse section's table (reuse_bench.py)."""
    st = rz["settings"]
    lines = [f"reuse section: {rz['summary']['rows']} rows of {st['rows_file']} with "
             f"{st['template']}, n_ctx {st['n_ctx']}, {st['max_tokens']} tokens generated per run",
             f"{'mode':<10} {'warm ms':>9} {'cold ms':>9} {'reused':>7} {'evaluated':>10}  verdicts"]
    for mode in st["modes"]:
        m = rz["summary"].get(mode) or {}
        if m.get("warm_ms_median") is None:
            continue
        verdicts = ", ".join(f"{n} {w}" for w, n in m["equivalence"].items() if n)
        lines.append(f"{mode:<10} {m['warm_ms_median']:>9.1f} {m['cold_ms_median']:>9.0f} "
                     f"{m['reused_tokens_median']:>7.0f} {m['evaluated_tokens_median']:>10.0f}  "
                     f"{verdicts}")
    f = rz.get("warm_in_place")
    if f:
        lines.append(f"prefix mode warm {f['fork']['median']:.1f} ms (lookup + keep "
                     f"{f['lookup_and_fork_ms']['median']:.2f} ms) vs fastest limit "
                     f"{f['limit']['median']:.1f} ms, {f['fork']['n']} pairs; bit-identical: "
                     f"{'yes' if f['bit_identical'] else 'NO'}")
    lines += peer_lines(rz)
    ce = rz.get("chain_exact", {})
    if ce.get("rows"):
        lines.append(f"chain: {ce['bit_identical_rows']}/{ce['rows']} rows bit-identical to cold")
    a = rz.get("compose_accuracy", {})
    if a.get("rows"):
        lines.append(
            f"compose accuracy over {a['rows']} rows: bit-identical {a['bit_identical']:.0%}, "
            f"within-noise {a['within_noise']:.0%}, diverged {a['diverged']:.0%}; KL median "
            f"{a['kl_median']:.3g} max {a['kl_max']:.3g}; top-1 agreement {a['top1_agree_mean']:.0%}"
            f" (min {a['top1_agree_min']:.0%}); greedy tokens equal {a['tokens_equal']:.0%}")
    lines.append(f"{'ratio':<40} {'value':>10} {'goal':>10}  verdict")
    for name, v in rz["ratios"].items():
        g = rz["goals"].get(name)
        verdict = "" if g is None else ("met" if g["met"] else "MISSED")
        lines.append(f"{name:<40} {_r(v):>10} {g['goal'] if g else '':>10}  {verdict}")
    lines.append(f"reuse section {rz.get('duration_s')} s")
    return "\n".join(lines)


PEER_LABELS = {  # reuse_peers.py: the peer's name -> what it is
    "llamacpp_ram_native": "llama-cpp-python built natively, LlamaRAMCache",
    "llamacpp_ram": "llama-cpp-python (this project's build), LlamaRAMCache",
    "llama_server": "llama-server, its defaults, over HTTP",
}


def peer_lines(rz: dict) -> list[str]:
    """One line per peer of the reuse section: its median time to first token on the same rows
    in order, what it reused, or why it did not run."""
    lines = []
    for name, label in PEER_LABELS.items():
        rows, info = rz.get(f"{name}_recurring"), rz.get(name) or {}
        if info.get("error"):
            lines.append(f"{label}: not run ({info['error']})")
        elif rows:
            ms = summary([r["ttft_ms"] for r in rows])["median"]
            reused = summary([r["reused_tokens"] or 0 for r in rows])["median"]
            lines.append(f"{label}: median {ms:.1f} ms to the first token, median reused "
                         f"{reused:.0f} tokens, {len(rows)} rows in order")
            if info.get("system_info"):
                lines.append("  its CPU backend: " + " ".join(cpu_features(info["system_info"])))
            if info.get("slots"):
                lines.append(f"  {info['slots']} slot(s), n_ctx {info['n_ctx']}")
    return lines


def cpu_features(system_info: str) -> list[str]:
    """The CPU features llama.cpp says its library was built with ("AVX512 = 1" -> AVX512)."""
    return re.findall(r"(\w+) = 1", system_info)
