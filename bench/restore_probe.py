"""Where a warm start's fixed cost goes: reading the .kvstate file, engine.restore, and the bare
llama_state_seq_set_data call under it, fed the bytes in place and after a copy into a ctypes
array (what the copy would cost the engine). Figures to explain the warm path, not goals.

``paired_file_load`` (`python -m bench.restore_probe STATE.kvstate`) times the file's read into
plain new memory against memory advised to huge pages, interleaved in one process."""
from __future__ import annotations

import ctypes
import statistics
import time
from pathlib import Path

import llama_cpp as L

from app.engine import Engine, PrefixState


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def probe_restore(engine: Engine, state: PrefixState, path: Path, n: int = 5, seq: int = 0) -> dict:
    ctx = engine.ctx
    data = state.data

    def engine_restore():
        engine.seqs.clear(seq)
        engine.restore(state, seq)

    def set_in_place():
        ctx.seq_rm(seq)
        if not ctx.state_set(data, seq):  # the engine's call: the bytes passed in place
            raise RuntimeError("llama_state_seq_set_data rejected the state")

    def set_after_copy():
        ctx.seq_rm(seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if L.llama_state_seq_set_data(ctx.ptr, buf, len(data), seq) != len(data):
            raise RuntimeError("llama_state_seq_set_data rejected the state")

    out = {
        "prefix_tokens": state.n_tokens,
        "state_bytes": len(data),
        "file_load_ms": _median_ms(lambda: PrefixState.load(path), n),
        "engine_restore_ms": _median_ms(engine_restore, n),
        "set_data_in_place_ms": _median_ms(set_in_place, n),
        "set_data_after_copy_ms": _median_ms(set_after_copy, n),
        "state_get_ms": _median_ms(lambda: ctx.state_get(seq), n),
        "repeats": n,
    }
    engine.seqs.clear(seq)  # the probes left llama.cpp's cells and our token list out of step
    return out


def paired_file_load(path: Path, n: int = 8) -> dict:
    """A .kvstate read (``PrefixState.load``) into plain new memory and into memory advised to
    huge pages (what the loader does, states/body_buffer.py), interleaved in one process, each
    from a dropped page cache and again cached: medians (ms) and the medians of the paired
    ratios (advised / plain). Shows what page faults on a fresh buffer cost a load."""
    from app.engine.llama.native import new_bytes
    from app.engine.states import body_buffer
    from app.engine.states.body_buffer import new_body

    from .scale_ours import drop_from_page_cache

    ways = {"plain": new_bytes, "huge_pages": new_body}
    got: dict[tuple[str, str], list[float]] = {(w, c): [] for w in ways for c in ("dropped", "cached")}
    real = body_buffer.new_body  # the buffer read_body fills
    try:
        for i in range(n):
            for way in (ways if i % 2 == 0 else reversed(list(ways))):  # alternate who goes first
                body_buffer.new_body = ways[way]
                for cache in ("dropped", "cached"):
                    if cache == "dropped":
                        drop_from_page_cache(path)
                    t0 = time.perf_counter()
                    PrefixState.load(path)
                    got[(way, cache)].append((time.perf_counter() - t0) * 1000)
    finally:
        body_buffer.new_body = real
    out: dict = {"bytes": path.stat().st_size, "repeats": n}
    for cache in ("dropped", "cached"):
        plain, huge = got[("plain", cache)], got[("huge_pages", cache)]
        out[cache] = {"plain_ms": statistics.median(plain), "huge_pages_ms": statistics.median(huge),
                      "huge_vs_plain": statistics.median(h / p for h, p in zip(huge, plain))}
    return out


def main(argv=None) -> int:
    """`python -m bench.restore_probe STATE.kvstate [-n 8]`: paired_file_load's figures."""
    import argparse
    import json
    import os

    ap = argparse.ArgumentParser(description=paired_file_load.__doc__.splitlines()[0])
    ap.add_argument("state", type=Path)
    ap.add_argument("-n", type=int, default=8)
    args = ap.parse_args(argv)
    out = paired_file_load(args.state, args.n)
    out["loadavg"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
