"""llama-server as its users start it, as a peer: the recurring rows over HTTP.

Only the model, the host (127.0.0.1), a free port and the context size are given; everything
else is llama-server's default: its slots (this build: "auto", 4 slots sharing one unified KV
cache of the given size, each slot picked by how much of the prompt it holds), its host-memory
prompt cache (``--cache-ram``, 8 GiB), its threads, batch sizes and attention kernel.
``slots`` pins the slot count (``-np``) for a comparison with one slot.

Each row is one streamed ``/completion`` of the row's token ids with ``cache_prompt`` on, in
file order; its time to first token runs from the request to the first streamed frame that
carries a token (app/servers/llama_server.py), so it includes the HTTP round trip a user of the
server pays.

The binary is the one the project builds from the engine's llama.cpp (beside the venv's python;
app/servers/llama_server_process.find_binary). The server is stopped at the end, with bounded
waits, whatever happened.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from app.engine.llama.cpu_kernels import cpu_facts
from app.servers import LlamaServer
from app.servers.llama_server_process import HOST, ServerProcess, ServerSettings

START_TIMEOUT_S = 120.0
# the scale section's prompts: a 32k-token prefix on a CPU takes minutes before the first frame
LONG_PROMPT_TIMEOUT_S = 3 * 3600.0


class DefaultsServer(ServerProcess):
    """A llama-server started with its defaults: model, host, port and context size only."""

    def __init__(self, model_path: str, n_ctx: int, log_path: str | Path | None = None,
                 slots: int = 0):
        super().__init__(ServerSettings(model_path=str(model_path), flash_attn=False,
                                        n_ctx=n_ctx), log_path)
        self.cmd = [str(self.binary), "-m", str(model_path), "--host", HOST,
                    "--port", str(self.port), "-c", str(n_ctx)]
        if slots:
            self.cmd += ["-np", str(slots)]
        if not self.ours and cpu_facts().amx:  # a build we did not make may crash in AMX
            self.cmd.append("--no-repack")


def server_rows(url: str, rows: list[list[int]], max_tokens: int,
                prime: list[int] | None = None) -> list[dict]:
    """The rows in order on the server at ``url``; ``prime`` (untimed) first puts the static
    prefix in its cache, as each of our modes starts with it."""
    out = []
    with LlamaServer(url) as c:
        if prime:
            c.complete(list(prime), 1)
        for tokens in rows:
            got = c.complete(list(tokens), max_tokens, cache_prompt=True)
            out.append({"ttft_ms": got.ttft_ms, "total_ms": got.total_ms,
                        "prompt_ms": got.prompt_ms, "evaluated_tokens": got.evaluated_tokens,
                        "reused_tokens": got.cached_tokens, "slot": got.slot,
                        "tokens": got.tokens})
    return out


def run_server_peer(model_path: str, n_ctx: int, rows: list[list[int]], max_tokens: int,
                    prime: list[int] | None = None, log_path: str | Path | None = None,
                    slots: int = 0) -> dict:
    """Start a defaults llama-server, run the rows, stop it: the rows and how it ran (its
    defaults as its log states them)."""
    with tempfile.TemporaryDirectory(prefix="kvprimer-server-") as tmp:
        log = Path(log_path) if log_path else Path(tmp) / "llama-server.log"
        proc = DefaultsServer(model_path, n_ctx, log, slots)
        proc.start(START_TIMEOUT_S)
        try:
            with LlamaServer(proc.url) as c:
                props = c.props()
            got = server_rows(proc.url, rows, max_tokens, prime)
        finally:
            proc.stop()
        said = log.read_text(encoding="utf-8", errors="replace")
    threads = re.search(r"n_threads = (\d+)", said)
    setup = re.search(r"load_model: initializing, (.*)", said)
    return {"rows": got, "command": proc.cmd[1:], "binary": str(proc.binary),
            "built_by_project": proc.ours, "slots": props.total_slots, "n_ctx": props.n_ctx,
            "threads": int(threads.group(1)) if threads else None,
            "kv_setup": setup.group(1).strip() if setup else "", "build_info": props.build_info}


def slot_and_cache_ram(model_path: str, *, n_ctx: int, flash_attn: bool, n_batch: int,
                       n_threads: int, tokens: list[int], boundary: int, unrelated: list[int],
                       max_tokens: int, repeats: int) -> dict:
    """llama-server as `kvprimer serve` starts it (one slot, the engine's kernel, batch and
    threads; app/servers/llama_server_process.py), on one prompt of the scale section:
    - its host-memory prompt cache (``--cache-ram``, its default size): the prefix evaluated,
      then an unrelated prompt takes the slot, then the prompt (the prefix comes back from the
      cache). One sample: after it the cache holds the whole prompt, and a second request
      would reuse more than the prefix;
    - slot restore from ``--slot-save-path``: the server's own save of the prefix, restored by
      a second server started with ``--cache-ram 0`` (so nothing else can serve the prefix)
      after an unrelated prompt, ``repeats`` times; its time to first token counts the restore
      request and the completion.
    A part that fails is said under "<part>_error"; the other still runs."""
    prefix = tokens[:boundary]
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="kvprimer-scale-server-") as tmp:
        base = dict(model_path=str(model_path), flash_attn=flash_attn, n_ctx=n_ctx,
                    slot_dir=str(Path(tmp) / "slots"), n_batch=n_batch, n_threads=n_threads)
        try:
            with ServerProcess(ServerSettings(**base), Path(tmp) / "a.log").start(
                    START_TIMEOUT_S) as proc, \
                    LlamaServer(proc.url, timeout_s=LONG_PROMPT_TIMEOUT_S) as c:
                first = c.complete(prefix, 1, cache_prompt=True)
                saved = c.slot(0, "save", "prefix.bin")
                out["prefix_ms"] = first.ttft_ms
                out["slot_file"] = {"tokens": saved.tokens, "bytes": saved.bytes,
                                    "save_ms": saved.ms}
                out["command"] = proc.cmd[1:]
                c.complete(unrelated, 1, cache_prompt=True)
                got = c.complete(tokens, max_tokens, cache_prompt=True)
                out["cache_ram"] = [{"ttft_ms": got.ttft_ms, "reused_tokens": got.cached_tokens,
                                     "evaluated_tokens": got.evaluated_tokens,
                                     "tokens": got.tokens}]
        except Exception as e:  # noqa: BLE001 - said in the results; the restore may still run
            out["cache_ram_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        if "slot_file" not in out:
            return out
        try:
            out["slot_restore"] = _slot_restores(base, Path(tmp), tokens, unrelated, max_tokens,
                                                 repeats)
        except Exception as e:  # noqa: BLE001
            out["slot_restore_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return out


def _slot_restores(base: dict, tmp: Path, tokens: list[int], unrelated: list[int],
                   max_tokens: int, repeats: int) -> list[dict]:
    """The saved prefix restored into a server that keeps no host-memory cache, after an
    unrelated prompt took its slot, then the prompt; ``repeats`` times."""
    import time as _time

    rows = []
    with ServerProcess(ServerSettings(**base, extra_args=("--cache-ram", "0")),
                       tmp / "b.log").start(START_TIMEOUT_S) as proc, \
            LlamaServer(proc.url, timeout_s=LONG_PROMPT_TIMEOUT_S) as c:
        for _ in range(repeats):
            c.complete(unrelated, 1, cache_prompt=True)
            t0 = _time.perf_counter()
            r = c.slot(0, "restore", "prefix.bin")
            restore_ms = (_time.perf_counter() - t0) * 1000
            got = c.complete(tokens, max_tokens, cache_prompt=True)
            rows.append({"ttft_ms": restore_ms + got.ttft_ms, "restore_ms": restore_ms,
                         "server_restore_ms": r.ms, "restored_tokens": r.tokens,
                         "reused_tokens": got.cached_tokens,
                         "evaluated_tokens": got.evaluated_tokens, "tokens": got.tokens})
    return rows
