"""The chat API's transport against recorded answers: the request is the OpenAI wire format
an application sends, what the server reused is read from usage or llama-server's timings,
and a rendering that differs from ours is named by character and token."""
from __future__ import annotations

import httpx
import pytest

from app.servers import ChatServer, ServerError, connect
from app.servers.render_check import check_rendering, compare, first_difference
from app.engine.prompts.rows import Row
from tests.servers.test_server_clients import MODELS, Recorder, stream

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
# what OpenAI's own Python client sends for client.chat.completions.create(model=..., messages=
# ..., max_tokens=4, temperature=0, seed=0, stream=True, stream_options={"include_usage": True})
OPENAI_KEYS = {"model", "messages", "max_tokens", "temperature", "seed", "stream",
               "stream_options"}


def delta(text, finish=None):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def final(prompt, cached=None, timings=None):
    u = {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    f = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [], "usage": u}
    if timings:
        f["timings"] = timings
    return f


def llama_routes(*frames):
    return {"/props": httpx.Response(200, json={"total_slots": 1}), "/v1/models": MODELS,
            "/v1/chat/completions": stream(delta(""), *frames, "[DONE]")}


def test_a_warm_request_is_what_an_openai_client_sends_and_cold_adds_one_field():
    rec = Recorder(llama_routes(delta("Hel"), delta("lo"), final(18, cached=17)))
    with ChatServer("http://x", transport=httpx.MockTransport(rec), api_key="k") as c:
        assert c.flavor == "llama" and c.api == "chat"
        warm = c.complete(MESSAGES, 4)
        c.complete(MESSAGES, 4, cache_prompt=False)
    assert warm.text == "Hello" and warm.cached_tokens == 17 and warm.evaluated_tokens == 1
    assert warm.ttft_ms <= warm.total_ms
    sent_warm, sent_cold = rec.bodies("/v1/chat/completions")
    assert set(sent_warm) == OPENAI_KEYS
    assert sent_warm["messages"] == MESSAGES and sent_warm["temperature"] == 0
    assert sent_warm["stream_options"] == {"include_usage": True}
    assert set(sent_cold) - set(sent_warm) == {"cache_prompt"} and not sent_cold["cache_prompt"]
    assert rec.requests[-1].headers["authorization"] == "Bearer k"


def test_tools_go_as_they_are():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    rec = Recorder(llama_routes(delta("x"), final(5, cached=0)))
    with ChatServer("http://x", transport=httpx.MockTransport(rec)) as c:
        c.complete(MESSAGES, 1, tools=[tool])
    assert rec.bodies("/v1/chat/completions")[0]["tools"] == [tool]


def test_reuse_is_read_from_llama_servers_timings_when_usage_lacks_it():
    rec = Recorder(llama_routes(delta("x"), final(30, timings={"cache_n": 21, "prompt_n": 9,
                                                               "prompt_ms": 12.5})))
    with ChatServer("http://x", transport=httpx.MockTransport(rec)) as c:
        got = c.complete(MESSAGES, 1)
    assert (got.cached_tokens, got.evaluated_tokens, got.prompt_ms) == (21, 9, 12.5)


def test_vllm_has_no_apply_template_and_runs_cold_with_a_salt():
    rec = Recorder({"/v1/models": MODELS,
                    "/v1/chat/completions": stream(delta("x"), final(40, cached=32), "[DONE]")})
    with ChatServer("http://x", flavor="vllm", transport=httpx.MockTransport(rec)) as c:
        assert c.apply_template(MESSAGES) is None
        c.complete(MESSAGES, 1, cache_prompt=False)
    body, = rec.bodies("/v1/chat/completions")
    assert set(body) - OPENAI_KEYS == {"cache_salt"}


def test_a_text_prompt_on_the_chat_api_is_refused_in_one_line():
    rec = Recorder(llama_routes(final(1)))
    with ChatServer("http://x", transport=httpx.MockTransport(rec)) as c:
        with pytest.raises(ServerError, match="chat template") as e:
            c.complete("plain text", 1)
    assert "\n" not in str(e.value)


def test_connect_names_the_chat_api_among_the_kinds():
    with pytest.raises(ServerError, match="llama, openai, chat"):
        connect("http://x", "grpc")


def test_first_difference():
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2  # one starts the other


def _tokens(text):
    return [ord(c) for c in text.replace("<|x|>", "\x01")]


def test_a_differing_rendering_names_its_first_character_and_token():
    ours = "<|x|>system\nBe brief.\n<|x|>user\nHi"
    theirs = "<|x|>system\nBe terse.\n<|x|>user\nHi"
    diff = compare(3, ours, theirs, _tokens, chr)
    assert (diff.row, diff.char, diff.token) == (3, ours.index("brief"), 11)
    assert (diff.our_token, diff.their_token) == ("b", "t")
    line = diff.describe()
    assert "row 3" in line and "'brief." in line and "'terse." in line and "\n" not in line
    assert compare(1, ours, ours, _tokens, chr) is None


def test_every_row_is_compared_until_one_differs():
    rows = [Row(2, {"q": "a"}), Row(3, {"q": "b"}), Row(4, {"q": "c"})]
    asked = []

    def theirs(values):
        asked.append(values["q"])
        return "Q: " + values["q"] + ("!" if values["q"] == "b" else "")

    got = check_rendering(lambda v: "Q: " + v["q"], theirs, rows, _tokens, chr)
    assert got.same is False and got.row == 3 and got.rows == 2 and asked == ["a", "b"]
    same = check_rendering(lambda v: "Q: " + v["q"], lambda v: "Q: " + v["q"], rows, _tokens, chr)
    assert same.same is True and same.rows == 3 and "3 rows compared" in same.describe()
    none = check_rendering(lambda v: "", lambda v: None, rows, _tokens, chr)
    assert none.same is None and "not compared" in none.describe()


def test_text_a_server_held_back_at_an_invalid_utf8_end_is_still_the_same_output():
    from app.servers.server_bench import same_text

    assert same_text("r\ufffdX@", "r\ufffdX@")
    assert same_text("r\ufffdX@\ufffd?", "r\ufffdX@")  # the bytes from the invalid one on
    assert not same_text("abc", "ab")  # a shorter answer is another answer
    assert not same_text("abd", "abc")
