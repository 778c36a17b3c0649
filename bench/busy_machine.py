"""Batch threads on a busy machine: auto (app/engine/llama/thread_fit.py) against every core,
which is what llama.cpp's tools and llama-cpp-python use unless told otherwise.

Other programs are played by busy-loop processes: none, half the cores, every core. For each
load two plain contexts hold the RAG prefix's first 256 tokens, one with auto batch threads and
one with every core, and each sample evaluates row 1's suffix in one batch and reads the logits,
the two contexts taking turns. A sample with the other setting's logits must be bit-identical:
the thread count may change the speed, never the result.

Ratios (medians of auto / every core over the pairs): ``busy_auto_vs_all_cores`` (every core
busy), ``half_busy_auto_vs_all_cores`` and ``quiet_auto_vs_all_cores`` (no busy process: auto
must cost nothing there).

`python -m bench.busy_machine [--samples 5]`; `make bench` runs it too (`--no-busy` skips it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np

from app.engine import Engine, EngineConfig
from app.engine.llama.native import NativeContext
from app.engine.llama.thread_count import logical_cpus
from app.engine.llama.thread_fit import shared_fit
from app.engine.llama.batch_feed import feed_batches
from app.engine.llama.batch_policy import batch_starts

from .workload import load_workload

PREFIX = 256
SETTLE_S = 2.0  # the busy processes start, and the fit sees a second or two of them


def _busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run(samples: int = 5, model_path: str | None = None, log=print) -> dict:
    cores = logical_cpus()
    loads = {"quiet": 0, "half_busy": max(1, cores // 2), "busy": cores}
    out: dict = {"n_cores": cores, "prefix_tokens": PREFIX, "loads": {}}
    with Engine(EngineConfig(model_path=model_path, n_threads=0)) as e:
        row = load_workload(e, 1).rows[0]
        prefix, suffix = row.tokens[:PREFIX], row.suffix
        out["suffix_tokens"] = len(suffix)
        ctxs = {"auto": NativeContext(e.model, replace(e.context_params(1), n_threads=0)),
                "all_cores": NativeContext(e.model, replace(e.context_params(1), n_threads=cores))}
        try:
            for ctx in ctxs.values():  # the prefix, untimed, on a quiet machine
                feed_batches(ctx.decode, prefix, 0, batch_starts(0, PREFIX, e.config.n_batch),
                             want_logits=False)
            for name, n_busy in loads.items():
                out["loads"][name] = _one_load(ctxs, suffix, n_busy, samples, log)
                log(f"busy machine, {name} ({n_busy} busy processes): auto "
                    f"{statistics.median(out['loads'][name]['auto_ms']):,.0f} ms, every core "
                    f"{statistics.median(out['loads'][name]['all_cores_ms']):,.0f} ms")
        finally:
            for ctx in ctxs.values():
                ctx.close()
    out["ratios"] = {f"{name}_auto_vs_all_cores": round(statistics.median(
        a / b for a, b in zip(r["auto_ms"], r["all_cores_ms"])), 3)
        for name, r in out["loads"].items()}
    out["bit_identical"] = all(r["bit_identical"] for r in out["loads"].values())
    return out


def _one_load(ctxs: dict, suffix: list[int], n_busy: int, samples: int, log) -> dict:
    procs = _busy_processes(n_busy)
    try:
        time.sleep(SETTLE_S)
        res: dict = {"busy_processes": n_busy, "auto_ms": [], "all_cores_ms": [],
                     "auto_threads": [], "other_cores": []}
        logits = {}
        for i in range(samples + 1):  # the first pair warms up, untimed
            order = list(ctxs) if i % 2 == 0 else list(ctxs)[::-1]
            for name in order:
                ms, logits[name] = _sample(ctxs[name], suffix)
                if i == 0:
                    continue
                res[f"{name}_ms"].append(round(ms, 2))
                if name == "auto":
                    res["auto_threads"].append(ctxs[name].batch_threads)
                    res["other_cores"].append(shared_fit().reading().other_cores)
        res["bit_identical"] = bool(np.array_equal(logits["auto"], logits["all_cores"]))
        return res
    finally:
        _stop(procs)


def _sample(ctx: NativeContext, suffix: list[int]) -> tuple[float, np.ndarray]:
    start = PREFIX
    ctx.seq_rm(0, start, -1)
    t0 = time.perf_counter()
    feed_batches(ctx.decode, suffix, start, [start])
    logits = ctx.logits(-1)
    return (time.perf_counter() - t0) * 1000, logits


def format_lines(r: dict) -> str:
    """The section for the bench's printout: one line per load, then the verdict."""
    lines = [f"Batch threads, auto against all {r['n_cores']} cores ({r['suffix_tokens']}-token "
             f"suffix after {r['prefix_tokens']} tokens, medians):"]
    for name, load in r["loads"].items():
        lines.append(f"  {name:<10} {load['busy_processes']} busy processes: auto "
                     f"{statistics.median(load['auto_ms']):>8,.0f} ms on "
                     f"{statistics.median(load['auto_threads']):.0f} threads, every core "
                     f"{statistics.median(load['all_cores_ms']):>8,.0f} ms; ratio "
                     f"{r['ratios'][name + '_auto_vs_all_cores']:.3f}")
    lines.append("  every sample bit-identical across thread counts: "
                 + ("yes" if r["bit_identical"] else "NO"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.busy_machine", description=__doc__)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--model")
    a = ap.parse_args(argv)
    r = run(a.samples, a.model)
    print(json.dumps(r, indent=1))
    print(format_lines(r))
    return 0 if r["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
