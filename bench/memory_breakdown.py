"""Where the engine's resident memory goes, step by step, on the scale section's models:
`python -m bench.memory_breakdown [--model smollm2-135m-32k|llama3.2-1b] [--target 2048]`.

One process per call (so that its peak is its own). The engine is driven as bench/scale_ours.py
drives it: opened, the template's prefix primed and its state saved, one run with cold and warm
paths, then the state file loaded as `run --state` loads it and run again. After each step it
prints this process's resident memory now (VmRSS) and its peak so far (VmHWM), and at the end
the parts those are made of: the weights, each context's KV and compute buffers (the engine's
budget, which a test holds to llama.cpp's logged buffers; whether each context was opened at
all), the radix cache's RAM tier and the saved state's bytes held by the caller. Nothing is
written to results.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

MB = 1e6


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) * 1024
    return out


def _reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def breakdown(model: str, target: int, n_batch: int = 256, n_threads: int = 0,
              max_tokens: int = 8) -> dict:
    from .scale import (CTX_MARGIN, ScaleConfig, build_template, model_path, question,
                        tokenizer_of)

    steps: list[tuple[str, dict]] = [("imports", _status())]
    path = model_path(ScaleConfig(), model)
    count, n_train, vocab = tokenizer_of(path)
    try:
        tpl_text = build_template(min(target, n_train - CTX_MARGIN), count)
        prefix_est = count(tpl_text.split("<question>")[0])
    finally:
        vocab.close()
    n_ctx = min(-(-(prefix_est + CTX_MARGIN) // 256) * 256, max(n_train, 256))
    steps.append(("tokenizer", _status()))
    _reset_peak()  # the tokenizer's model copy is gone: the engine's peak from here
    steps.append(("peak reset", _status()))

    import os

    from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
    from app.engine import session_flows, state_flows
    from app.engine.llama.thread_fit import shared_fit

    from .scale_ours import drop_from_page_cache

    eng = Engine(EngineConfig(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch,
                              n_threads=n_threads or os.cpu_count() or 1),
                 measure_kernels_later=True)
    tmp = Path(tempfile.mkdtemp(prefix="kvprimer-mem-"))
    try:
        steps.append(("engine open", _status()))
        tpl = Template.parse(tpl_text)
        gen = GenerationConfig(max_tokens=max_tokens)
        values = {"question": question()}
        state = session_flows.prime(eng, tpl)
        steps.append(("prime", _status()))
        tiers_after_prime = [t.__dict__ for t in eng.cache.tier_usage()]
        state_file = tmp / "prefix.kvstate"
        state.save(state_file)
        steps.append(("state saved", _status()))
        with shared_fit().pinned():
            first = run_prompt(eng, tpl, values, reuse="prefix", cold=True, warm=True,
                               oneshot=False, gen=gen)
            steps.append(("run (warm + cold)", _status()))
            tiers = [t.__dict__ for t in eng.cache.tier_usage()]
            eng.clear_cache()
            drop_from_page_cache(state_file)
            t0 = time.perf_counter()
            loaded = state_flows.load_state(eng, state_file, tpl)
            load_ms = (time.perf_counter() - t0) * 1000
            steps.append(("state file loaded", _status()))
            # warm only: judged by the first run's kept cold run when its batches are the same
            again = run_prompt(eng, tpl, values, reuse="prefix", state=loaded, cold=False,
                               warm=True, oneshot=False, gen=gen)
            steps.append(("run from the state", _status()))
        m = eng.info.memory
        # the cache's context is created when a node is first placed in it (attention-only
        # models); the budget counts it either way
        opened = {"cache": eng.ctx.opened, "work": eng.work.opened}
        return {
            "model": model, "n_ctx": n_ctx, "prefix_tokens": state.n_tokens,
            "prompt_tokens": first.prompt_tokens, "flash_attn": bool(eng.kernels.flash_attn),
            "verdicts": [r.verdict.equivalence if r.verdict else None for r in (first, again)],
            "load_ms": load_ms,
            "steps": steps,
            "parts": {"model_file": m.model,
                      "contexts": [{"name": c.name, "cells": c.cells, "kv": c.kv + c.recurrent,
                                    "compute": c.compute, "opened": opened.get(c.name, True)}
                                   for c in m.contexts],
                      "tiers_after_prime": tiers_after_prime,
                      "tiers_after_run": tiers,
                      "state_bytes_held_by_caller": len(state.data)},
        }
    finally:
        eng.close()
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink()
        tmp.rmdir()


def report(b: dict) -> str:
    lines = [f"{b['model']}: n_ctx {b['n_ctx']}, prefix {b['prefix_tokens']} tokens, prompt "
             f"{b['prompt_tokens']}, flash attention {b['flash_attn']}, verdicts {b['verdicts']},"
             f" .kvstate load {b['load_ms']:.0f} ms",
             f"  {'step':<22}{'VmRSS MB':>10}{'VmHWM MB':>10}{'anon MB':>10}{'file MB':>10}"]
    for name, s in b["steps"]:
        lines.append(f"  {name:<22}{s['VmRSS'] / MB:>10.0f}{s['VmHWM'] / MB:>10.0f}"
                     f"{s.get('RssAnon', 0) / MB:>10.0f}{s.get('RssFile', 0) / MB:>10.0f}")
    p = b["parts"]
    lines.append(f"  model file {p['model_file'] / MB:.0f} MB")
    for c in p["contexts"]:
        lines.append(f"  {c['name']} context: {c['cells']} cells, KV {c['kv'] / MB:.0f} MB, "
                     f"compute+output {c['compute'] / MB:.0f} MB"
                     + ("" if c.get("opened", True) else " (never opened: not in RSS)"))
    for t in p["tiers_after_run"]:
        lines.append(f"  tier {t}")
    lines.append(f"  saved state held by the caller: {p['state_bytes_held_by_caller'] / MB:.0f} MB")
    # the scale section's RSS goal: peak RSS after the run, the RAM tier's bytes apart
    from .scale import ram_tier_bytes

    peak = dict(b["steps"])["run (warm + cold)"]["VmHWM"]
    ram = ram_tier_bytes(p)
    lines.append(f"  peak RSS after the run {peak / MB:.0f} MB: {(peak - ram) / MB:.0f} MB less "
                 f"the RAM tier's {ram / MB:.0f} MB")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-32k")
    ap.add_argument("--target", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0,
                    help="batch threads (default: every core); memory does not depend on them, "
                         "and one thread keeps a busy machine's time down")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    b = breakdown(args.model, args.target, n_threads=args.threads)
    print(json.dumps(b) if args.json else report(b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
