"""A real llama-server (the one `make` builds from the engine's own llama.cpp) on 127.0.0.1:
deploy, restore, reuse, misses with their causes, mismatches refused, the OpenAI API, the CLI.

Every server is started on a free port with bounded waits and stopped by its fixture."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import Engine, EngineConfig, Template
from app.engine.llama.native import SEQ_STATE_VERSION
from app.engine.prompts.rows import Row
from app.servers import LlamaServer, OpenAIServer
from app.servers.deploy import DeployError, check_layout, deploy, server_layout
from app.servers.llama_server_process import ServerProcess, find_binary, settings_for
from app.servers.server_bench import bench_on_server, expected_reuse

TEMPLATE = ("You are a careful assistant. Answer from the passage only, in one sentence. "
            "The passage follows. <passage>\nQuestion: <question>\nAnswer:")
ROWS = [Row(1, {"passage": "Cats sleep a lot.", "question": "What do cats do?"}),
        Row(2, {"passage": "Dogs bark at night.", "question": "When do dogs bark?"}),
        Row(3, {"passage": "Cats sleep a lot.", "question": "Do cats sleep?"})]

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e}); `make setup` builds it",
                allow_module_level=True)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model):
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1))
    yield eng
    eng.close()


def start(engine, tmp: Path, *extra: str, slot_dir: Path | None = None) -> ServerProcess:
    slot_dir = slot_dir or tmp / "slots"
    return ServerProcess(settings_for(engine, str(slot_dir), extra_args=extra),
                         tmp / "server.log").start(timeout_s=60)


@pytest.fixture(scope="module")
def server(tiny_engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    proc = start(tiny_engine, tmp)
    yield proc
    proc.stop()
    assert not proc.running()


def test_with_on_a_started_server_starts_no_second_one(tiny_engine, tmp_path):
    proc = start(tiny_engine, tmp_path)
    first = proc.proc
    with proc as same:
        assert same.proc is first and proc.running()
    assert first.poll() is not None  # stopped by the with block, and no other one started


def test_a_port_in_use_is_refused_in_one_line(tiny_engine, tmp_path, server):
    from app.servers.llama_server_process import ServeError
    busy = settings_for(tiny_engine, str(tmp_path / "slots"), port=server.port)
    with pytest.raises(ServeError, match=f"port {server.port} .* is in use"):
        ServerProcess(busy).start(30)


def test_the_server_writes_the_engines_seq_state_version(server, tiny_engine):
    with LlamaServer(server.url) as c:
        layout = server_layout(c, 0, Path(server.settings.slot_dir), 1)
    assert layout.seq_state_version == SEQ_STATE_VERSION
    assert layout.streams == 1
    # flash attention on (tests pin it) stores V untransposed, on both sides
    assert layout.v_transposed is False
    assert not list(Path(server.settings.slot_dir).iterdir()), "the probe file is left behind"


def test_deploy_then_rows_reuse_the_prefix_and_answer_as_local_cold(server, tiny_engine):
    tpl = Template.parse(TEMPLATE)
    with LlamaServer(server.url) as c:
        res = deploy(tiny_engine, tpl, c, 0, server.settings.slot_dir)
        prefix = len(tiny_engine.tokenize(tpl.prefix_prompt()))
        assert res.prefix_tokens == prefix == res.restored_tokens
        assert Path(res.path).is_file()
        assert res.verify_cached >= prefix - 1
        bench = bench_on_server(tiny_engine, tpl, ROWS, c, max_tokens=6, slot=0, deployed=True)
    assert bench.same_model is True
    first = bench.rows[0]
    # the first row after deploy reuses the restored prefix (minus the one token always redone)
    assert first.server_cached_tokens >= prefix - 1, first
    assert first.miss_reason == ""
    assert first.server_evaluated_tokens == first.prompt_tokens - first.server_cached_tokens
    for r in bench.rows:
        assert r.tokens_equal is True, (r.row, r.tokens, r.first_diff)
        assert r.miss_reason == "", r.miss_reason
        assert r.cold_cached_tokens == 0  # the cold request bypassed the cache
        assert r.server_cold_equal is True and r.output_note == ""
    # row 3 repeats row 1's passage but row 2 came between: the prefix is what is shared
    assert bench.rows[2].server_cached_tokens >= prefix - 1


def test_a_restarted_server_without_the_slot_file_reports_the_miss(tiny_engine, tmp_path):
    tpl = Template.parse(TEMPLATE)
    with start(tiny_engine, tmp_path) as proc, LlamaServer(proc.url) as c:
        deploy(tiny_engine, tpl, c, 0, proc.settings.slot_dir)
    for f in Path(proc.settings.slot_dir).iterdir():
        f.unlink()
    with start(tiny_engine, tmp_path) as proc, LlamaServer(proc.url) as c:
        bench = bench_on_server(tiny_engine, tpl, ROWS[:2], c, max_tokens=2, slot=0, deployed=True)
    first, second = bench.rows
    assert first.server_cached_tokens < first.prefix_tokens - 1
    assert "restarted" in first.miss_reason and "static prefix" in first.miss_reason
    assert second.miss_reason == ""  # the first row warmed it


@pytest.mark.parametrize("extra, words", [
    (("-np", "2", "--no-kv-unified"), "2 streams"),
    (("-ctk", "q8_0"), "KV rows"),
])
def test_a_mismatched_server_is_refused_in_one_line(tiny_engine, tmp_path, extra, words):
    tpl = Template.parse(TEMPLATE)
    settings = settings_for(tiny_engine, str(tmp_path / "slots"), extra_args=extra)
    # the later flags win in llama.cpp's parser, so these override what settings_for chose
    with ServerProcess(settings, tmp_path / "log").start(60) as proc, LlamaServer(proc.url) as c:
        with pytest.raises(DeployError) as e:
            deploy(tiny_engine, tpl, c, 0, proc.settings.slot_dir)
    msg = str(e.value)
    assert words in msg and "\n" not in msg
    assert not [p for p in Path(proc.settings.slot_dir).iterdir() if p.name.startswith("kvprimer-")]


def test_a_state_of_another_version_is_refused(tiny_engine, server):
    tpl = Template.parse(TEMPLATE)
    state = tiny_engine.prime(tpl)
    with LlamaServer(server.url) as c:
        layout = server_layout(c, 0, Path(server.settings.slot_dir), 1)
    from dataclasses import replace
    with pytest.raises(DeployError, match="version 4"):
        check_layout(state, replace(layout, seq_state_version=4))
    with pytest.raises(DeployError, match="-np 1"):
        check_layout(state, replace(layout, streams=4))


def test_the_openai_api_of_the_same_server(server, tiny_engine):
    tpl = Template.parse(TEMPLATE)
    with OpenAIServer(server.url) as c:
        assert c.flavor == "llama" and c.model
        bench = bench_on_server(tiny_engine, tpl, ROWS[:2], c, max_tokens=4)
    first, second = bench.rows
    assert second.server_cached_tokens >= expected_reuse(second.prefix_tokens, 1)
    assert second.miss_reason == ""
    assert second.server_evaluated_tokens == second.prompt_tokens - second.server_cached_tokens
    assert second.text and second.tokens_equal is True  # text against the local cold run's


def test_cli_deploy_and_bench_server(server, tiny_model, tmp_path, capsys):
    from app.cli import main

    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TEMPLATE)
    rows = tmp_path / "rows.csv"
    rows.write_text("passage,question\n" + "\n".join(
        f'"{r.values["passage"]}","{r.values["question"]}"' for r in ROWS) + "\n")
    common = ["-m", str(tiny_model), "-c", "1024", "-b", "32", "-t", "1"]
    assert main(["deploy", str(tpl), "--server", server.url, "--slot-dir",
                 server.settings.slot_dir, *common]) == 0
    assert "deployed" in capsys.readouterr().out
    out_json = tmp_path / "out.json"
    assert main(["bench", str(tpl), "--rows", str(rows), "--server", server.url, "--slot", "0",
                 "-n", "4", "--json-out", str(out_json), *common]) == 0
    import json
    data = json.loads(out_json.read_text())
    assert [r["row"] for r in data["rows"]] == [2, 3, 4]  # lines of the file, after its header
    for r in data["rows"]:
        for key in ("server_cached_tokens", "server_evaluated_tokens", "cold_ms", "warm_ms",
                    "tokens_equal", "miss_reason"):
            assert key in r
        assert r["tokens_equal"] is True
    # the local runs' generation threads: the server's, as `kvprimer serve` starts it (-t 1)
    assert data["gen_threads"] == 1
    assert main(["bench", str(tpl), "--rows", str(rows), "--server", "http://127.0.0.1:9",
                 *common]) == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and err.count("\n") == 1


def test_the_local_runs_generate_on_the_servers_thread_count_whatever_the_load(
        tiny_model, tmp_path, monkeypatch, capsys):
    """The engine's automatic thread count follows the machine's load; with flash attention a
    one-token decode's rounding depends on the count. So the server starts on an explicit
    count and the bench's local runs are pinned to it (not to what the load gives)."""
    from app.engine.llama.thread_count import llama_default_threads
    from app.engine.llama.thread_fit import ThreadFit, shared_fit
    from app.servers.llama_server_process import server_threads

    fit = shared_fit()
    busy = 1 if llama_default_threads() > 1 else 2  # another count than the server's
    monkeypatch.setattr(fit, "threads", lambda: busy)
    seen: list[int] = []
    real = ThreadFit.generation_threads
    monkeypatch.setattr(ThreadFit, "generation_threads",
                        lambda self: seen.append(real(self)) or seen[-1])
    tpl = Template.parse(TEMPLATE)
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32)) as eng:
        want = server_threads(eng.config)[1]
        assert want == llama_default_threads()  # automatic: llama-server's own default
        with start(eng, tmp_path) as proc:
            cmd = proc.cmd
            assert cmd[cmd.index("-t") + 1] == str(want) == str(proc.settings.n_threads_gen)
            seen.clear()
            with LlamaServer(proc.url) as c:
                bench = bench_on_server(eng, tpl, ROWS[:2], c, max_tokens=4)
            assert seen and set(seen) == {want}, seen
            assert bench.gen_threads == want
            assert f"local runs on the server's {want} generation thread" in bench.describe()
            assert all(r.tokens_equal is True for r in bench.rows)
            # a server started otherwise: its count is given, and the local runs take it
            seen.clear()
            with LlamaServer(proc.url) as c:
                other = bench_on_server(eng, tpl, ROWS[:1], c, max_tokens=2, gen_threads=busy)
            assert set(seen) == {busy} and other.gen_threads == busy
    assert fit.generation_threads() == busy  # outside the bench, the load decides again


def test_cli_serve_starts_a_matching_server_and_stops_on_ctrl_c(tiny_model, tmp_path):
    cmd = [sys.executable, "-m", "app.cli", "serve", "-m", str(tiny_model), "-c", "512",
           "--port", "0", "--slot-dir", str(tmp_path / "slots")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()  # blocks until the server is ready or the command fails
        assert "ready at http://127.0.0.1:" in line, proc.stderr.read()
        url = line.split("ready at ")[1].split()[0]
        with LlamaServer(url) as c:
            props = c.props()
            assert props.total_slots == 1 and props.n_ctx == 512
            assert Path(props.model_path).resolve() == tiny_model.resolve()
            c.slot(0, "save", "x.bin")  # --slot-save-path was given
        assert (tmp_path / "slots" / "x.bin").is_file()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.model
def test_default_model_deploy_restore_and_reuse(default_model, examples, tmp_path):
    """The issue's check on the real model: deploy the RAG prefix, the next row reuses at least
    the static prefix minus one token and answers with KV Primer's local cold tokens."""
    from app.engine.prompts.rows import read_rows

    tpl = Template.load(examples / "rag.tmpl")
    rows = read_rows(examples / "rag-rows.csv", tpl.placeholders)[:2]
    with Engine(EngineConfig(model_path=str(default_model))) as eng, \
            start(eng, tmp_path) as proc, LlamaServer(proc.url) as c:
        res = deploy(eng, tpl, c, 0, proc.settings.slot_dir)
        bench = bench_on_server(eng, tpl, rows, c, max_tokens=8, slot=0, deployed=True)
    assert res.restored_tokens == res.prefix_tokens > 1000
    for r in bench.rows:
        assert r.server_cached_tokens >= r.prefix_tokens - 1
        assert r.tokens_equal is True, (r.row, r.first_diff)


def test_deploying_a_hybrid_models_prefix_says_the_server_cannot_resume_it(tmp_path):
    """The pinned llama-server restores a hybrid slot (all its tokens) but then re-evaluates
    the whole prompt: it would have to step back one token, which a recurrent state cannot.
    Deploy checks with one request and says so in one line."""
    from tests.tiny_model import write_arch_model

    model = write_arch_model(tmp_path / "lfm2.gguf", "lfm2")
    with Engine(EngineConfig(model_path=str(model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn="off")) as eng:
        with start(eng, tmp_path) as proc, LlamaServer(proc.url) as c:
            with pytest.raises(DeployError) as e:
                deploy(eng, Template.parse(TEMPLATE), c, 0, proc.settings.slot_dir)
    msg = str(e.value)
    assert "cannot resume a restored slot of a hybrid or recurrent model" in msg
    assert "\n" not in msg and "code" not in msg
