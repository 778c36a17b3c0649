"""The reuse section's llama-server peer on the tiny model: started with its defaults (model,
host, port and context size only), the rows in order over HTTP with its prompt cache, stopped
at the end with bounded waits; and the three peers through run_peers, the venv's own
llama_cpp standing in for the natively built one."""
from __future__ import annotations

import sys

import pytest

from app.servers import LlamaServer
from app.servers.llama_server_process import find_binary
from bench import reuse_peers
from bench.report import PEER_LABELS, peer_lines
from bench.reuse_peers import PeerRun, run_peers
from bench.server_peer import DefaultsServer, server_rows

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e}); `make setup` builds it",
                allow_module_level=True)

PREFIX = [1] + list(range(40, 80))
A, B, C = list(range(100, 110)), list(range(120, 128)), list(range(140, 145))
ROWS = [PREFIX + A, PREFIX + B, PREFIX + A + C]


def test_llama_server_with_its_defaults_reuses_its_cache_and_stops(tiny_model, tmp_path):
    proc = DefaultsServer(str(tiny_model), 1024, tmp_path / "server.log")
    # what a user types: nothing about slots, batches, threads, kernels or caches
    assert proc.cmd[1:] == ["-m", str(tiny_model), "--host", "127.0.0.1", "--port",
                            str(proc.port), "-c", "1024"]
    proc.start(60)
    try:
        got = server_rows(proc.url, ROWS, 4, prime=PREFIX)
        with LlamaServer(proc.url) as c:
            assert c.props().n_ctx > 0
    finally:
        proc.stop(10)
    assert not proc.running()
    assert len(got) == 3 and all(len(r["tokens"]) == 4 and r["ttft_ms"] > 0 for r in got)
    for row, r in zip(ROWS, got):
        assert r["reused_tokens"] + r["evaluated_tokens"] == len(row)
    # every row starts from the primed prefix at least (the server always evaluates one token
    # again). How much more is the server's own business: a request goes to the slot holding
    # the longest common prefix, and that slot's prompt is kept in the RAM cache only when the
    # new one would lose more than half of it, so here the third row finds only the prefix
    assert all(r["reused_tokens"] >= len(PREFIX) - 1 for r in got)


def test_every_peer_runs_the_same_rows_in_order(tiny_model, monkeypatch):
    monkeypatch.setattr(reuse_peers, "native_python", lambda version, log: sys.executable)
    run = PeerRun(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                  flash_attn=True, max_tokens=4, prime=PREFIX, numbers=[2, 3, 4], tokens=ROWS,
                  timeout_s=120)
    out = run_peers(run, project=True, native=True, server=True, version="0.3.36",
                    log=lambda msg: None)
    for name in ("llamacpp_ram", "llamacpp_ram_native", "llama_server"):
        assert "error" not in out[name], out[name]
        assert [r["row"] for r in out[f"{name}_recurring"]] == [2, 3, 4]
        assert out[name]["duration_s"] >= 0
    # the two llama-cpp-python runs are one loop on one library here: the same work
    native, project = out["llamacpp_ram_native_recurring"], out["llamacpp_ram_recurring"]
    assert [r["evaluated_tokens"] for r in native] == [r["evaluated_tokens"] for r in project]
    assert out["llamacpp_ram_native"]["system_info"]
    assert out["llama_server"]["command"][-2:] == ["-c", "1024"]
    # its defaults as its log states them
    assert out["llama_server"]["threads"] >= 1 and "n_slots" in out["llama_server"]["kv_setup"]
    lines = peer_lines(out)  # what the bench prints: one line per peer, and how it was built
    assert [ln.split(":")[0] for ln in lines if not ln.startswith("  ")] == list(
        PEER_LABELS.values())
    assert any(ln.startswith("  its CPU backend: ") and "AVX2" in ln for ln in lines)
