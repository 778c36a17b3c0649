"""The benchmark's ratios, and whether each meets the goal the project sets for it.

Time ratios are medians of per-(row, repeat) ratios: every path's samples are stored in the same
order (repeat by repeat, row by row), so index i of one path pairs with index i of another. The
reuse section's mode ratios pair each row's warm time in one mode with the same row's in prefix
mode (reuse_bench.py), and its peer ratios each row's warm time in one mode with the same row's
time to first token on a peer (reuse_peers.py).
"""
from __future__ import annotations

import statistics

from .stats import goal_met, pairwise_ratio

GOALS = {  # upper bounds the project sets itself
    "warm_vs_fastest_limit": 1.05,
    "warm_vs_llamacpp_ram": 0.9,
    "warm_vs_llamacpp_disk": 0.9,
    # the reuse section's peers (reuse_peers.py); llamacpp_ram is the natively built one
    "chain_vs_llamacpp_ram_recurring": 0.8,
    "chain_vs_llama_server_recurring": 1.0,
    "state_bytes_vs_raw_kv": 1.01,
    "q8_0_state_bytes_vs_raw_kv": 1.01,
    # the reuse section (reuse_bench.py)
    "chain_vs_prefix_warm": 0.85,
    "chain_vs_prefix_static_rows": 1.02,  # chain is no slower where it reuses only the prefix
    "compose_vs_prefix_warm": 0.45,
    "warm_in_place_vs_fastest_limit_recurring": 1.05,
    # the busy-machine section (busy_machine.py): auto batch threads cost nothing on a quiet
    # machine and at least halve a batch's time when other programs keep every core busy
    "quiet_auto_vs_all_cores": 1.02,
    "busy_auto_vs_all_cores": 0.5,
}

# name: the mode whose warm time per row is divided by prefix mode's for the same row
MODE_RATIOS = {"chain_vs_prefix_warm": "chain", "compose_vs_prefix_warm": "compose"}

# the reuse section's peers: name in the ratios ("<mode>_vs_<name>_recurring") -> the key of
# their rows in the section's results (reuse_peers.py)
PEERS = {
    "llamacpp_ram": "llamacpp_ram_native_recurring",  # built as `pip install` builds it here
    "llamacpp_ram_project": "llamacpp_ram_recurring",  # the project's portable build
    "llama_server": "llama_server_recurring",  # defaults, over HTTP
}

# name: (numerator path, denominator path)
# "limit" is the fastest suffix evaluation llama.cpp can do here (ours.FastestLimit);
# "limit_cache_context" the old limit, in the cache's shared context with small batches.
TIME_RATIOS = {
    "warm_vs_fastest_limit": ("warm_in_place", "limit"),
    "warm_copy_vs_fastest_limit": ("warm_memory", "limit"),
    "warm_vs_limit": ("warm_memory", "limit_cache_context"),
    "limit_cache_context_vs_fastest_limit": ("limit_cache_context", "limit"),
    "warm_file_vs_limit": ("warm_file", "limit"),
    "warm_vs_llamacpp_ram": ("warm_memory", "llamacpp_ram"),
    "warm_vs_llamacpp_disk": ("warm_file", "llamacpp_disk"),
    "cold_vs_warm": ("cold", "warm_in_place"),
    "limit_vs_llamacpp_in_context": ("limit", "llamacpp_in_context"),
    "warm_vs_llamacpp_in_context": ("warm_in_place", "llamacpp_in_context"),
    "llamacpp_ram_vs_limit": ("llamacpp_ram", "limit"),
    "llamacpp_disk_vs_limit": ("llamacpp_disk", "limit"),
    "q8_0_warm_vs_limit": ("q8_0_warm_memory", "q8_0_limit"),
    "q8_0_warm_file_vs_limit": ("q8_0_warm_file", "q8_0_limit"),
    "q8_0_warm_vs_f16_warm": ("q8_0_warm_memory", "warm_memory"),
}

# The caches' own fixed cost, measured inside each sample, so the shared suffix evaluation
# (and most of the machine's noise) is left out: ours = engine.restore (+ reading the .kvstate
# file), theirs = the cache lookup + Llama.load_state.
FIXED_COST_RATIOS = {
    "restore_cost_vs_llamacpp_ram": ("warm_memory", "llamacpp_ram"),
    "restore_cost_vs_llamacpp_disk": ("warm_file", "llamacpp_disk"),
}

SIZE_RATIOS = {
    "state_bytes_vs_raw_kv": ("state_file_bytes", "raw_kv_bytes"),
    "state_bytes_vs_llamacpp_ram_entry": ("state_file_bytes", "llamacpp_ram_entry_bytes"),
    "state_bytes_vs_llamacpp_disk_entry": ("state_file_bytes", "llamacpp_disk_entry_bytes"),
    "q8_0_state_bytes_vs_raw_kv": ("q8_0_state_file_bytes", "q8_0_raw_kv_bytes"),
    "q8_0_state_bytes_vs_f16_state": ("q8_0_state_file_bytes", "state_file_bytes"),
}


def _ms(paths: dict, name: str) -> list[float] | None:
    return [s["ms"] for s in paths[name]] if name in paths else None


def _fixed_ms(paths: dict, name: str) -> list[float] | None:
    return [s["load_ms"] + s["restore_ms"] for s in paths[name]] if name in paths else None


def compute_ratios(results: dict) -> tuple[dict, dict]:
    paths, sizes = results.get("paths", {}), results.get("sizes", {})
    ratios: dict[str, float | None] = {}
    for name, (a, b) in TIME_RATIOS.items():
        xa, xb = _ms(paths, a), _ms(paths, b)
        if xa is not None and xb is not None:
            ratios[name] = pairwise_ratio(xa, xb)
    for name, (a, b) in FIXED_COST_RATIOS.items():
        xa, xb = _fixed_ms(paths, a), _fixed_ms(paths, b)
        if xa is not None and xb is not None:
            ratios[name] = pairwise_ratio(xa, xb)
    for name, (a, b) in SIZE_RATIOS.items():
        if sizes.get(a) and sizes.get(b):
            ratios[name] = sizes[a] / sizes[b]
    return ratios, goals_of(ratios)


def goals_of(ratios: dict) -> dict:
    """Each ratio of ``ratios`` that has a goal, with its bound and whether it is met."""
    return {name: {"goal": f"<= {bound}", "value": ratios.get(name),
                   "met": goal_met(ratios.get(name), bound)}
            for name, bound in GOALS.items() if name in ratios}


def _ok(rows: list[dict], mode: str) -> dict[int, dict]:
    return {r["row"]: r for r in rows if r["reuse"] == mode and r.get("error") is None}


def mode_vs_prefix(rows: list[dict], mode: str, keep=lambda ours, prefix: True) -> float | None:
    """Median over rows of ``mode``'s warm time / prefix mode's warm time on the same row (the
    rows where ``keep(mode's row, prefix mode's row)``)."""
    base, other = _ok(rows, "prefix"), _ok(rows, mode)
    both = [r for r in sorted(set(base) & set(other)) if keep(other[r], base[r])]
    return pairwise_ratio([other[r]["warm_ms"] for r in both],
                          [base[r]["warm_ms"] for r in both]) if both else None


def _prefix_only(chain: dict, prefix: dict) -> bool:
    """Chain reused no more than prefix mode on a row: only the static prefix."""
    return chain["reused_tokens"] <= prefix["reused_tokens"]


def static_row_numbers(rows: list[dict]) -> list[int]:
    """The rows where chain reused only the static prefix (both modes ran them)."""
    base, chain = _ok(rows, "prefix"), _ok(rows, "chain")
    return [r for r in sorted(set(base) & set(chain)) if _prefix_only(chain[r], base[r])]


def static_rows_ratio(rows: list[dict]) -> float | None:
    """chain / prefix mode over the rows where chain reused no more than prefix mode (only the
    static prefix): what chain's segment batches cost where its cache has nothing more to give.
    (Each mode ran its rows in a phase of its own: machine drift between phases included.)"""
    return mode_vs_prefix(rows, "chain", _prefix_only)


def static_rows_paired(pairs: dict | None) -> float | None:
    """The same question from ABBA pairs of warm runs on those rows (reuse_bench.py): chain /
    prefix per pair, median; None when the section has no pairs."""
    if not pairs or not pairs.get("chain_ms"):
        return None
    return pairwise_ratio(pairs["chain_ms"], pairs["prefix_ms"])


def compute_reuse_ratios(reuse: dict) -> tuple[dict, dict]:
    """The reuse section's ratios (and goals) from its bench rows and resident-fork samples."""
    rows = reuse.get("rows", [])
    ratios: dict[str, float | None] = {name: mode_vs_prefix(rows, mode)
                                       for name, mode in MODE_RATIOS.items()}
    fork = reuse.get("warm_in_place")
    if fork:
        ratios["warm_in_place_vs_fastest_limit_recurring"] = pairwise_ratio(fork["fork_ms"],
                                                                           fork["limit_ms"])
    # the goal's figure from paired runs where the section made them, else from the phases
    paired = static_rows_paired(reuse.get("static_pairs"))
    ratios["chain_vs_prefix_static_rows_phases"] = static_rows_ratio(rows)
    ratios["chain_vs_prefix_static_rows"] = (paired if paired is not None
                                             else ratios["chain_vs_prefix_static_rows_phases"])
    for peer_name, key in PEERS.items():
        peer = {r["row"]: r for r in reuse.get(key, [])}
        for mode in ("prefix", "chain", "compose"):
            ours = _ok(rows, mode)
            both = sorted(set(ours) & set(peer))
            if both:
                ratios[f"{mode}_vs_{peer_name}_recurring"] = pairwise_ratio(
                    [ours[r]["warm_ms"] for r in both], [peer[r]["ttft_ms"] for r in both])
    return ratios, goals_of(ratios)


def compose_accuracy(rows: list[dict], mode: str = "compose") -> dict:
    """What composing modules costs in accuracy, over the rows the mode ran: shares of the
    three verdicts, the next-token KL divergence, top-1 agreement, greedy tokens equal."""
    ok = list(_ok(rows, mode).values())
    if not ok:
        return {"rows": 0}
    n = len(ok)
    kl = [r["kl_divergence"] for r in ok]
    top1 = [r["top1_agree"] for r in ok]
    diff = [r["max_logit_diff"] for r in ok]
    return {
        "rows": n,
        "bit_identical": sum(r["equivalence"] == "bit-identical" for r in ok) / n,
        "within_noise": sum(r["equivalence"] == "within-noise" for r in ok) / n,
        "diverged": sum(r["equivalence"] == "diverged" for r in ok) / n,
        "kl_median": statistics.median(kl), "kl_max": max(kl),
        "top1_agree_mean": statistics.fmean(top1), "top1_agree_min": min(top1),
        "tokens_equal": sum(bool(r["tokens_equal"]) for r in ok) / n,
        "max_logit_diff_median": statistics.median(diff), "max_logit_diff_max": max(diff),
        "first_diff": [r["first_diff"] for r in ok],
    }
