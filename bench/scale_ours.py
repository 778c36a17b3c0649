"""The scale section's run of KV Primer itself, in a process of its own (so that its peak RSS is
the engine's alone): `python -m bench.scale_ours` reads one JSON request on stdin and writes one
JSON answer on stdout; llama.cpp's own output goes to stderr.

The engine is driven as the CLI drives it (app/cli/run_commands.py): an Engine opened with the
kernel choice it already has (never measuring in the foreground: the section times runs, not
the measurement), ``session_flows.prime``, the state saved, ``run_prompt`` in prefix mode with
cold and warm paths, and a saved state loaded as `run --state` loads it
(``state_flows.load_state``). Then, ``repeats`` times, in this order so that each group of
samples meets the same load:
- limit: the suffix evaluated in a plain context already holding the prefix (its cells set from
  the primed state, so no second evaluation of the prefix), then the first token;
- resident: the warm run with the prefix node resident (the work context emptied first, so the
  prefix is copied from the cache, not kept in place);
- ram / file_tier: the prefix node moved down to the RAM tier or to the cache's file tier
  (evictions), then the warm run, which brings it back inside its own clock (its restore time).
  Each sample says which tier the node was in: a prefix larger than the resident tier's cap
  (3/4 of the context's cells) lives in the RAM tier between runs, so its "resident" samples
  come from the RAM tier too;
- state_file: the cache emptied, the .kvstate file dropped from the page cache
  (posix_fadvise), read and adopted, then the warm run: `kvprimer run --state`. Just before,
  the same file, dropped, is read sequentially into a plain buffer (``read_ms``): the disk's
  time for these very bytes in this repeat, so the floor (limit + read) is paired with the
  sample and a slow spell of the disk is not read as slow code;
- state_file_cached: the same again right after, the file now in the page cache: `run --state`
  run again soon after.
Every warm run is judged against the one cold run (run_prompt's cold_cache: same batches).

The machine's limits for the same bytes, measured here too: a memcpy (numpy copy between two
buffers of the state's size) and a sequential read of a file of the same size, after dropping
it from the page cache and again cached.

Peak RSS (VmHWM, see peak_rss) is read at checkpoints: after loading, after prime, after the first run
(what `kvprimer prime` + `kvprimer run` hold), after the tier runs, and at the end (the limit's
context added).
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .child_protocol import answer_request


MODEL_KEYS = ("path", "name", "architecture", "n_layer", "n_embd", "n_head", "n_head_kv", "n_ctx",
              "n_ctx_train", "kv_bytes_per_token", "file_bytes")


def peak_rss() -> int:
    """This process's peak RSS in bytes. Linux: VmHWM, this program's own peak; ru_maxrss
    keeps the peak of the process it was forked from across exec (the bench's parent reached
    1.3 GB, and every child's figure started there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to forget the file's cached pages (no root needed: the file is clean
    after fsync). False where posix_fadvise is missing."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def read_ms(path: Path, buf: bytearray) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    return (time.perf_counter() - t0) * 1000


def machine_limits(nbytes: int, folder: Path, repeats: int = 5) -> dict:
    """memcpy and sequential-read times for ``nbytes`` (medians), and the read from a dropped
    page cache, on the filesystem of ``folder`` (where the state file lies)."""
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of the pages: not part of a copy's cost
    copies = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append((time.perf_counter() - t0) * 1000)
    path = folder / "read-limit.bin"
    src.tofile(path)
    del dst
    buf = bytearray(nbytes)
    cold, cached = [], []
    dropped = True
    for _ in range(max(2, repeats // 2)):
        dropped = drop_from_page_cache(path) and dropped
        cold.append(read_ms(path, buf))
        cached.append(read_ms(path, buf))
    path.unlink()
    return {"bytes": nbytes, "memcpy_ms": statistics.median(copies),
            "read_cold_ms": statistics.median(cold), "read_cached_ms": statistics.median(cached),
            "page_cache_dropped": dropped}


def _path(p, extra: dict | None = None) -> dict:
    return {"ttft_ms": p.ttft_ms, "restore_ms": p.restore_ms, "prompt_ms": p.prompt_ms,
            "evaluated_tokens": p.evaluated_tokens, "reused_tokens": p.reused_tokens,
            "tokens": list(p.tokens), **(extra or {})}


def _verdict(rep) -> str:
    return rep.verdict.equivalence if rep.verdict else "not judged"


def serve(req: dict) -> dict:
    from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
    from app.engine import session_flows
    from app.engine.llama.thread_fit import shared_fit

    from .workload import UNRELATED_TEXT

    rss = {"imports": peak_rss()}
    t_start = time.perf_counter()
    eng = Engine(EngineConfig(model_path=req["model_path"], n_ctx=req["n_ctx"],
                              n_batch=req["n_batch"], n_threads=req["n_threads"]),
                 measure_kernels_later=True)
    tmp = Path(tempfile.mkdtemp(prefix="kvprimer-scale-", dir=req.get("tmp_dir")))
    try:
        rss["load"] = peak_rss()
        info = eng.info
        tpl = Template.parse(req["template"])
        gen = GenerationConfig(max_tokens=req["max_tokens"])
        t0 = time.perf_counter()
        state = session_flows.prime(eng, tpl)
        prime_ms = (time.perf_counter() - t0) * 1000
        rss["prime"] = peak_rss()
        tiers_after_prime = [t.__dict__ for t in eng.cache.tier_usage()]
        state_file = tmp / "prefix.kvstate"
        file_bytes = state.save(state_file)
        colds: dict = {}

        def run(state_arg=None):
            return run_prompt(eng, tpl, req["values"], reuse="prefix", state=state_arg,
                              cold=True, warm=True, oneshot=False, gen=gen, cold_cache=colds)

        # one thread count for every one-token decode of this process: the kept cold run is
        # keyed by it (run_prompt's cold_cache), and a change of load would run it again
        with shared_fit().pinned():
            first = run()
            rss["run"] = peak_rss()
            tiers_after_run = [t.__dict__ for t in eng.cache.tier_usage()]
            tokens = eng.tokenize(tpl.fill(req["values"]))
            boundary = first.warm.reused_tokens
            got = _samples(eng, tpl, run, state, state_file, tokens, boundary, req["repeats"])
        rss["tiers"] = peak_rss()
        limits = machine_limits(len(state.data), tmp)
        rss["end"] = peak_rss()
        return {
            "ok": True,
            "model": {k: info.as_dict()[k] for k in MODEL_KEYS},
            "kernels": eng.kernels.describe(), "flash_attn": bool(eng.kernels.flash_attn),
            "prompt_tokens": len(tokens), "prefix_tokens": state.n_tokens, "boundary": boundary,
            "suffix_tokens": len(tokens) - boundary, "tokens": tokens,
            "unrelated": eng.model.tokenize(UNRELATED_TEXT),
            "prime_ms": prime_ms,
            "cold": _path(first.cold), "cold_runs": len(colds), "first_warm": _path(first.warm),
            "first_verdict": _verdict(first), **got,
            "sizes": {"state_bytes": len(state.data), "state_file_bytes": file_bytes,
                      "raw_kv_bytes": state.n_tokens * info.kv_bytes_per_token,
                      "recurrent_state_bytes": info.traits.recurrent_state_bytes},
            "limits": limits, "peak_rss": rss, "tiers_after_prime": tiers_after_prime,
            "tiers_after_run": tiers_after_run,
            "seconds": round(time.perf_counter() - t_start, 1),
        }
    finally:
        eng.close()
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        tmp.rmdir()


def _samples(eng, tpl, run, state, state_file: Path, tokens: list[int], boundary: int,
             repeats: int) -> dict:
    """``repeats`` rounds of: the limit, the warm run from each tier, the warm run from the
    state file (module docstring)."""
    from app.engine import KvPrimerError

    from .kvprimer_paths import FastestLimit
    from .workload import RowTokens

    row = RowTokens(1, tokens, boundary)
    samples: dict[str, list[dict]] = {k: [] for k in (
        "limit", "resident", "ram", "file_tier", "state_file", "state_file_cached")}
    verdicts: dict[str, list[str]] = {k: [] for k in samples if k != "limit"}
    errors: dict[str, str] = {}  # a path that failed: the engine's one line, once
    limit = FastestLimit(eng)
    read_buf = bytearray(state_file.stat().st_size)  # the floor's reads land here,
    np.frombuffer(read_buf, np.uint8)[:] = 1  # in pages touched once, before any is timed
    try:
        seeded = _seed_limit(limit, state, tokens[:boundary])
        for _ in range(repeats):
            s = limit.run(row)
            samples["limit"].append({"ttft_ms": s.ms, "evaluated_tokens": s.evaluated,
                                     "tokens": [s.first_token]})
            for tier in ("resident", "ram", "file_tier"):
                if tier in errors:
                    continue
                try:
                    samples[tier].append(_tier_sample(eng, tpl, run, state, tier, verdicts))
                except KvPrimerError as e:  # what a user's run would be told; the rest runs
                    errors[tier] = f"{type(e).__name__}: {e}"
                    _recover(eng, tpl)
            if "state_file" in errors:
                continue
            try:
                samples["state_file"].append(_file_sample(eng, tpl, run, state_file, verdicts,
                                                          read_buf))
                samples["state_file_cached"].append(_load_and_run(
                    eng, tpl, run, state_file, verdicts, "state_file_cached",
                    {"page_cache_dropped": False, "from_tier": "state file, page cache"}))
            except KvPrimerError as e:  # what a user of `run --state` would be told
                errors["state_file"] = f"{type(e).__name__}: {e}"
                _recover(eng, tpl)
    finally:
        limit.close()
    return {"samples": samples, "verdicts": verdicts, "limit_seeded_from_state": seeded,
            "errors": errors}


def _tier_sample(eng, tpl, run, state, tier: str, verdicts: dict) -> dict:
    """The warm run with the prefix's node moved down to ``tier`` first."""
    eng.work.reset()  # the prefix comes from the cache, not kept in place
    was = _move_to(eng, state.n_tokens, TIERS[tier])
    # the warm run brings the prefix back from that tier inside its own clock (prompt_runs)
    rep = run()
    w = _path(rep.warm, {"from_tier": was, "hit_tier": rep.hit_tier})
    verdicts[tier].append(_verdict(rep))
    return w


def _file_sample(eng, tpl, run, state_file: Path, verdicts: dict, read_buf: bytearray) -> dict:
    """`kvprimer run --state`: an empty cache, the file out of the page cache, read, checked
    and adopted (state_flows.load_state), then the warm run from it."""
    drop_from_page_cache(state_file)
    disk_ms = read_ms(state_file, read_buf)  # the floor's read: these bytes, this repeat
    dropped = drop_from_page_cache(state_file)
    return _load_and_run(eng, tpl, run, state_file, verdicts, "state_file",
                         {"read_ms": disk_ms, "page_cache_dropped": dropped,
                          "from_tier": "state file"})


def _load_and_run(eng, tpl, run, state_file: Path, verdicts: dict, path: str,
                  extra: dict) -> dict:
    """The cache emptied, the file loaded as `run --state` loads it, the warm run. Right after
    a load with the page cache dropped, the file is in the page cache: ``state_file_cached``
    is `run --state` run again soon after, as a loop over rows does."""
    from app.engine import state_flows

    eng.clear_cache()
    t0 = time.perf_counter()
    loaded = state_flows.load_state(eng, state_file, tpl)
    load_ms = (time.perf_counter() - t0) * 1000
    rep = run(loaded)
    w = _path(rep.warm, {"load_ms": load_ms, **extra})
    w["ttft_ms"] += load_ms  # the file is read inside the warm run's time, as the CLI's
    verdicts[path].append(_verdict(rep))
    return w


def _recover(eng, tpl) -> None:
    """After a path failed: an empty cache and the prefix primed again (untimed), so that the
    other paths start as they would have."""
    eng.clear_cache()
    eng.prime_node(tpl)


TIERS = {"resident": "resident", "ram": "ram", "file_tier": "file"}
ORDER = ("resident", "ram", "file")


def _move_to(eng, depth: int, tier: str) -> str:
    """Evict the cache node holding the static prefix (the one of its depth) down to ``tier``;
    returns the tier it is in then: lower than asked when the cache had moved it further
    already (a prefix over the resident tier's cap lives in the RAM tier between runs)."""
    from app.engine import kv_flows

    node = next((n for n in eng.cache.nodes() if n.tokens == depth), None)
    if node is None:
        raise RuntimeError(f"no cached node holds the {depth}-token prefix")
    for _ in range(ORDER.index(tier) - ORDER.index(node.tier)):
        kv_flows.evict(eng, node.id)
    return next(n.tier for n in eng.cache.nodes() if n.id == node.id)


def _seed_limit(limit, state, prefix: list[int]) -> bool:
    """Put the prefix's cells into the limit's plain context from the primed state (a copy of
    the same cells, so the prefix is not evaluated a second time); False: the context refused
    the state, and the limit evaluates the prefix itself (untimed) on its first run."""
    ctx = limit._context()
    if ctx.state_set(state.data, 0):
        limit.tokens = list(prefix)
        return True
    ctx.clear()
    return False


def main() -> int:
    return answer_request(serve)


if __name__ == "__main__":
    sys.exit(main())
