"""The kernel table: llama.cpp alone, flash attention on or off, batches of 256 or 63 tokens.

For each setting, a plain context evaluates the RAG prefix (1,761 tokens) in batches of that
size, then a 75-token suffix (row 2 of rag-rows.csv) in the same batches, best of three. This is
the measurement behind the engine's kernel choice (app/engine/kernel_choice.py) at full length,
and what exactness cost before cells were laid out as a cold run lays them out (batches under
64 tokens, the only ones whose results did not depend on where cells lay).

`python -m bench.kernel_table [--out bench/kernel-table.json]`; `make bench` runs it too.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from app.engine import Engine, EngineConfig
from app.engine.llama.batch_feed import feed_batches
from app.engine.llama.batch_policy import batch_starts
from app.engine.llama.native import ContextParams, NativeContext

from .workload import load_workload

SETTINGS = ((True, 256), (True, 63), (False, 256), (False, 63))


def run(n_threads: int | None = None, repeats: int = 3, model_path: str | None = None) -> dict:
    n_threads = n_threads or os.cpu_count() or 1
    out = {"n_threads": n_threads, "rows": []}
    with Engine(EngineConfig(model_path=model_path, n_ctx=4096, n_threads=n_threads)) as e:
        work = load_workload(e, 1)
        row = work.rows[0]
        out.update(prefix_tokens=row.boundary, suffix_tokens=len(row.suffix),
                   engine_choice=e.kernels.as_dict())
        for fa, n_batch in SETTINGS:
            ctx = NativeContext(e.model, ContextParams(4096, n_batch, n_threads, "f16", "f16", 1, 1, fa))
            try:
                prefix = row.tokens[:row.boundary]
                t0 = time.perf_counter()
                feed_batches(ctx.decode, prefix, 0, batch_starts(0, len(prefix), n_batch),
                             want_logits=False)
                prefix_ms = (time.perf_counter() - t0) * 1000
                best = float("inf")
                end = len(row.tokens)
                for _ in range(repeats):
                    ctx.seq_rm(0, row.boundary, -1)
                    t0 = time.perf_counter()
                    feed_batches(ctx.decode, row.suffix, row.boundary,
                                 batch_starts(row.boundary, end, n_batch))
                    ctx.logits(-1)
                    best = min(best, (time.perf_counter() - t0) * 1000)
            finally:
                ctx.close()
            out["rows"].append({"flash_attn": fa, "n_batch": n_batch,
                                "prefix_ms_per_token": prefix_ms / len(prefix),
                                "suffix_ms": best})
    return out


def format_table(t: dict) -> str:
    lines = [f"kernel table: the {t['prefix_tokens']:,}-token RAG prefix, then a "
             f"{t['suffix_tokens']}-token suffix; {t['n_threads']} threads",
             "| flash attn | n_batch | prefix, ms/token | suffix |", "|---|---:|---:|---:|"]
    for r in t["rows"]:
        lines.append(f"| {'on' if r['flash_attn'] else 'off'} | {r['n_batch']} | "
                     f"{r['prefix_ms_per_token']:.2f} | {r['suffix_ms']:.0f} ms |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernel_table", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "kernel-table.json")
    ap.add_argument("--threads", type=int)
    args = ap.parse_args(argv)
    t = run(args.threads)
    args.out.write_text(json.dumps(t, indent=1) + "\n", encoding="utf-8")
    print(format_table(t))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
