"""The reuse section's peers: the recurring rows, in the same order, through what users of
llama.cpp reach for instead of KV Primer.

- ``llamacpp_ram_native_recurring``: llama-cpp-python built as `pip install` builds it here
  (native_peer.py), with a LlamaRAMCache large enough for every row, in a process of its own;
- ``llama_server_recurring``: llama-server with its defaults, over HTTP (server_peer.py);
- ``llamacpp_ram_recurring``: the same LlamaRAMCache loop on the project's own build, in this
  process (llamacpp_paths.py).

Every peer gets the token ids our engine evaluates, and starts with the static prefix in its
cache (untimed), as each of our modes does; each row's time to first token is paired with our
modes' on the same row (ratios.py). A peer that cannot run (no compiler, no llama-server) is
reported with its error; the others still run.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.engine.llama.cpu_kernels import cpu_facts
from app.engine.llama.ggml_types import KV_TYPES

from .llamacpp_paths import LlamaPaths, recurring_rows
from .native_peer import native_python, run_peer
from .server_peer import run_server_peer


@dataclass(frozen=True)
class PeerRun:
    """What every peer is given: the model and the engine's settings, the prefix it starts
    with, and each row's number and token ids."""
    model_path: str
    n_ctx: int
    n_batch: int
    n_threads: int
    flash_attn: bool  # the engine's measured choice: the llama-cpp-python peers run it too
    max_tokens: int
    prime: list[int]
    numbers: list[int]
    tokens: list[list[int]]
    timeout_s: float = 3600.0
    server_slots: int = 0  # llama-server's -np; 0: its default


def numbered(run: PeerRun, got: list[dict]) -> list[dict]:
    return [{"row": n, **g} for n, g in zip(run.numbers, got)]


def project_build(run: PeerRun) -> dict:
    """LlamaRAMCache on the venv's own llama-cpp-python (the project's portable build)."""
    with tempfile.TemporaryDirectory(prefix="kvprimer-bench-") as tmp:
        llama = LlamaPaths(run.model_path, n_ctx=run.n_ctx, n_batch=run.n_batch,
                           n_threads=run.n_threads, cache_dir=Path(tmp),
                           flash_attn=run.flash_attn)
        try:
            got = recurring_rows(llama, run.tokens, run.max_tokens, run.prime)
        finally:
            llama.close()
    return {"rows": numbered(run, got)}


def peer_request(run: PeerRun, use_extra_bufts: bool) -> dict:
    return {"model_path": run.model_path, "n_ctx": run.n_ctx, "n_batch": run.n_batch,
            "n_threads": run.n_threads, "flash_attn": run.flash_attn,
            "use_extra_bufts": use_extra_bufts, "type_kv": KV_TYPES["f16"].id,
            "max_tokens": run.max_tokens, "prime": run.prime, "rows": run.tokens}


def native_build(run: PeerRun, version: str, log) -> dict:
    """LlamaRAMCache on llama-cpp-python built natively, in its own venv and process; extra
    buffer types off on an AMX CPU only (where GCC 12's build crashes)."""
    python = native_python(version, log)
    answer = run_peer(python, peer_request(run, use_extra_bufts=not cpu_facts().amx),
                      run.timeout_s)
    return {"rows": numbered(run, answer["rows"]), "python": str(python),
            "llama_cpp_python": answer["llama_cpp_python"], "library": answer["library"],
            "system_info": answer["system_info"]}


def llama_server(run: PeerRun) -> dict:
    got = run_server_peer(run.model_path, run.n_ctx, run.tokens, run.max_tokens, run.prime,
                          slots=run.server_slots)
    got["rows"] = numbered(run, got["rows"])
    return got


def run_peers(run: PeerRun, *, project: bool, native: bool, server: bool, version: str,
              log=print) -> dict:
    """Each chosen peer in turn; under "<name>_recurring" its rows, under "<name>" the rest
    (or its error)."""
    out: dict = {}
    steps = [("llamacpp_ram", project, "llama-cpp-python (this project's build) with a "
              "LlamaRAMCache", lambda: project_build(run)),
             ("llamacpp_ram_native", native, "llama-cpp-python built natively, in its own "
              "process, with a LlamaRAMCache", lambda: native_build(run, version, log)),
             ("llama_server", server, "llama-server with its defaults, over HTTP",
              lambda: llama_server(run))]
    for name, wanted, what, step in steps:
        if not wanted:
            continue
        log(f"reuse: {what}, the same rows in order")
        t0 = time.perf_counter()
        try:
            got = step()
        except Exception as e:  # noqa: BLE001 - one peer's failure must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            log(f"reuse: {what} failed: {out[name]['error']}")
            continue
        out[f"{name}_recurring"] = got.pop("rows")
        out[name] = {**got, "duration_s": round(time.perf_counter() - t0, 1)}
    return out
