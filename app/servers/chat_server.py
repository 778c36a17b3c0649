"""A client for any OpenAI-compatible ``/v1/chat/completions`` (llama-server, vLLM, SGLang),
sending chat messages in the wire format an application's OpenAI client sends: ``model``,
``messages`` (and ``tools``), ``max_tokens``, ``temperature`` 0 for greedy output, ``seed``,
``stream`` with ``stream_options.include_usage``. The server renders the messages with the
model's chat template, so what it reuses is what real chat clients get.

Nothing else goes into a warm request. A cold one adds the one field, or the call, each
server needs to bypass its cache (see openai_server.py). What the server reused is read from
``usage.prompt_tokens_details.cached_tokens``, else llama-server's ``timings.cache_n``.
llama-server also renders without running (``POST /apply-template``), which is how our
rendering is compared with the server's before any row runs (render_check.py).
"""
from __future__ import annotations

from .http_stream import Completion, ServerError, request_json, stream_frames
from .openai_server import OpenAIServer


class ChatServer(OpenAIServer):
    """The chat endpoint of an OpenAI-compatible server; ``complete`` takes messages."""

    api = "chat"

    def request_body(self, messages: list[dict], n_predict: int, *, tools=(),
                     seed: int = 0) -> dict:
        """The body of a greedy, streamed chat request, as an application sends it."""
        body: dict = {"model": self.model, "messages": [dict(m) for m in messages],
                      "max_tokens": n_predict, "temperature": 0.0, "seed": seed,
                      "stream": True, "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = [dict(t) for t in tools]
        return body

    def complete(self, prompt: list[dict], n_predict: int, *, cache_prompt: bool = True,
                 slot: int | None = None, seed: int = 0, tools=()) -> Completion:
        """Stream a greedy reply to the ``prompt`` messages; ``cache_prompt=False`` bypasses
        the server's prompt cache (a cold run). ``slot`` is not sent: an application names
        none, and llama-server picks the slot that holds the longest common prefix."""
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise ServerError("the chat API sends messages: give a chat template (.json or "
                              ".yaml), not a text template")
        body = self.request_body(prompt, n_predict, tools=tools, seed=seed)
        if not cache_prompt:
            self.bypass_cache(body)
        frames, ttft, total = stream_frames(self.http, "/v1/chat/completions", body,
                                            "chat completion on the OpenAI API", _has_content)
        text = "".join(_delta_text(f) for f in frames)
        usage = next((f["usage"] for f in reversed(frames) if f.get("usage")), None) or {}
        timings = next((f["timings"] for f in reversed(frames) if f.get("timings")), None) or {}
        cached = self.cached_from(usage)
        if cached is None and timings.get("cache_n") is not None:
            cached = int(timings["cache_n"])
        evaluated = self._evaluated(usage)
        if evaluated is None and timings.get("prompt_n") is not None:
            evaluated = int(timings["prompt_n"])
        prompt_ms = timings.get("prompt_ms")
        return Completion(text=text, tokens=[], ttft_ms=ttft, total_ms=total,
                          cached_tokens=cached, evaluated_tokens=evaluated,
                          prompt_ms=None if prompt_ms is None else float(prompt_ms),
                          raw_final=frames[-1])

    def apply_template(self, messages: list[dict], tools=()) -> str | None:
        """The prompt the server renders for ``messages`` with the generation prompt added
        (llama-server's /apply-template); None from a server that has no such endpoint."""
        if self.flavor != "llama":
            return None
        body: dict = {"messages": [dict(m) for m in messages]}
        if tools:
            body["tools"] = [dict(t) for t in tools]
        out = request_json(self.http, "POST", "/apply-template",
                           "rendering the messages on the server", json=body)
        prompt = out.get("prompt") if isinstance(out, dict) else None
        if not isinstance(prompt, str):
            raise ServerError("the server's /apply-template answered without a prompt")
        return prompt

    def missing_report_hint(self) -> str:
        return {"vllm": "start vLLM with --enable-prompt-tokens-details",
                "sglang": "start SGLang with --enable-cache-report",
                "llama": "this llama-server reports neither cached_tokens nor timings.cache_n "
                         "for chat requests; use the one `make server` builds"}[self.flavor]


def _delta_text(frame: dict) -> str:
    return "".join(str((c.get("delta") or {}).get("content") or "")
                   for c in frame.get("choices") or ())


def _has_content(frame: dict) -> bool:
    return bool(_delta_text(frame))


__all__ = ["ChatServer"]
