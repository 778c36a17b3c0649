"""The compose-oracle section of `make bench`: how close to the cold run a composed cache gets
when a share of its tokens is recomputed in context, chosen three ways (compose_oracle_select).

For every recurring row (rag-recurring.csv, default model): the cold run (its K and V read back),
plain compose (every module's cached cells, its K and V read back too, so the true deviation of
every module token at every layer is known), then for every share and method the composed cache
with the chosen tokens recomputed, 8 greedy tokens from each. Accuracy against the cold run:
greedy tokens equal, top-1 agreement and the largest next-token KL over the compared positions
(app.engine.runs.verdict.compare_runs, as the reuse section judges compose). Time: from the
prefix's cells to the first token's logits, against prefix mode's on the same row, measured
before and after the row's composed runs (their mean), as a per-row ratio. Full recompute is
run too: it must equal the cold run bit for bit (the assembly's own check).

The layer-1 signal comes from a scoring pass (compose_oracle_score.py): layers 0 and 1 of every
token after the prefix, in a context of its own, timed like the runs and added to that method's
time; the row also records how often its choice equals the one the cold run's layer-1 V gives.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from app.engine import Template, read_rows
from app.engine.llama.model_files import default_model_path
from app.engine.llama.native import NativeModel, ensure_backend
from app.engine.prompts.prompt_segments import prompt_segments
from app.engine.prompts.prompt_tokens import PromptTokenizer
from app.engine.runs.verdict import compare_runs
from app.resources_path import examples_dir

from .compose_oracle import PREFIX, OracleContext, RowPlan, deviation, layer_rows
from .compose_oracle_score import ScoringContext, scored
from .compose_oracle_select import METHODS, choose, recall

SHARES = (0.05, 0.10, 0.15, 0.20, 0.30)
ORACLE_MORE = (0.5,)  # the oracle alone further along: where the curve would reach the goals
GOALS = {"greedy_equal": 0.95, "kl_median": 0.005, "time_vs_prefix": 0.5}


@dataclass(frozen=True)
class OracleConfig:
    rows: int = 48
    first: int = 0  # the first row to run (0: the file's first), to split a run in parts
    scoring_pass: bool = True  # the layer-1 signal from a scoring pass (else the cold run's)
    shares: tuple[float, ...] = SHARES
    methods: tuple[str, ...] = METHODS
    oracle_more: tuple[float, ...] = ORACLE_MORE
    max_tokens: int = 8  # greedy tokens per run, as the reuse section's
    n_ctx: int = 4096
    n_batch: int = 256
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    flash_attn: bool = False  # the kernel the engine measured fastest here (BENCHMARKS.md)
    model_path: str | None = None
    template_path: str | None = None  # None: resources/examples/rag.tmpl
    rows_path: str | None = None  # None: resources/examples/rag-recurring.csv


def plan_rows(model: NativeModel, tpl: Template, rows) -> tuple[list[int], list[RowPlan]]:
    """The static prefix (as the first row has it) and every row's plan: each segment between
    the static prefix and the last one is a module."""
    tok = PromptTokenizer(model)
    plans = []
    for row in rows:
        toks = tok.tokenize(tpl.fill(row.values))
        segs = prompt_segments(tok.tokenize, tpl, row.values, toks)
        plans.append(RowPlan(row.number, toks, segs[0].end,
                             tuple((s.start, s.end) for s in segs[1:-1])))
    return plans[0].tokens[:plans[0].prefix_len], plans


def measure_row(oc: OracleContext, plan: RowPlan, shares, methods, max_tokens: int,
                oracle_more=(), scorer: ScoringContext | None = None) -> dict:
    """One row: the cold run, plain compose, full recompute, and every share x method; with
    ``scorer``, the layer-1 signal comes from its scoring pass (timed like the runs)."""
    layer1 = score_ms = None
    if scorer is not None:
        v1, score_ms = scorer.layer1_v(plan)
        layer1 = scored(v1, plan, [layer_rows(oc.module(plan.tokens[s:e]).first_stream, 1, "v")
                                   for s, e in plan.modules])
    cold = oc.cold(plan, max_tokens)
    plain = oc.compose(plan, [], max_tokens, want_state=True)
    dev = deviation(cold.state, plain.state, plan)
    lengths = [e - s for s, e in plan.modules]
    prefix_ms = [oc.prefix_mode(plan)]

    def judged(run) -> dict:
        c = compare_runs(cold.tokens, cold.logits, run.tokens, run.logits)
        return {"tokens_equal": c.tokens_equal, "first_diff": c.first_diff,
                "kl": c.kl_divergence, "top1": c.top1_agree, "max_logit_diff": c.max_logit_diff,
                "ms": round(run.ms, 2), "runs": run.runs, "recomputed": run.recomputed}

    out = {"number": plan.number, "module_tokens": plan.module_tokens, "modules": len(lengths),
           "tail_tokens": len(plan.tokens) - plan.tail_start, "prefix_len": plan.prefix_len,
           "cold_tokens": cold.tokens, "plain": judged(plain), "cells": {}}
    full = oc.compose(plan, plan.positions(range(plan.module_tokens)), max_tokens)
    out["full"] = judged(full)
    out["full"]["bit_identical"] = bool(full.tokens == cold.tokens and all(
        np.array_equal(a, b) for a, b in zip(full.logits, cold.logits)))
    for share in (*shares, *oracle_more):
        best = choose("oracle", share, lengths, dev)
        for method in (methods if share in shares else ("oracle",)):
            idx = best if method == "oracle" else choose(method, share, lengths, dev, layer1)
            run = oc.compose(plan, plan.positions(idx), max_tokens)
            out["cells"][f"{method}@{share:g}"] = {**judged(run), "recall": recall(idx, best)}
    prefix_ms.append(oc.prefix_mode(plan))
    out["prefix_ms"] = [round(x, 2) for x in prefix_ms]
    ref = statistics.fmean(prefix_ms)
    for cell in [out["plain"], out["full"], *out["cells"].values()]:
        cell["vs_prefix"] = round(cell["ms"] / ref, 4)
    if score_ms is not None:
        out["score_ms"] = round(score_ms, 2)
        out["score_vs_prefix"] = round(score_ms / ref, 4)
        # the scoring pass's choice against the one the cold run's layer-1 V gives
        out["score_agrees"] = {f"{s:g}": recall(choose("layer1_v", s, lengths, dev, layer1),
                                                 choose("layer1_v", s, lengths, dev))
                               for s in shares}
    # how far the layer-1 signal's ranking is from the oracle's over all tokens
    out["layer1_rank_corr"] = _rank_corr(dev.layer_v(1), dev.oracle())
    return out


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3:
        return None
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    c = np.corrcoef(ra, rb)[0, 1]
    return None if np.isnan(c) else round(float(c), 4)


def summarise(rows: list[dict], shares, methods, oracle_more=()) -> dict:
    """Per share and method over the rows: greedy-equal share, top-1 mean, KL median and max,
    time ratio median (the layer-1 signal's with its scoring pass counted), oracle recall;
    plain compose and full recompute as the two ends."""
    def stats(cells: list[dict], signal: bool = False) -> dict:
        kl = [c["kl"] for c in cells]
        cost = [r.get("score_vs_prefix", 0.0) if signal else 0.0 for r in rows]
        return {"greedy_equal": sum(c["tokens_equal"] for c in cells) / len(cells),
                "top1_mean": statistics.fmean(c["top1"] for c in cells),
                "kl_median": statistics.median(kl), "kl_max": max(kl),
                "time_vs_prefix": statistics.median(c["vs_prefix"] + x
                                                    for c, x in zip(cells, cost)),
                "recomputed_share": statistics.fmean(
                    c["recomputed"] / r["module_tokens"] for c, r in zip(cells, rows)),
                "runs_median": statistics.median(c["runs"] for c in cells),
                **({"oracle_recall": statistics.fmean(c["recall"] for c in cells)}
                   if "recall" in cells[0] else {})}
    out = {"rows": len(rows), "plain": stats([r["plain"] for r in rows]),
           "full": stats([r["full"] for r in rows]),
           "full_bit_identical": sum(r["full"]["bit_identical"] for r in rows),
           "curves": {m: {f"{s:g}": stats([r["cells"][f"{m}@{s:g}"] for r in rows],
                                          m == "layer1_v")
                          for s in (*shares, *(oracle_more if m == "oracle" else ()))}
                      for m in methods}}
    corr = [r["layer1_rank_corr"] for r in rows if r["layer1_rank_corr"] is not None]
    out["layer1_rank_corr_median"] = statistics.median(corr) if corr else None
    score = [r["score_vs_prefix"] for r in rows if "score_vs_prefix" in r]
    out["score_vs_prefix_median"] = statistics.median(score) if score else None
    # how much prefix mode's own time moved between its two measurements on a row (the load)
    out["prefix_drift_median"] = statistics.median(
        abs(a - b) / ((a + b) / 2) for a, b in (r["prefix_ms"] for r in rows))
    out["goals"] = goals_reached(out["curves"])
    return out


def goals_reached(curves: dict) -> dict:
    """Per method: the smallest share meeting all three goals, or None; and the best point
    (most greedy-equal rows within the time goal)."""
    out = {}
    for m, pts in curves.items():
        met = [s for s, c in pts.items() if c["greedy_equal"] >= GOALS["greedy_equal"]
               and c["kl_median"] <= GOALS["kl_median"]
               and c["time_vs_prefix"] <= GOALS["time_vs_prefix"]]
        in_time = [(c["greedy_equal"], -c["kl_median"], s) for s, c in pts.items()
                   if c["time_vs_prefix"] <= GOALS["time_vs_prefix"]]
        out[m] = {"smallest_share_meeting_all": min(met, key=float) if met else None,
                  "best_within_time": max(in_time)[2] if in_time else None}
    return out


def _files(cfg: OracleConfig) -> tuple[Path, Path]:
    ex = examples_dir()
    return (Path(cfg.template_path) if cfg.template_path else ex / "rag.tmpl",
            Path(cfg.rows_path) if cfg.rows_path else ex / "rag-recurring.csv")


def run_compose_oracle(cfg: OracleConfig, log=print, on_row=None) -> dict:
    """The section; ``on_row(partial)`` gets the figures after every row (to write them)."""
    t_start = time.perf_counter()
    tpl_path, rows_path = _files(cfg)
    tpl = Template.parse(tpl_path.read_text(encoding="utf-8"))
    rows = read_rows(rows_path, tpl.placeholders)[cfg.first:cfg.first + cfg.rows]
    ensure_backend()
    model = NativeModel(Path(cfg.model_path) if cfg.model_path else default_model_path())
    out: dict = {"settings": {**asdict(cfg), "template": tpl_path.name, "rows_file": rows_path.name},
                 "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                 "n_layer": int(model.facts().get("n_layer", 0) or 0), "rows": []}
    try:
        prefix, plans = plan_rows(model, tpl, rows)
        oc = OracleContext(model, cfg.n_ctx, cfg.n_batch, cfg.n_threads, cfg.flash_attn)
        scorer = None
        try:
            oc.prime(prefix)
            if cfg.scoring_pass:
                scorer = ScoringContext(model, oc.ctx.state_get(PREFIX), cfg.n_ctx, cfg.n_batch,
                                        cfg.n_threads)
            for plan in plans:
                if not plan.modules or tuple(plan.tokens[:plan.prefix_len]) != oc.prefix:
                    out.setdefault("skipped", []).append(plan.number)  # its prefix merges
                    continue
                out["rows"].append(measure_row(oc, plan, cfg.shares, cfg.methods, cfg.max_tokens,
                                               cfg.oracle_more, scorer))
                log(f"compose oracle: row {plan.number} ({len(out['rows'])}/{len(plans)})")
                if on_row:
                    on_row(out)
        finally:
            if scorer is not None:
                scorer.close()
            oc.close()
    finally:
        model.close()
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["summary"] = summarise(out["rows"], cfg.shares, cfg.methods, cfg.oracle_more)
    out["duration_s"] = round(time.perf_counter() - t_start, 1)
    return out


def merge_parts(parts: list[dict]) -> dict:
    """One section from runs of it over parts of the rows (``first``/``rows``), in row order."""
    rows = {}
    for p in parts:  # a row two parts ran counts once, as the first part has it
        for r in p["rows"]:
            rows.setdefault(r["number"], r)
    out = {**parts[0], "rows": [rows[n] for n in sorted(rows)]}
    out["parts"] = [{k: p.get(k) for k in ("date_utc", "loadavg_start", "loadavg_end",
                                           "duration_s")} | {"first": p["settings"]["first"],
                                                             "rows": len(p["rows"])}
                    for p in parts]
    out["settings"] = {**parts[0]["settings"], "first": 0, "rows": len(out["rows"])}
    out["skipped"] = [n for p in parts for n in p.get("skipped", [])]
    cfg = parts[0]["settings"]
    out["summary"] = summarise(out["rows"], cfg["shares"], cfg["methods"], cfg["oracle_more"])
    return out
