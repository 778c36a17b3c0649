"""The reuse section's peers on the tiny model: the peer process's protocol (the venv's own
llama_cpp stands in for the natively built one, so no native build is needed), the native
build's venv found again without a rebuild, and llama-server with its defaults, started and
stopped with bounded waits. Timings are not checked here: the bench is for that."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench import native_peer, reuse_peers
from bench.llamacpp_paths import LlamaPaths, recurring_rows
from bench.native_peer import PeerError, clean_env, install_command, native_python, run_peer
from bench.reuse_peers import PeerRun, peer_request, run_peers

# token ids of the tiny model's byte tokens (ids 5..260): a static prefix and three rows, the
# third repeating the first's value and adding more (so it reuses the first row's prompt)
PREFIX = [1] + list(range(40, 80))
A, B, C = list(range(100, 110)), list(range(120, 128)), list(range(140, 145))
ROWS = [PREFIX + A, PREFIX + B, PREFIX + A + C]


@pytest.fixture
def run(tiny_model):
    return PeerRun(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                   flash_attn=True, max_tokens=4, prime=PREFIX, numbers=[2, 3, 4],
                   tokens=ROWS, timeout_s=120)


def test_the_peer_process_answers_the_rows_as_the_in_process_loop_runs_them(run, tmp_path):
    answer = run_peer(sys.executable, peer_request(run, use_extra_bufts=True), 120)
    got = answer["rows"]
    assert answer["ok"] and len(got) == 3
    # primed with the prefix: the first row evaluates its value only; the second keeps the
    # prefix the context holds; the third loads the first row's state and evaluates C only
    assert [r["evaluated_tokens"] for r in got] == [len(A), len(B), len(C)]
    assert [r["reused_tokens"] for r in got] == [len(PREFIX), len(PREFIX), len(PREFIX + A)]
    assert all(r["ttft_ms"] >= r["load_ms"] >= 0 and len(r["tokens"]) == 4 for r in got)
    assert answer["system_info"] and answer["library"].endswith(".so")
    # the same loop in this process (the project's build path) gives the same runs, bit for bit
    llama = LlamaPaths(run.model_path, n_ctx=1024, n_batch=32, n_threads=1,
                       cache_dir=tmp_path / "dc", use_extra_bufts=True, flash_attn=True)
    try:
        here = recurring_rows(llama, ROWS, 4, PREFIX)
    finally:
        llama.close()
    for theirs, ours in zip(got, here):
        assert (theirs["evaluated_tokens"], theirs["tokens"]) == (ours["evaluated_tokens"],
                                                                  ours["tokens"])


def test_the_peer_process_failing_is_one_line(run, tmp_path):
    request = {**peer_request(run, True), "model_path": str(tmp_path / "missing.gguf")}
    with pytest.raises(PeerError, match=r"^the peer process failed: \w+Error: .*missing\.gguf"):
        run_peer(sys.executable, request, 120)
    crashes = tmp_path / "python"  # a peer that dies before it answers
    crashes.write_text("#!/bin/sh\necho 'Illegal instruction' >&2\nexit 132\n")
    crashes.chmod(0o755)
    with pytest.raises(PeerError, match=r"ended \(exit 132\) without an answer: Illegal inst"):
        run_peer(crashes, peer_request(run, True), 120)


def test_the_native_build_is_pip_s_own_and_is_found_again_without_a_rebuild(tmp_path,
                                                                          monkeypatch):
    cmd = install_command(tmp_path / "python", "0.3.36")
    # nothing prebuilt (no wheel from an index, a find-links folder or pip's cache), no flags
    assert cmd[-3:] == ["--no-binary", "llama-cpp-python", "llama-cpp-python==0.3.36"]
    assert "--no-cache-dir" in cmd
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/somewhere")
    monkeypatch.setenv("PYTHONPATH", "/work")
    assert not {"CMAKE_ARGS", "LLAMA_CPP_LIB_PATH", "PYTHONPATH"} & set(clean_env())
    built = tmp_path / native_peer.venv_key("0.3.36")
    built.mkdir()
    (built / native_peer.DONE).write_text("{}")

    def no_build(*a, **k):
        raise AssertionError("a built venv was built again")

    monkeypatch.setattr(subprocess, "run", no_build)
    said = []
    assert native_python("0.3.36", said.append, home=tmp_path) == built / "bin" / "python"
    assert not said
    # another version, or an unfinished build, is built (and says it takes minutes)
    monkeypatch.setattr(native_peer, "_build", lambda root, version: said.append(version))
    native_python("0.3.37", said.append, home=tmp_path)
    assert "about 11 minutes" in said[0] and said[1] == "0.3.37"


def test_a_peer_that_cannot_run_is_reported_and_the_others_still_run(run, monkeypatch):
    def fails(version, log):
        raise PeerError("native peer: pip install llama-cpp-python failed (exit 1); see x.log")

    monkeypatch.setattr(reuse_peers, "native_python", fails)
    said = []
    out = run_peers(run, project=True, native=True, server=False, version="0.3.36",
                    log=said.append)
    assert out["llamacpp_ram_native"]["error"].startswith("PeerError: native peer: pip")
    assert "llamacpp_ram_native_recurring" not in out
    assert [r["row"] for r in out["llamacpp_ram_recurring"]] == [2, 3, 4]
    assert any("failed" in s for s in said)
    from bench.report import peer_lines
    assert any(ln.endswith("(PeerError: native peer: pip install llama-cpp-python failed (exit "
                           "1); see x.log)") for ln in peer_lines(out))


def test_the_only_reuse_flag_writes_its_own_file():
    from bench.__main__ import parse_args

    args = parse_args(["--only-reuse", "--reuse-rows", "12", "--no-native-peer"])
    assert args.only_reuse and args.reuse_rows == 12 and args.no_native_peer
    assert args.out.name == "results-reuse.json"
    assert parse_args([]).out.name == "results.json"


def test_peers_added_to_a_stored_reuse_section_pair_with_its_rows(tiny_model, tmp_path):
    from bench.reuse_bench import ReuseConfig, add_peers, run_reuse
    from tests.bench.test_bench_paths import REUSE_ROWS, REUSE_TEMPLATE

    (tmp_path / "r.tmpl").write_text(REUSE_TEMPLATE)
    (tmp_path / "r.csv").write_text(REUSE_ROWS)
    cfg = ReuseConfig(rows=3, fork_repeats=1, n_threads=1, n_batch=32, n_ctx=2048, max_tokens=4,
                      check_tokens=4, model_path=str(tiny_model),
                      template_path=str(tmp_path / "r.tmpl"), rows_path=str(tmp_path / "r.csv"),
                      llamacpp=False, native_peer=False, server_peer=False)
    rz = run_reuse(cfg, log=lambda msg: None)
    assert "llamacpp_ram_recurring" not in rz and "chain_vs_llamacpp_ram_project_recurring" \
        not in rz["ratios"]
    # later, with only the project's build asked for: the stored rows, settings and files
    add_peers(rz, ReuseConfig(llamacpp=True, native_peer=False, server_peer=False),
              log=lambda msg: None)
    assert [r["row"] for r in rz["llamacpp_ram_recurring"]] == [2, 3, 4]
    assert rz["ratios"]["chain_vs_llamacpp_ram_project_recurring"] > 0
    assert rz["peers_added"][0]["peers"] == ["llamacpp_ram"]
    assert rz["settings"]["llamacpp"] is False  # the section's own settings stay as they ran
