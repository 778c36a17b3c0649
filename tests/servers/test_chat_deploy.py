"""A chat template end to end through the real llama-server on 127.0.0.1: its prefix deployed,
then ten rows sent as an application sends them, OpenAI chat requests to /v1/chat/completions
that the server renders with the model's own chat template (here Llama 3's, not ChatML). Each
row's cached tokens cover the primed prefix, and where the server's cache is exact its greedy
output is the engine's warm run's. A server that renders otherwise is named before anything
is deployed. Every server is started on a free port with bounded waits and stopped."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine import Engine, EngineConfig
from app.servers.server_bench import bench_on_server
from app.engine.prompts.chat_format import CHATML_SOURCE, read_chat_format
from app.engine.prompts.chat_messages import ChatMessage, ChatTemplate
from app.engine.prompts.chat_render import render_chat
from app.engine.prompts.rows import Row
from app.servers import ChatServer, LlamaServer
from app.servers.deploy import DeployError, deploy
from app.servers.llama_server_process import ServerProcess, find_binary, settings_for
from tests.chat_templates import LLAMA3
from tests.tiny_model import write_tiny_model

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e}); `make setup` builds it",
                allow_module_level=True)

CHAT = ChatTemplate((
    ChatMessage("system", "You are a careful assistant. Answer in one short sentence."),
    ChatMessage("user", "What colour is the sky?"),
    ChatMessage("assistant", "The sky is blue on a clear day."),
    ChatMessage("user", "<question>")))
QUESTIONS = ["Why is grass green?", "How far is the moon?", "What is rain?", "Who bakes bread?",
             "Is ice heavy?", "When do owls sleep?", "Where do rivers go?", "Can fish hear?",
             "How hot is tea?", "What do bees make?"]
ROWS = [Row(i + 2, {"question": q}) for i, q in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def llama3_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("chat-models") / "tiny-llama3.gguf",
                            chat_template=LLAMA3)


@pytest.fixture(scope="module")
def engine(llama3_model):
    eng = Engine(EngineConfig(model_path=str(llama3_model), n_ctx=1024, n_batch=32,
                              n_threads=1))
    yield eng
    eng.close()


@pytest.fixture
def server(engine, tmp_path):
    # the settings `kvprimer serve` starts it with: the engine's batches and threads, so that
    # the server's greedy output can be compared with the engine's
    with ServerProcess(settings_for(engine, str(tmp_path / "slots")),
                       tmp_path / "server.log").start(timeout_s=60) as proc:
        yield proc


def test_deploy_then_ten_chat_rows_reuse_the_prefix_and_answer_as_the_warm_run(
        engine, llama3_model, server):
    template = render_chat(read_chat_format(llama3_model), CHAT).template
    assert "<|start_header_id|>" in template.static_prefix
    with LlamaServer(server.url) as c:
        res = deploy(engine, template, c, 0, server.settings.slot_dir, chat=CHAT)
    prefix = res.prefix_tokens
    assert res.restored_tokens == prefix and res.verify_cached >= prefix
    with ChatServer(server.url) as c:
        bench = bench_on_server(engine, template, ROWS, c, max_tokens=6, deployed=True,
                                chat=CHAT)
    assert bench.api == "chat" and bench.reference == "warm"
    assert bench.render["same"] is True and bench.render["rows"] == 10
    assert [r.row for r in bench.rows] == [r.number for r in ROWS]
    exact = [r for r in bench.rows if r.server_cold_equal]
    assert exact, "no row where the server's warm output equals its own cold one"
    for r in bench.rows:
        # the prefix is what the server holds; the row's own tokens come after it
        assert r.prefix_tokens == prefix and r.server_cached_tokens >= prefix, r
        assert r.miss_reason == "" and r.cold_cached_tokens == 0
        assert r.server_evaluated_tokens == r.prompt_tokens - r.server_cached_tokens
        assert r.text and r.tokens_equal is not None
    for r in exact:
        assert r.tokens_equal is True, (r.row, r.text, r.first_diff)


def test_a_rendering_the_server_does_not_share_is_named_before_anything_is_deployed(
        engine, llama3_model, server):
    from dataclasses import replace

    chatml = replace(read_chat_format(llama3_model), source=CHATML_SOURCE)  # not the model's
    template = render_chat(chatml, CHAT).template
    with LlamaServer(server.url) as c:
        with pytest.raises(DeployError) as e:
            deploy(engine, template, c, 0, server.settings.slot_dir, chat=CHAT)
    msg = str(e.value)
    # both start with "<|"; the tokens after BOS differ at once
    assert "\n" not in msg and "from character 2 ours reads 'im_start|>" in msg, msg
    assert "the server's 'start_header" in msg and "token 1 is '<|im_start|>' here" in msg
    assert not list(Path(server.settings.slot_dir).glob("kvprimer-*"))
    with ChatServer(server.url) as c:
        bench = bench_on_server(engine, template, ROWS[:2], c, max_tokens=2, chat=CHAT)
    assert bench.render["same"] is False and bench.render["row"] == ROWS[0].number
    assert "renders row 2 otherwise" in bench.render["describe"]


def test_cli_deploy_and_bench_over_the_chat_api(llama3_model, server, tmp_path, capsys):
    from app.cli import main

    chat = tmp_path / "chat.json"
    CHAT.save(chat)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[:3]))
    common = ["-m", str(llama3_model), "-c", "1024", "-b", "32", "-t", "1"]
    assert main(["deploy", str(chat), "--server", server.url, "--slot-dir",
                 server.settings.slot_dir, *common]) == 0
    assert "deployed" in capsys.readouterr().out
    out = tmp_path / "out.json"
    code = main(["bench", str(chat), "--rows", str(rows), "--server", server.url, "--api", "chat",
                 "-n", "4", "--json-out", str(out), *common])
    printed = capsys.readouterr().out
    assert "rendering: the server renders the messages as we do" in printed
    assert "same output as local warm" in printed
    data = json.loads(out.read_text())
    assert data["api"] == "chat" and data["render"]["same"] is True
    assert code == (0 if all(r["tokens_equal"] for r in data["rows"]) else 1)
    for r in data["rows"]:
        assert r["server_cached_tokens"] >= r["prefix_tokens"] and r["miss_reason"] == ""
    # a text template cannot go as messages: refused before the model loads
    tmpl = tmp_path / "t.tmpl"
    tmpl.write_text("Q: <question>\nA:")
    assert main(["bench", str(tmpl), "--rows", str(rows), "--server", server.url,
                 "--api", "chat", *common]) == 2
    err = capsys.readouterr().err
    assert "chat template" in err and err.count("\n") == 1


@pytest.mark.model
def test_default_model_rag_chat_deployed_and_ten_rows_over_the_chat_api(default_model, examples,
                                                                         tmp_path):
    """The issue's check on the real model: the RAG chat template's prefix deployed, its ten
    rows as chat requests, each reusing at least the primed prefix."""
    from app.engine.prompts.rows import read_rows

    chat = ChatTemplate.load(examples / "rag.yaml")
    template = render_chat(read_chat_format(default_model), chat).template
    rows = read_rows(examples / "rag-rows.csv", template.placeholders)
    assert len(rows) == 10
    # threads pinned on both sides: a one-token decode over 512 cells or more splits the cache
    # by thread count, and the engine's automatic count follows the machine's load
    with Engine(EngineConfig(model_path=str(default_model), n_threads=2,
                             n_threads_gen=2)) as eng, \
            ServerProcess(settings_for(eng, str(tmp_path / "slots")),
                          tmp_path / "server.log").start(timeout_s=120) as proc:
        with LlamaServer(proc.url) as c:
            res = deploy(eng, template, c, 0, proc.settings.slot_dir, chat=chat)
        with ChatServer(proc.url) as c:
            bench = bench_on_server(eng, template, rows, c, max_tokens=8, deployed=True,
                                    chat=chat)
    assert res.restored_tokens == res.prefix_tokens > 1000
    assert bench.render["same"] is True
    for r in bench.rows:
        assert r.server_cached_tokens >= r.prefix_tokens == res.prefix_tokens, r
        if r.server_cold_equal:
            assert r.tokens_equal is True, (r.row, r.text, r.first_diff)
