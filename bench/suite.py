"""The whole benchmark: every path on the same rows, repeat after repeat, then the sizes, the
equivalence checks and the prefix-length sweep. Returns one dict: what results.json holds.

Within a repeat the paths run back to back in a fixed order (cold, limit, ours warm, theirs
warm, q8_0), so that each pairwise ratio compares runs made seconds apart. Ours warm from memory
is the app's warm run (the resident prefix forked); the cold path runs in the engine's cold
reference context with the same batch starts (kvprimer_paths.py).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from app.engine import Engine, EngineConfig

from . import sweep
from .llamacpp_paths import LlamaPaths
from .machine import CpuShare, loadavg, machine_info
from .kvprimer_paths import OurPaths, Sample
from .ratios import compute_ratios
from .report import path_summaries
from .restore_probe import probe_restore
from .workload import RowTokens, Workload, load_workload

OURS_F16 = ("cold", "limit", "warm_in_place", "warm_memory", "warm_file", "limit_cache_context")
THEIRS = ("llamacpp_ram", "llamacpp_disk", "llamacpp_in_context")
OURS_Q8 = ("q8_0_warm_memory", "q8_0_limit", "q8_0_warm_file")


@dataclass(frozen=True)
class BenchConfig:
    rows: int = 2
    repeats: int = 5
    sweep_points: tuple[int, ...] = (256, 512, 1024)  # the full prefix is added to these
    sweep_repeats: int = 3
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_batch: int = 256  # also n_ubatch, for our context and for Llama
    n_ctx: int = 4096
    equivalence_tokens: int = 8
    llamacpp: bool = True
    q8_0: bool = True
    model_path: str | None = None  # None: the default model
    template_path: str | None = None  # None: resources/examples/rag.tmpl
    rows_path: str | None = None  # None: resources/examples/rag-rows.csv


class _Log:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def run_suite(cfg: BenchConfig, log=None) -> dict:
    log = log or _Log()
    t_start = time.perf_counter()
    share = CpuShare(cfg.n_threads)
    results: dict = {"machine": machine_info(), "settings": asdict(cfg)}
    tmp = Path(tempfile.mkdtemp(prefix="kvprimer-bench-"))
    engine = Engine(EngineConfig(model_path=cfg.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                 n_threads=cfg.n_threads))
    results["settings"].update(n_ubatch=cfg.n_batch, sampling="greedy, first token timed",
                               kernels=engine.kernels.as_dict(),
                               flash_attn=f"{engine.kernels.describe()} (ours and Llama alike)")
    q8 = llama = ours = ours_q8 = None
    try:
        results["model"] = {k: engine.info.as_dict()[k] for k in (
            "path", "name", "n_layer", "n_head_kv", "n_vocab", "kv_bytes_per_token")}
        work = load_workload(engine, cfg.rows,
                             Path(cfg.template_path) if cfg.template_path else None,
                             Path(cfg.rows_path) if cfg.rows_path else None)
        results["workload"] = _workload_dict(work)
        log(f"prefix {len(work.prefix)} tokens; rows {[len(r.suffix) for r in work.rows]} "
            f"suffix tokens; priming ours (f16)")
        state = engine.prime(work.template)
        state_file = tmp / "rag.kvstate"
        sizes = {"prefix_tokens": state.n_tokens, "state_file_bytes": state.save(state_file),
                 "raw_kv_bytes": state.n_tokens * engine.info.kv_bytes_per_token,
                 "kv_bytes_per_token": engine.info.kv_bytes_per_token}
        paths = {n: [] for n in OURS_F16}
        if cfg.llamacpp:
            log("loading llama_cpp.Llama and priming its caches")
            llama = LlamaPaths(engine.info.path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                               n_threads=cfg.n_threads, cache_dir=tmp / "llama-disk-cache",
                               flash_attn=engine.kernels.flash_attn)
            entry = llama.prime(work.prefix)
            sizes.update(llamacpp_ram_entry_bytes=llama.ram_entry_bytes(),
                         llamacpp_ram_entry_parts={
                             "llama_state": int(entry.llama_state_size),
                             "scores": int(entry.scores.nbytes),
                             "input_ids": int(entry.input_ids.nbytes)},
                         llamacpp_disk_entry_bytes=llama.disk_entry_bytes())
            paths.update({n: [] for n in THEIRS})
        q8_file = tmp / "rag-q8_0.kvstate"
        if cfg.q8_0:
            log("priming ours (q8_0 KV)")
            q8 = Engine(EngineConfig(model_path=cfg.model_path, n_ctx=cfg.n_ctx,
                                     n_batch=cfg.n_batch, n_threads=cfg.n_threads,
                                     type_k="q8_0", type_v="q8_0"))
            q8_state = q8.prime(work.template)
            sizes.update(q8_0_state_file_bytes=q8_state.save(q8_file),
                         q8_0_raw_kv_bytes=q8_state.n_tokens * q8.info.kv_bytes_per_token,
                         q8_0_kv_bytes_per_token=q8.info.kv_bytes_per_token)
            paths.update({n: [] for n in OURS_Q8})
        results["sizes"] = sizes

        ours = OurPaths(engine, work.template)
        ours_q8 = OurPaths(q8, work.template) if q8 else None
        equivalence: dict = {}
        for rep in range(cfg.repeats):
            for row in work.rows:
                check = rep == 0  # the equivalence check runs once per row (it is deterministic)
                got = _one_repeat(cfg, work, row, ours, ours_q8, llama, state_file, q8_file,
                                  check, equivalence)
                for name, sample in got.items():
                    paths[name].append(_sample_dict(sample, row))
                log(f"repeat {rep + 1}/{cfg.repeats} row {row.number}: " + ", ".join(
                    f"{k} {v.ms:.0f}" for k, v in got.items()) + " ms")
        results["paths"] = paths
        results["equivalence"] = equivalence
        results["restore_probe"] = probe_restore(engine, state, state_file)
        if cfg.sweep_points:
            log("prefix-length sweep")
            results["sweep"] = sweep.run_sweep(ours, state, work, cfg.sweep_points,
                                               cfg.sweep_repeats, paths, log)
    finally:
        for thing in (ours, ours_q8, llama, q8, engine):
            if thing is not None:
                thing.close()
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        tmp.rmdir()
    results["same_suffix_tokens"] = _same_suffix_tokens(results["paths"], work)
    results["summaries"] = path_summaries(results["paths"])
    results["ratios"], results["goals"] = compute_ratios(results)
    results["machine"].update(loadavg_end=loadavg(), cpu_share=round(share.value(), 3),
                              duration_s=round(time.perf_counter() - t_start, 1))
    return results


def _one_repeat(cfg, work: Workload, row: RowTokens, ours: OurPaths, ours_q8, llama,
                state_file, q8_file, check: bool, eq: dict) -> dict[str, Sample]:
    n = cfg.equivalence_tokens
    out: dict[str, Sample] = {}
    key = str(row.number)

    def ours_run(name, paths: OurPaths, fn, *args):
        more = n if check else 0
        s = out[name] = fn(*args, row, more) if args else fn(row, more)
        if check:
            eq.setdefault(key, {})[name] = (s.tokens, s.logits)
        s.logits = None

    def theirs_run(name, fn, *args):
        s = out[name] = fn(row, *args)
        if check:
            eq.setdefault(key, {})[name] = (llama.more_tokens(s.first_token, n), s.logits)
        s.logits = None

    ours_run("cold", ours, ours.cold)
    ours_run("limit", ours, ours.limit)
    ours_run("warm_memory", ours, ours.warm_memory)
    ours_run("warm_in_place", ours, ours.warm_in_place)
    ours_run("warm_file", ours, ours.warm_file, state_file)
    ours_run("limit_cache_context", ours, ours.limit_cache_context)
    if llama:
        theirs_run("llamacpp_ram", llama.ram_warm, work.unrelated)
        theirs_run("llamacpp_disk", llama.disk_warm, work.unrelated)
        theirs_run("llamacpp_in_context", llama.in_context, _other_token(row))
    if ours_q8:
        ours_run("q8_0_warm_memory", ours_q8, ours_q8.warm_memory)
        ours_run("q8_0_limit", ours_q8, ours_q8.limit)
        ours_run("q8_0_warm_file", ours_q8, ours_q8.warm_file, q8_file)
    if check:
        eq[key] = _compare_to_cold(eq[key])
    return out


def _other_token(row: RowTokens) -> int:
    """A token unlike the row's first suffix token, to stand for 'another suffix'."""
    first = row.tokens[row.boundary]
    return first - 1 if first > 0 else first + 1


def _compare_to_cold(got: dict) -> dict:
    cold_toks, cold_logits = got["cold"]
    out = {}
    for name, (toks, logits) in got.items():
        out[name] = {"tokens": toks, "tokens_equal": toks == cold_toks,
                     "max_abs_logit_diff": float(np.max(np.abs(logits - cold_logits))),
                     "argmax_equal": int(np.argmax(logits)) == int(np.argmax(cold_logits))}
    return out


def _sample_dict(s: Sample, row: RowTokens) -> dict:
    return {"row": row.number, "ms": s.ms, "evaluated": s.evaluated, "restore_ms": s.restore_ms,
            "load_ms": s.load_ms}


def _workload_dict(w: Workload) -> dict:
    return {"prefix_tokens": len(w.prefix), "unrelated_tokens": len(w.unrelated),
            "rows": [{"row": r.number, "tokens": len(r.tokens), "boundary": r.boundary,
                      "suffix_tokens": len(r.suffix)} for r in w.rows]}


def _same_suffix_tokens(paths: dict, work: Workload) -> dict:
    """Did every warm path evaluate exactly each row's suffix, and cold the whole prompt?"""
    want = {r.number: (len(r.tokens), len(r.suffix)) for r in work.rows}
    bad = []
    for name, samples in paths.items():
        for s in samples:
            full, suffix = want[s["row"]]
            expected = full if name == "cold" else suffix
            if s["evaluated"] != expected:
                bad.append(f"{name} row {s['row']}: {s['evaluated']} tokens, expected {expected}")
    return {"ok": not bad, "mismatches": bad,
            "evaluated": {name: sorted({s["evaluated"] for s in ss}) for name, ss in paths.items()}}
