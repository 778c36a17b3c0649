"""Where a warm start's fixed cost goes: reading the .kvstate file, engine.restore, and the bare
llama_state_seq_set_data call under it, fed the bytes in place and after a copy into a ctypes
array (what the copy would cost the engine). Figures to explain the warm path, not goals."""
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
