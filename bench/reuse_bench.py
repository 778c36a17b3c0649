"""The reuse section of `make bench`: what reusing more than the static prefix buys, and costs.

On the recurring RAG workload (rag-recurring.csv: passages drawn with Zipf popularity, so rows
share values), two measurements on one engine whose context is large enough (8,192 cells) that
nothing is evicted:

1. The app's warm run in prefix mode against the fastest limit (kvprimer_paths.py), on a cache holding
   only the static prefix: the work context keeps the prefix and evaluates the row's suffix,
   against a plain context holding the prefix that evaluates the same suffix in the same
   batches. The two paths alternate (ABBA), so drift on a shared machine cancels in the
   per-pair ratios.
2. One ``bench_rows`` call with modes prefix, chain and compose (the engine's own benchmark, as
   `kvprimer bench --reuse prefix,chain,compose` runs it): one cold run per row serves every
   mode whose warm history used the same batches; each mode's cache starts with the prefix only.
3. Chain against prefix mode on the rows where chain reused only the static prefix, in ABBA
   pairs of warm runs (the cache cut back to the prefix first, and the pairs' own nodes left
   out), repeated: bench_rows runs a row's modes side by side once per repeat; these pairs
   repeat them on the rows where the goal is read.
4. The peers (reuse_peers.py): llama-cpp-python with a LlamaRAMCache large enough for every
   row, built natively as pip builds it (in a process of its own) and the project's own build;
   llama-server with its defaults, over HTTP. The same rows in the same order; per-row ratios
   of each mode's time to first token against each peer's.

Figures go under "reuse" in results.json; the ratios and goals are in ratios.py.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import llama_cpp

from app.engine import (Engine, EngineConfig, GenerationConfig, TaskState, Template, bench_rows,
                        read_rows, run_prompt)
from app.resources_path import examples_dir

from .kvprimer_paths import OurPaths
from .ratios import compose_accuracy, compute_reuse_ratios, static_row_numbers
from .reuse_peers import PeerRun, run_peers
from .stats import a_first, summary
from .workload import load_workload

MODES = ("prefix", "chain", "compose")


@dataclass(frozen=True)
class ReuseConfig:
    rows: int = 12  # the first rows of the workload (each costs three cold runs: see BENCHMARKS.md)
    fork_repeats: int = 4  # pairs of (resident fork, limit) per row
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_batch: int = 256
    n_ctx: int = 8192
    max_tokens: int = 8  # generated per run; the verdict compares them
    check_tokens: int = 8  # greedy tokens compared between the resident fork and the limit
    model_path: str | None = None
    template_path: str | None = None  # None: resources/examples/rag.tmpl
    rows_path: str | None = None  # None: resources/examples/rag-recurring.csv
    # the peers, on the same rows in the same order (reuse_peers.py)
    llamacpp: bool = True  # llama-cpp-python (this project's build) with a LlamaRAMCache
    native_peer: bool = True  # the same, built natively as pip builds it, in its own process
    server_peer: bool = True  # llama-server with its defaults, over HTTP
    server_slots: int = 0  # llama-server's -np; 0: its default


def _files(cfg: ReuseConfig) -> tuple[Path, Path]:
    ex = examples_dir()
    return (Path(cfg.template_path) if cfg.template_path else ex / "rag.tmpl",
            Path(cfg.rows_path) if cfg.rows_path else ex / "rag-recurring.csv")


def _engine(cfg: ReuseConfig) -> Engine:
    return Engine(EngineConfig(model_path=cfg.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                               n_threads=cfg.n_threads))


def _peer_run(engine: Engine, work, cfg: ReuseConfig) -> PeerRun:
    return PeerRun(model_path=engine.info.path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                   n_threads=cfg.n_threads, flash_attn=bool(engine.kernels.flash_attn),
                   max_tokens=cfg.max_tokens, prime=list(work.prefix),
                   numbers=[r.number for r in work.rows], tokens=[r.tokens for r in work.rows],
                   server_slots=cfg.server_slots)


def _peers(run: PeerRun, cfg: ReuseConfig, log) -> dict:
    return run_peers(run, project=cfg.llamacpp, native=cfg.native_peer, server=cfg.server_peer,
                     version=llama_cpp.__version__, log=log)


def run_reuse(cfg: ReuseConfig, log=print) -> dict:
    t_start = time.perf_counter()
    tpl_path, rows_path = _files(cfg)
    tpl = Template.parse(tpl_path.read_text(encoding="utf-8"))
    rows = read_rows(rows_path, tpl.placeholders)[:cfg.rows]
    out: dict = {"settings": {**asdict(cfg), "template": tpl_path.name,
                              "rows_file": rows_path.name, "modes": list(MODES)}}
    with _engine(cfg) as engine:
        work = load_workload(engine, cfg.rows, tpl_path, rows_path)
        log(f"reuse: {len(rows)} rows of {rows_path.name}; prefix {len(work.prefix)} tokens; "
            "resident fork against the limit")
        ours = OurPaths(engine, tpl)
        try:
            out["warm_in_place"] = warm_in_place_vs_limit(ours, work.rows, cfg.fork_repeats,
                                                          cfg.check_tokens)
        finally:
            ours.close()
        log(f"reuse: bench_rows modes {','.join(MODES)}")
        done = [0]

        def progress(p):
            if p.stage == "bench" and p.done != done[0]:
                done[0] = p.done
                log(f"reuse: {p.done}/{p.total} row runs ({p.elapsed_s:.0f} s)")

        res = bench_rows(engine, tpl, rows, modes=MODES, gen=GenerationConfig(
            max_tokens=cfg.max_tokens), task=TaskState(on_progress=progress))
        out["rows"] = [asdict(r) for r in res.rows]
        out["summary"] = res.summary()
        out["cache_tiers"] = [asdict(t) for t in engine.cache.tier_usage()]
        numbers = set(static_row_numbers(out["rows"]))
        static = [r for r in rows if r.number in numbers]
        log(f"reuse: chain against prefix on the {len(static)} rows that reuse only the static "
            "prefix, ABBA pairs")
        out["static_pairs"] = static_rows_pairs(engine, tpl, static, cfg.fork_repeats)
        peers = _peer_run(engine, work, cfg)
    # after the engine is closed: the peers get the cores and the memory to themselves
    out.update(_peers(peers, cfg, log))
    out["ratios"], out["goals"] = compute_reuse_ratios(out)
    out["compose_accuracy"] = compose_accuracy(out["rows"])
    out["chain_exact"] = _exact(out["rows"], "chain")
    out["duration_s"] = round(time.perf_counter() - t_start, 1)
    return out


def add_peers(reuse: dict, cfg: ReuseConfig, log=print) -> dict:
    """Run the peers ``cfg`` asks for on the rows a stored reuse section ran (its own template,
    rows and settings), put them into it and compute its ratios again: for a peer that was not
    ready (or failed) when the section ran. Says when they ran: the pairs then span two times."""
    kept = {k: v for k, v in reuse["settings"].items() if k in ReuseConfig.__dataclass_fields__}
    run_cfg = replace(ReuseConfig(**kept), llamacpp=cfg.llamacpp, native_peer=cfg.native_peer,
                      server_peer=cfg.server_peer, server_slots=cfg.server_slots)
    tpl_path, rows_path = _files(run_cfg)
    with _engine(run_cfg) as engine:
        peers = _peer_run(engine, load_workload(engine, run_cfg.rows, tpl_path, rows_path),
                          run_cfg)
    got = _peers(peers, run_cfg, log)
    reuse.update(got)
    reuse.setdefault("peers_added", []).append(
        {"peers": sorted(k for k in got if not k.endswith("_recurring")),
         "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "loadavg": [round(x, 2) for x in os.getloadavg()]})
    reuse["ratios"], reuse["goals"] = compute_reuse_ratios(reuse)
    return reuse


def warm_in_place_vs_limit(ours: OurPaths, rows, repeats: int, check: int) -> dict:
    fork_ms, limit_ms, lookup_fork_ms, equal = [], [], [], True
    k = 0
    for rep in range(repeats):
        for row in rows:
            more = check if rep == 0 else 0
            first_fork = a_first(k)
            k += 1
            if first_fork:
                f, lim = ours.warm_in_place(row, more), ours.limit(row, more)
            else:
                lim, f = ours.limit(row, more), ours.warm_in_place(row, more)
            if f.evaluated != lim.evaluated or f.evaluated != len(row.suffix):
                raise RuntimeError(f"row {row.number}: the resident fork evaluated {f.evaluated} "
                                   f"tokens, the limit {lim.evaluated}")
            if more:
                equal = equal and f.tokens == lim.tokens and bool((f.logits == lim.logits).all())
            fork_ms.append(f.ms)
            lookup_fork_ms.append(f.restore_ms)
            limit_ms.append(lim.ms)
    return {"fork_ms": fork_ms, "limit_ms": limit_ms, "fork": summary(fork_ms),
            "limit": summary(limit_ms), "lookup_and_fork_ms": summary(lookup_fork_ms),
            "bit_identical": equal, "repeats": repeats,
            "suffix_tokens": [len(r.suffix) for r in rows]}


def static_rows_pairs(engine, tpl, rows, repeats: int) -> dict:
    """Warm runs of prefix and chain mode on ``rows`` in ABBA order, with a cache holding only
    the static prefix (what each mode reused on these rows); chain still stores its segments
    after the first token, but no run reuses what the pairs stored."""
    engine.cache.retain(engine.prime_node(tpl))
    before = engine.cache.generation + 1
    gen = GenerationConfig(max_tokens=1)
    ms: dict[str, list[float]] = {"prefix": [], "chain": []}
    k = 0
    for _rep in range(repeats):
        for row in rows:
            order = ("prefix", "chain") if a_first(k) else ("chain", "prefix")
            k += 1
            for mode in order:
                rep = run_prompt(engine, tpl, row.values, reuse=mode, cold=False, gen=gen,
                                 reuse_before=before)
                ms[mode].append(rep.warm.ttft_ms)
    return {"rows": [r.number for r in rows], "repeats": repeats, "prefix_ms": ms["prefix"],
            "chain_ms": ms["chain"], "prefix": summary(ms["prefix"]), "chain": summary(ms["chain"])}


def _exact(rows: list[dict], mode: str) -> dict:
    ok = [r for r in rows if r["reuse"] == mode and r.get("error") is None]
    exact = [r for r in ok if r["tokens_equal"] and r["max_logit_diff"] == 0.0]
    return {"rows": len(ok), "bit_identical_rows": len(exact),
            "all": bool(ok) and len(exact) == len(ok)}
