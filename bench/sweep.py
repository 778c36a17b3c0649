"""Prefix-length sweep: cold and warm time to first token as the prefix grows.

The prefixes are the first N tokens of the RAG prefix (N = 256, 512, 1,024, … and the whole
prefix), each followed by the first row's suffix tokens. Each N's state is cut from the full
prefix state (restore, trim to N, snapshot): no extra evaluation. Warm is that state read into
an empty cache and the row run warm from it (ours.warm_state); the limit is the fastest limit
with the first N prefix tokens resident (ours.FastestLimit, the prefix evaluated untimed). The
whole-prefix point reuses the main measurement of that row rather than running its cold path
again.
"""
from __future__ import annotations

from app.engine import PrefixState

from .kvprimer_paths import OurPaths
from .stats import pairwise_ratio, summary
from .workload import Workload, truncated


def run_sweep(ours: OurPaths, full: PrefixState, work: Workload, points, repeats: int,
              main_paths: dict, log) -> list[dict]:
    e, seq = ours.engine, 0  # the user's sequence: free in the bench
    row = work.rows[0]
    out = []
    for n in sorted(p for p in points if 0 < p < row.boundary):
        e.seqs.clear(seq)
        e.restore(full, seq)
        e.seqs.trim(seq, n)
        state_n = e.sequence_state(seq)
        e.seqs.clear(seq)
        out.append(_sweep_point(ours, state_n, truncated(work.prefix, row, n), repeats, log))

    def same_row(name):
        return [s["ms"] for s in main_paths[name] if s["row"] == row.number]

    if same_row("cold"):
        out.append(_point(row.boundary, len(row.suffix), same_row("cold"),
                          same_row("warm_in_place"), same_row("limit"),
                          sorted({s["evaluated"] for s in main_paths["limit"]
                                  if s["row"] == row.number}), len(full.data)))
    return out


def _sweep_point(ours: OurPaths, state_n: PrefixState, r, repeats: int, log) -> dict:
    n = r.boundary
    cold, warm, limit, evaluated = [], [], [], set()
    for k in range(repeats):
        c = ours.cold_from(r, list(range(0, n, ours.engine.config.n_batch)))
        lim = ours.limit(r)
        w = ours.warm_state(state_n, r)
        cold.append(c.ms)
        limit.append(lim.ms)
        warm.append(w.ms)
        evaluated |= {lim.evaluated, w.evaluated}
        log(f"sweep prefix {n}: repeat {k + 1}/{repeats}: cold {c.ms:.0f}, "
            f"limit {lim.ms:.0f}, warm {w.ms:.0f} ms")
    ours.engine.cache.clear()  # the main paths' prefix is primed again when next asked for
    return _point(n, len(r.suffix), cold, warm, limit, sorted(evaluated), len(state_n.data))


def _point(n, suffix, cold, warm, limit, evaluated, state_bytes) -> dict:
    return {"prefix_tokens": n, "suffix_tokens": suffix, "evaluated": evaluated,
            "state_bytes": state_bytes, "cold": summary(cold), "warm": summary(warm),
            "limit": summary(limit), "cold_vs_warm": pairwise_ratio(cold, warm),
            "warm_vs_limit": pairwise_ratio(warm, limit),
            "cold_ms": cold, "warm_ms": warm, "limit_ms": limit}
