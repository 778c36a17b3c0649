"""Where a warm start's fixed cost goes: reading the .kvstate file, engine.restore, and the bare
llama_state_seq_set_data call under it, fed the bytes in place and after a copy into a ctypes
array (what the copy would cost the engine). Figures to explain the warm path, not goals.

``paired_file_load`` (`python -m bench.restore_probe STATE.kvstate`) times the file's read into
plain new memory against memory advised to huge pages, interleaved in one process;
``paired_overlap_load`` (``--overlap``) the checksum after each read against the read in a
thread of its own; ``paired_placed_load`` (``--placed MODEL``) a cached file placed straight
into the work context against read then restored; ``chunked_memcpy`` (``--pieces``) a memcpy
in one call against the pieces a restore copies; ``file_path_breakdown`` each step of
`run --state` inside the real path."""
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


def _paired_loads(path: Path, n: int, ways: dict, restore) -> dict[tuple[str, str], list[float]]:
    """``PrefixState.load(path)`` timed (ms) each of ``ways`` (name -> a call that sets the
    loader up that way), interleaved in one process and alternating who goes first, each from
    a dropped page cache and again cached; ``restore()`` sets the loader back."""
    from .scale_ours import drop_from_page_cache

    got: dict[tuple[str, str], list[float]] = {(w, c): [] for w in ways for c in ("dropped", "cached")}
    try:
        for i in range(n):
            for way in (ways if i % 2 == 0 else reversed(list(ways))):
                ways[way]()
                for cache in ("dropped", "cached"):
                    if cache == "dropped":
                        drop_from_page_cache(path)
                    t0 = time.perf_counter()
                    PrefixState.load(path)
                    got[(way, cache)].append((time.perf_counter() - t0) * 1000)
    finally:
        restore()
    return got


def paired_file_load(path: Path, n: int = 8) -> dict:
    """A .kvstate read (``PrefixState.load``) into plain new memory and into memory advised to
    huge pages (what the loader does, states/body_buffer.py), interleaved in one process, each
    from a dropped page cache and again cached: medians (ms) and the medians of the paired
    ratios (advised / plain). Shows what page faults on a fresh buffer cost a load."""
    from app.engine.llama.native import new_bytes
    from app.engine.states import body_buffer
    from app.engine.states.body_buffer import new_body

    def use(fn):
        return lambda: setattr(body_buffer, "new_body", fn)  # the buffer read_body fills

    got = _paired_loads(path, n, {"plain": use(new_bytes), "huge_pages": use(new_body)},
                        use(body_buffer.new_body))
    out: dict = {"bytes": path.stat().st_size, "repeats": n}
    for cache in ("dropped", "cached"):
        plain, huge = got[("plain", cache)], got[("huge_pages", cache)]
        out[cache] = {"plain_ms": statistics.median(plain), "huge_pages_ms": statistics.median(huge),
                      "huge_vs_plain": statistics.median(h / p for h, p in zip(huge, plain))}
    return out


def paired_overlap_load(path: Path, n: int = 8) -> dict:
    """A .kvstate load with the checksum after each read, in one thread, against the loader's
    read in a thread of its own beside the checksum (body_buffer._read_overlapped),
    interleaved in one process, page cache dropped and cached: medians (ms), and the paired
    ratios' median and range (overlapped / serial)."""
    from app.engine.states import body_buffer

    def use(at_least: int):
        return lambda: setattr(body_buffer, "OVERLAP_MIN", at_least)

    real = body_buffer.OVERLAP_MIN
    got = _paired_loads(path, n, {"serial": use(1 << 62), "overlapped": use(real)}, use(real))
    out: dict = {"bytes": path.stat().st_size, "repeats": n}
    for cache in ("dropped", "cached"):
        serial, both = got[("serial", cache)], got[("overlapped", cache)]
        ratios = [b / a for a, b in zip(serial, both)]
        out[cache] = {"serial_ms": statistics.median(serial), "overlapped_ms": statistics.median(both),
                      "overlapped_vs_serial": statistics.median(ratios),
                      "range": [min(ratios), max(ratios)]}
    return out


# the steps of `run --state` timed by file_path_breakdown: (label, owner, attribute)
_STEPS = (("read + checksum", "app.engine.states.prefix_state:PrefixState", "_read"),
          ("load_state (read, check, V layout)", "app.engine.kv_engine:Engine", "load_state"),
          ("adopt into the cache", "app.engine.kv_engine:Engine", "adopt"),
          ("restore into the work context", "app.engine.slot.work_context:WorkContext", "restore"),
          ("llama_state_seq_set_data", "app.engine.llama.native:NativeContext", "state_set"))


def _timed_steps(got: dict[str, list[float]]):
    """Wrap each of _STEPS to add its time (ms) to ``got[label]``; returns the undo."""
    import importlib

    undo = []
    for label, where, attr in _STEPS:
        mod, cls = where.split(":")
        owner = getattr(importlib.import_module(mod), cls)
        raw = owner.__dict__[attr]
        fn = raw.__func__ if isinstance(raw, classmethod) else raw

        def wrap(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                got[_label][-1] += (time.perf_counter() - t0) * 1000

        setattr(owner, attr, classmethod(wrap) if isinstance(raw, classmethod) else wrap)
        undo.append((owner, attr, raw))
    return lambda: [setattr(o, a, r) for o, a, r in undo]


def file_path_breakdown(engine: Engine, template, values: dict, path: Path, n: int = 5) -> dict:
    """Where `kvprimer run --state` spends its time, step by step, ``n`` times: the sequential
    read of the same file (page cache dropped: the floor's read), then the cache emptied, the
    file dropped again, ``state_flows.load_state`` and the warm run from it (prefix mode, no
    cold run), each step of _STEPS timed inside that real path, and the checksum alone over
    the bytes in memory (what the load hides behind the disk, or not). Medians, minima and
    maxima (ms), and the load average before and after."""
    import os

    import xxhash

    from app.engine import GenerationConfig, run_prompt, state_flows

    from .scale_ours import drop_from_page_cache, read_ms

    labels = ["sequential read (dropped)", "checksum alone (in memory)", "whole load_state",
              *(label for label, _, _ in _STEPS), "warm run: restore", "warm run: suffix",
              "warm run: first token (ttft)", "load + warm run"]
    got: dict[str, list[float]] = {k: [] for k in labels}
    buf = bytearray(path.stat().st_size)
    read_ms(path, buf)  # the buffer's pages touched once, untimed
    load0 = os.getloadavg()
    undo = _timed_steps(got)
    placed = state_flows.placed_state
    # the read path's steps, whatever the file system (tmpfs keeps a dropped file: it would
    # be mapped); paired_placed_load times the mapped path
    state_flows.placed_state = lambda e, p: None
    try:
        for _ in range(n):
            for v in got.values():
                v.append(0.0)
            drop_from_page_cache(path)
            got["sequential read (dropped)"][-1] = read_ms(path, buf)
            engine.clear_cache()
            engine.work.reset()
            drop_from_page_cache(path)
            t0 = time.perf_counter()
            state = state_flows.load_state(engine, path, template)
            got["whole load_state"][-1] = load = (time.perf_counter() - t0) * 1000
            rep = run_prompt(engine, template, values, reuse="prefix", state=state, cold=False,
                             warm=True, oneshot=False, gen=GenerationConfig(max_tokens=1))
            w = rep.warm
            got["warm run: restore"][-1] = w.restore_ms
            got["warm run: suffix"][-1] = w.prompt_ms
            got["warm run: first token (ttft)"][-1] = w.ttft_ms
            got["load + warm run"][-1] = load + w.ttft_ms
            t0 = time.perf_counter()
            xxhash.xxh3_128(state.data)
            got["checksum alone (in memory)"][-1] = (time.perf_counter() - t0) * 1000
    finally:
        undo()
        state_flows.placed_state = placed
    return {"bytes": path.stat().st_size, "repeats": n, "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
            "ms": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                   for k, v in got.items()}}


def paired_placed_load(engine: Engine, path: Path, n: int = 9) -> dict:
    """A .kvstate in the page cache brought into the work context ``n`` times each way,
    interleaved (who goes first alternating): placed (``state_flows.load_state`` mapping the
    file, its cells copied by llama.cpp from the cached pages while a thread copies the bytes
    the state keeps: states/mapped_state.py) against the read path (the file read into new
    memory, then the cells restored from it, as when it cannot be mapped). Medians (ms), the
    paired ratios' median (placed / read) and whether every placed load was placed."""
    from app.engine import state_flows

    real = state_flows.placed_state
    got: dict[str, list[float]] = {"placed": [], "read": []}
    placed_every_time = True
    try:
        for i in range(n):
            for way in (("placed", "read") if i % 2 == 0 else ("read", "placed")):
                state_flows.placed_state = real if way == "placed" else (lambda e, p: None)
                engine.clear_cache()
                engine.work.reset()
                path.read_bytes()  # in the page cache, as a just written or read file is
                t0 = time.perf_counter()
                state = state_flows.load_state(engine, path)
                # (placed: in place already, nothing copied)
                copied = engine.work_slot.restore(state.data, list(state.tokens), state.n_tokens)
                got[way].append((time.perf_counter() - t0) * 1000)
                if way == "placed" and copied:
                    placed_every_time = False
    finally:
        state_flows.placed_state = real
    return {"bytes": path.stat().st_size, "repeats": n,
            "placed_ms": statistics.median(got["placed"]), "read_ms": statistics.median(got["read"]),
            "placed_vs_read": statistics.median(a / b for a, b in zip(got["placed"], got["read"])),
            "range": [min(a / b for a, b in zip(got["placed"], got["read"])),
                      max(a / b for a, b in zip(got["placed"], got["read"]))],
            "placed_every_time": placed_every_time}


def chunked_memcpy(nbytes: int, pieces=(0, 3 << 20, 256 << 10, 16 << 10), n: int = 7) -> dict:
    """A memcpy of ``nbytes`` in one call against the same bytes copied in pieces of each size
    (0: one call), interleaved ``n`` times: medians (ms) and GB/s. llama.cpp restores a state
    a layer's K rows at a time (a few MB), and V the same, or one row of a dimension at a time
    when it is stored transposed (flash attention off: 2 bytes a cell, 16 KB at 8k cells);
    glibc's memcpy streams past the cache only for large calls, so the pieces' rate, not one
    large copy's, bounds a restore."""
    import numpy as np

    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: not part of a copy

    def copy(piece: int):
        step = piece or nbytes
        for a in range(0, nbytes, step):
            np.copyto(dst[a:a + step], src[a:a + step])

    got: dict[int, list[float]] = {p: [] for p in pieces}
    for _ in range(n):
        for p in pieces:
            t0 = time.perf_counter()
            copy(p)
            got[p].append((time.perf_counter() - t0) * 1000)
    return {"bytes": nbytes, "repeats": n,
            "pieces": [{"piece_bytes": p or nbytes, "ms": statistics.median(v),
                        "gb_s": nbytes / statistics.median(v) / 1e6} for p, v in got.items()]}


def main(argv=None) -> int:
    """`python -m bench.restore_probe STATE.kvstate [-n 8]`: paired_file_load's figures;
    ``--overlap`` paired_overlap_load's; ``--placed MODEL --n-ctx N`` paired_placed_load's;
    ``--pieces`` chunked_memcpy's for the state's size."""
    import argparse
    import json
    import os

    ap = argparse.ArgumentParser(description=paired_file_load.__doc__.splitlines()[0])
    ap.add_argument("state", type=Path)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--overlap", action="store_true",
                    help="instead: the checksum after each read against the reader thread")
    ap.add_argument("--placed", metavar="MODEL", type=Path,
                    help="instead: the state placed from the page cache against read, then "
                         "restored, on MODEL (the one it was primed with)")
    ap.add_argument("--n-ctx", type=int, default=4096, help="with --placed: the context size")
    ap.add_argument("--pieces", action="store_true",
                    help="instead: a memcpy of the state's size in one call and in pieces")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    if args.pieces:
        out = chunked_memcpy(args.state.stat().st_size, n=args.n)
    elif args.placed:
        from app.engine import EngineConfig

        with Engine(EngineConfig(model_path=str(args.placed), n_ctx=args.n_ctx),
                    measure_kernels_later=True) as engine:
            out = paired_placed_load(engine, args.state, args.n)
    else:
        out = (paired_overlap_load if args.overlap else paired_file_load)(args.state, args.n)
    out.update(loadavg_before=load0, loadavg=os.getloadavg(), nproc=os.cpu_count(),
               date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
