"""What the KV debug view costs, and forked batches vs one-by-one warm runs.

    from bench.kv_bench import run, debug_log_cost, forked_vs_sequential
    run(quick=False) -> {"debug_log_cost": {...}, "forked": {...}}

debug_log_cost: two engines on the same model, LLAMA_KV_CACHE_DEBUG=3 (our default) and off,
evaluate the same prompt tokens alternately (on, off, off, on, ...) and then the same 1-token
decodes (generation, where the per-ubatch log matters most). With one thread ggml computes on
the calling thread, so its CPU time (time.thread_time) is not inflated by other processes on
this shared machine; wall time is reported too. Cost = median on / median off - 1.

forked_vs_sequential: bench_forked on the RAG example (prefix primed once; rows in batches of
k, each batch also run row by row warm and compared token for token).

`python -m bench.kv_bench [--quick]` prints both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from app.engine import Engine, EngineConfig, GenerationConfig, Template, read_rows
from app.engine.benchmarks.forked_bench import bench_forked
from app.resources_path import examples_dir


def _rag():
    ex = examples_dir()
    tpl = Template.parse((ex / "rag.tmpl").read_text(encoding="utf-8"))
    return tpl, read_rows(ex / "rag-rows.csv", tpl.placeholders)


def _timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - w0) * 1000, (time.thread_time() - c0) * 1000


def debug_log_cost(model_path: str | None = None, *, n_tokens: int = 512, n_gen: int = 32,
                   repeats: int = 5, n_threads: int = 1, n_ctx: int = 4096,
                   n_batch: int = 256) -> dict:
    """Prompt evaluation and 1-token decodes with the KV debug log on vs off (see module doc)."""
    tpl, _rows = _rag()
    cfg = dict(model_path=model_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
    engines = {"on": Engine(EngineConfig(**cfg, kv_debug_log=True)),
               "off": Engine(EngineConfig(**cfg, kv_debug_log=False))}
    try:
        tokens = engines["on"].tokenize(tpl.prefix_prompt())[:n_tokens]
        gen = tokens[:n_gen]
        times = {k: {"prompt_wall": [], "prompt_cpu": [], "gen_wall": [], "gen_cpu": []}
                 for k in engines}
        for r in range(repeats):
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                e = engines[name]
                e.clear_all()
                w, c = _timed(lambda: e.evaluate(tokens, 0, want_logits=True))
                times[name]["prompt_wall"].append(w)
                times[name]["prompt_cpu"].append(c)
                e.clear_all()
                w, c = _timed(lambda: [e.evaluate([t], 0) for t in gen])
                times[name]["gen_wall"].append(w)
                times[name]["gen_cpu"].append(c)
        assert engines["on"].kv_view().source == "debug-log"
        assert engines["off"].kv_view().source == "ranges"
    finally:
        for e in engines.values():
            e.close()
    med = {k: {m: statistics.median(v) for m, v in t.items()} for k, t in times.items()}
    over = debug_log_overhead_ms(n_ctx)["overhead_ms_per_ubatch"]
    n_ub = -(-len(tokens) // n_batch)

    def cost(m):
        return (med["on"][m] / med["off"][m] - 1) * 100 if med["off"][m] else None

    return {
        "n_tokens": len(tokens), "n_gen": len(gen), "repeats": repeats, "n_threads": n_threads,
        "n_ctx": n_ctx, "n_batch": n_batch,
        "prompt_tok_s_on": len(tokens) / (med["on"]["prompt_cpu"] / 1000),
        "prompt_tok_s_off": len(tokens) / (med["off"]["prompt_cpu"] / 1000),
        "prompt_cost_pct_cpu": cost("prompt_cpu"), "prompt_cost_pct_wall": cost("prompt_wall"),
        "gen_ms_per_token_on": med["on"]["gen_cpu"] / len(gen),
        "gen_ms_per_token_off": med["off"]["gen_cpu"] / len(gen),
        "gen_cost_pct_cpu": cost("gen_cpu"), "gen_cost_pct_wall": cost("gen_wall"),
        "overhead_ms_per_ubatch": over,
        # the log's own cost against this model's compute, free of the A/B noise above
        "prompt_cost_pct_derived": over * n_ub / med["off"]["prompt_cpu"] * 100,
        "gen_cost_pct_derived": over / (med["off"]["gen_cpu"] / len(gen)) * 100,
        "target_pct": 5.0,
        "raw_ms": times,
    }


def debug_log_overhead_ms(n_ctx: int = 4096, n_decodes: int = 300, repeats: int = 5) -> dict:
    """The debug log's own cost per ubatch, on the tiny random model (its compute is ~nothing,
    so what remains is llama.cpp writing the map and our log callback; the map is read only when
    a view asks for it)."""
    import tempfile
    from pathlib import Path

    from tests.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory() as d:
        path = str(write_tiny_model(Path(d) / "tiny.gguf"))
        cfg = dict(model_path=path, n_ctx=n_ctx, n_batch=32, n_threads=1)
        engines = {"on": Engine(EngineConfig(**cfg, kv_debug_log=True)),
                   "off": Engine(EngineConfig(**cfg, kv_debug_log=False))}
        per = {k: [] for k in engines}
        try:
            for r in range(repeats):
                for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    e = engines[name]
                    e.clear_all()
                    e.evaluate([5] * 200, 0)  # a partly used cache, as in a real run
                    _w, c = _timed(lambda: [e.evaluate([7], 0) for _ in range(n_decodes)])
                    per[name].append(c / n_decodes)
        finally:
            for e in engines.values():
                e.close()
    on, off = statistics.median(per["on"]), statistics.median(per["off"])
    return {"n_ctx": n_ctx, "ms_per_ubatch_on": on, "ms_per_ubatch_off": off,
            "overhead_ms_per_ubatch": on - off}


def forked_vs_sequential(model_path: str | None = None, *, k: int = 4, n_rows: int | None = None,
                         max_tokens: int = 8, n_threads: int = 1, n_ctx: int = 4096,
                         n_batch: int = 256) -> dict:
    """The RAG rows in forked batches of k against the same rows one by one warm."""
    tpl, rows = _rag()
    rows = rows[:n_rows] if n_rows else rows
    with Engine(EngineConfig(model_path=model_path, n_ctx=n_ctx, n_batch=n_batch,
                             n_threads=n_threads, n_seq_max=max(8, k + 1))) as e:
        res = bench_forked(e, tpl, rows, k, gen=GenerationConfig(max_tokens=max_tokens))
    return res.as_dict()


def run(quick: bool = False) -> dict:
    """What `make bench` records under "kv_bench"."""
    if quick:
        return {"debug_log_cost": debug_log_cost(n_tokens=256, n_gen=16, repeats=2),
                "forked": forked_vs_sequential(k=2, n_rows=2, max_tokens=4)}
    return {"debug_log_cost": debug_log_cost(),
            "forked": forked_vs_sequential(k=4, n_rows=8)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kv_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["debug", "forked"])
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    out = {}
    if args.only in (None, "debug"):
        out["debug_log_cost"] = d = (debug_log_cost(n_tokens=256, n_gen=16, repeats=2) if args.quick
                                     else debug_log_cost())
        print(f"debug log on vs off: prompt {d['prompt_tok_s_on']:.1f} vs {d['prompt_tok_s_off']:.1f} "
              f"tok/s (cost {d['prompt_cost_pct_cpu']:+.2f}% CPU, {d['prompt_cost_pct_wall']:+.2f}% "
              f"wall); 1-token decode {d['gen_ms_per_token_on']:.2f} vs "
              f"{d['gen_ms_per_token_off']:.2f} ms (cost {d['gen_cost_pct_cpu']:+.2f}% CPU, "
              f"{d['gen_cost_pct_wall']:+.2f}% wall); target < 5%")
        print(f"the log's own cost: {d['overhead_ms_per_ubatch']:.3f} ms per ubatch at n_ctx "
              f"{d['n_ctx']} = {d['prompt_cost_pct_derived']:.2f}% of prompt evaluation, "
              f"{d['gen_cost_pct_derived']:.2f}% of a 1-token decode")
    if args.only in (None, "forked"):
        out["forked"] = f = (forked_vs_sequential(k=2, n_rows=2, max_tokens=4) if args.quick
                             else forked_vs_sequential(k=4, n_rows=8))
        s = f["summary"]
        print(f"forked batches of {s['k']}: {s['forked_rows_per_s']:.2f} rows/s vs one by one warm "
              f"{s['sequential_rows_per_s']:.2f} rows/s (speedup {s['speedup']:.2f}x); "
              f"all tokens equal {s['all_tokens_equal']}; max |Δlogit| {s['max_logit_diff']:.3g}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
