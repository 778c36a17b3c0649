"""The server clients against recorded responses, for the servers that cannot run here (vLLM,
SGLang) and for llama-server's error answers; the miss explanations. The frames follow what
those servers stream for /v1/completions with stream_options.include_usage (vLLM 0.11,
SGLang 0.5; llama-server b11312's own source for its errors)."""
from __future__ import annotations

import json

import httpx
import pytest

from app.servers import LlamaServer, OpenAIServer, ServerError
from app.servers.http_stream import normalise_url
from app.servers.server_bench import expected_reuse, miss_reason


def sse(*frames) -> bytes:
    out = [f"data: {json.dumps(f) if not isinstance(f, str) else f}\n\n" for f in frames]
    return "".join(out).encode()


def chunk(text, finish=None):
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": None}


def usage(prompt, cached=None):
    u = {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [], "usage": u}


class Recorder:
    """A MockTransport handler: answers by path, records each request."""

    def __init__(self, routes):
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.routes.get(request.url.path)
        if answer is None:
            return httpx.Response(404, json={"error": "not found"})
        return answer(request) if callable(answer) else answer

    def bodies(self, path):
        return [json.loads(r.content) for r in self.requests if r.url.path == path]


MODELS = httpx.Response(200, json={"object": "list", "data": [{"id": "HuggingFaceTB/SmolLM2"}]})


def stream(*frames):
    return lambda req: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                      content=sse(*frames))


def test_vllm_reports_cached_blocks_and_runs_cold_with_a_salt():
    rec = Recorder({"/v1/models": MODELS, "/version": httpx.Response(200, json={"version": "0.11"}),
                    "/v1/completions": stream(chunk(" Paris"), chunk(".", "length"),
                                              usage(1836, 1760), "[DONE]")})
    with OpenAIServer("127.0.0.1:8000", transport=httpx.MockTransport(rec)) as c:
        assert c.flavor == "vllm" and c.model == "HuggingFaceTB/SmolLM2" and c.block_size == 16
        warm = c.complete("prompt", 2)
        cold = c.complete("prompt", 2, cache_prompt=False)
    assert warm.text == " Paris." and warm.cached_tokens == 1760 and warm.evaluated_tokens == 76
    warm_body, cold_body = rec.bodies("/v1/completions")
    assert "cache_salt" not in warm_body and len(cold_body["cache_salt"]) == 16
    assert warm_body["stream_options"] == {"include_usage": True}
    # a 1,761-token prefix counts as reused at 1,760 (110 whole blocks)
    assert expected_reuse(1761, c.block_size) == 1760
    assert miss_reason(1760, 1761, 16, list(range(1836)), list(range(1800)), "") == ""


def test_vllm_without_token_details_says_how_to_start_it():
    rec = Recorder({"/v1/models": MODELS,
                    "/v1/completions": stream(chunk("x", "length"), usage(100), "[DONE]")})
    with OpenAIServer("http://h:1", flavor="vllm", transport=httpx.MockTransport(rec)) as c:
        got = c.complete("p", 1)
        assert got.cached_tokens is None
        why = miss_reason(got.cached_tokens, 50, c.block_size, [1] * 100, None, c.missing_report_hint())
    assert "--enable-prompt-tokens-details" in why


def test_sglang_flushes_before_a_cold_run_and_omits_zero_cached():
    flushes = iter([httpx.Response(400, json={"error": "busy"}), httpx.Response(200, text="ok")])
    rec = Recorder({"/v1/models": MODELS, "/get_server_info": httpx.Response(200, json={}),
                    "/flush_cache": lambda req: next(flushes),
                    "/v1/completions": stream(chunk("a", "length"), usage(120), "[DONE]")})
    with OpenAIServer("http://h:30000", transport=httpx.MockTransport(rec)) as c:
        assert c.flavor == "sglang"
        cold = c.complete("p", 1, cache_prompt=False)
    assert cold.cached_tokens == 0 and cold.evaluated_tokens == 120
    paths = [r.url.path for r in rec.requests]
    # two flush attempts (the first refused while busy), then the request
    assert paths[-3:] == ["/flush_cache", "/flush_cache", "/v1/completions"]


def test_llama_server_errors_are_one_line():
    rec = Recorder({
        "/slots/0": httpx.Response(501, json={"error": {
            "code": 501, "type": "not_supported_error",
            "message": "This server does not support slots action. Start it with `--slot-save-path`"}}),
        "/completion": stream({"error": {"code": 400, "message": "the request exceeds the "
                                         "available context size, try increasing it"}}),
        "/props": httpx.Response(500, text="boom"),
    })
    with LlamaServer("http://h:1", transport=httpx.MockTransport(rec)) as c:
        with pytest.raises(ServerError, match="--slot-save-path DIR"):
            c.slot(0, "restore", "x.bin")
        with pytest.raises(ServerError, match="exceeds the available context"):
            c.complete([1, 2, 3], 1)
        with pytest.raises(ServerError, match="answered 500: boom"):
            c.props()


def test_llama_server_stream_timings_and_first_token():
    frames = [{"content": "", "tokens": [], "stop": False, "id_slot": 0,
               "prompt_progress": {"total": 80, "cache": 60, "processed": 80}},
              {"content": " Hi", "tokens": [42], "stop": False, "id_slot": 0},
              {"content": "!", "tokens": [7], "stop": False, "id_slot": 0},
              {"content": "", "tokens": [], "stop": True, "id_slot": 0,
               "timings": {"cache_n": 60, "prompt_n": 20, "prompt_ms": 12.5}}]
    rec = Recorder({"/completion": stream(*frames)})
    with LlamaServer("http://h:1", transport=httpx.MockTransport(rec)) as c:
        got = c.complete([1] * 80, 2, slot=0, cache_prompt=False)
    assert got.text == " Hi!" and got.tokens == [42, 7]
    assert (got.cached_tokens, got.evaluated_tokens, got.prompt_ms, got.slot) == (60, 20, 12.5, 0)
    body = rec.bodies("/completion")[0]
    assert body["id_slot"] == 0 and body["cache_prompt"] is False and body["prompt"] == [1] * 80


def test_unreachable_server_is_one_line():
    with LlamaServer("http://127.0.0.1:9") as c:
        with pytest.raises(ServerError, match="cannot reach http://127.0.0.1:9") as e:
            c.props()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("url, want", [("localhost:8080", "http://localhost:8080"),
                                       ("http://127.0.0.1:8080/", "http://127.0.0.1:8080")])
def test_urls(url, want):
    assert normalise_url(url) == want


@pytest.mark.parametrize("url", ["", "ftp://host/x", "http://"])
def test_bad_urls(url):
    with pytest.raises(ServerError, match="http://127.0.0.1:8080"):
        normalise_url(url)


def test_miss_reasons_name_where_and_why():
    prompt = list(range(100))
    assert miss_reason(59, 60, 1, prompt, prompt[:70], "") == ""
    first = miss_reason(0, 60, 1, prompt, None, "")
    assert "token 0 of the 60-token static prefix" in first and "first request" in first
    boundary = miss_reason(40, 60, 1, prompt, prompt[:45] + [999] * 30, "")
    assert "at token 45, inside the static prefix" in boundary
    evicted = miss_reason(0, 60, 1, prompt, prompt[:80], "")
    assert "80 matching tokens" in evicted and "restarted" in evicted


def test_without_the_server_extra_the_message_says_how_to_install_it(monkeypatch):
    import sys

    from app.engine import KvPrimerError
    from app.optional_extras import require_server_clients

    for name in [m for m in sys.modules if m == "app.servers" or m.startswith("app.servers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "httpx", None)  # as if not installed
    with pytest.raises(KvPrimerError, match=r"need httpx: pip install 'kvprimer\[server\]'"):
        require_server_clients()
