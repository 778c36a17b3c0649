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
