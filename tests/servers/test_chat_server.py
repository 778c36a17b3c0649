"""Our rendering of chat templates equals llama-server's own (``POST /apply-template``), byte
for byte, on the real server on 127.0.0.1: the default model, models without a chat template
(ChatML fallback; a tiny attention model and a tiny hybrid), and tiny models carrying the Llama
3, Gemma 3 and Qwen3 (with tools) chat templates. Every server is started on a free port with
bounded waits and stopped by its fixture."""
from __future__ import annotations

import httpx
import pytest

from app.engine.prompts.chat_format import read_chat_format
from app.engine.prompts.chat_messages import ChatMessage, ChatTemplate
from app.engine.prompts.chat_render import render_chat, render_messages
from app.engine.prompts.rows import read_rows
from app.servers.llama_server_process import ServerProcess, ServerSettings, find_binary
from tests.chat_templates import FAMILIES, WEATHER_TOOL
from tests.tiny_model import write_arch_model, write_tiny_model

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e}); `make setup` builds it",
                allow_module_level=True)

TOOLS_CHAT = ChatTemplate((ChatMessage("system", "You check the weather for travellers."),
                           ChatMessage("user", "I fly to <city> tomorrow. Pack an umbrella?")),
                          (WEATHER_TOOL,))


def models(tmp_path_factory, default_model) -> dict:
    d = tmp_path_factory.mktemp("chat-server-models")
    out = {"default": default_model,
           "no template": write_tiny_model(d / "none.gguf"),
           "hybrid, no template": write_arch_model(d / "lfm2.gguf", "lfm2")}
    for family, source in FAMILIES.items():
        out[family] = write_tiny_model(d / f"{family}.gguf", chat_template=source)
    return out


@pytest.fixture(scope="module")
def all_models(tmp_path_factory, default_model):
    return models(tmp_path_factory, default_model)


def cases(examples):
    """(name, chat template, rows of values) for the example chat templates and a chat with
    tools."""
    chat = ChatTemplate.load(examples / "chat.json")
    rag = ChatTemplate.load(examples / "rag.yaml")
    return [("chat.json", chat, read_rows(examples / "chat-rows.jsonl", chat.placeholders)[:2]),
            ("rag.yaml", rag, read_rows(examples / "rag-rows.csv", rag.placeholders)[:2]),
            ("tools", TOOLS_CHAT, None)]


def server_prompt(url: str, messages: list[dict], tools=()) -> str:
    body = {"messages": messages, **({"tools": list(tools)} if tools else {})}
    r = httpx.post(f"{url}/apply-template", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def first_difference(ours: str, theirs: str) -> str:
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)))
    return f"first difference at character {k}: ours {ours[k:k + 40]!r}, server {theirs[k:k + 40]!r}"


@pytest.mark.parametrize("model", ["default", "no template", "hybrid, no template", "llama3",
                                   "gemma3", "qwen3"])
def test_our_rendering_equals_the_servers_byte_for_byte(all_models, examples, tmp_path, model):
    path = all_models[model]
    fmt = read_chat_format(path)
    assert fmt.fallback == (model.endswith("no template"))
    settings = ServerSettings(model_path=str(path), flash_attn=True, n_ctx=512)
    compared = 0
    with ServerProcess(settings, tmp_path / "server.log").start(timeout_s=90) as proc:
        for name, chat, rows in cases(examples):
            template = render_chat(fmt, chat).template
            value_sets = [r.values for r in rows] if rows else [{"city": "Lisbon"}]
            for values in value_sets:
                messages = chat.filled(values)
                theirs = server_prompt(proc.url, messages, chat.tools)
                ours = render_messages(fmt, messages, chat.tools)
                assert ours == theirs, f"{model}, {name}: {first_difference(ours, theirs)}"
                # the template primed and filled here is the same text
                assert template.fill(values).text == theirs
                assert theirs.startswith(template.static_prefix)
                compared += 1
            # and with the placeholders left in, as the window shows the template
            shown = [{"role": m.role, "content": m.content} for m in chat.messages]
            assert render_messages(fmt, shown, chat.tools) == server_prompt(proc.url, shown,
                                                                            chat.tools)
    assert compared == 5
