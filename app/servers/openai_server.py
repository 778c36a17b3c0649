"""A client for any OpenAI-compatible server's ``/v1/completions`` (llama-server, vLLM, SGLang).

What the servers reuse is read from ``usage.prompt_tokens_details.cached_tokens``, in the last
streamed frame (``stream_options.include_usage``). Each server has its own way to run cold:
- llama-server: ``cache_prompt: false`` in the request;
- vLLM: a random ``cache_salt`` (its prefix cache is keyed by it; ``/reset_prefix_cache`` is a
  dev-mode endpoint only). It counts whole 16-token blocks and reports them only when started
  with ``--enable-prompt-tokens-details``;
- SGLang: ``POST /flush_cache`` first (it answers 400 while requests run, so it is retried a
  bounded number of times). It reports with ``--enable-cache-report`` and omits the field when
  nothing was reused.
"""
from __future__ import annotations

import secrets
import time

import httpx

from .http_stream import Completion, ServerClient, ServerError, request_json, stream_frames, token_ids

FLAVORS = ("llama", "vllm", "sglang")
_FLUSH_TRIES = 20


class OpenAIServer(ServerClient):
    api = "openai"

    def __init__(self, url: str, *, flavor: str = "auto", model: str = "", api_key: str = "",
                 timeout_s: float | None = None, transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        super().__init__(url, timeout_s, transport, headers)
        if flavor not in ("auto", *FLAVORS):
            raise ServerError(f"unknown server kind '{flavor}'; use auto or one of {', '.join(FLAVORS)}")
        self.flavor = self._detect() if flavor == "auto" else flavor
        self.model = model or self._first_model()

    @property
    def block_size(self) -> int:
        """The granularity of the cached-token count (vLLM counts whole 16-token blocks)."""
        return 16 if self.flavor == "vllm" else 1

    def _probe(self, path: str) -> bool:
        try:
            return self.http.get(path, timeout=10.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _detect(self) -> str:
        if self._probe("/props"):
            return "llama"
        if self._probe("/get_server_info"):
            return "sglang"
        return "vllm"

    def _first_model(self) -> str:
        out = request_json(self.http, "GET", "/v1/models", "listing the server's models")
        data = out.get("data") if isinstance(out, dict) else None
        if not data:
            raise ServerError(f"{self.url} lists no models under /v1/models; is this an "
                              "OpenAI-compatible server?")
        return str(data[0].get("id", ""))

    def served_model(self) -> str:
        return self.model

    def health(self) -> str:
        for path in ("/health", "/v1/models"):
            r = self.get(path)
            if r.status_code == 503:
                return "loading"
            if r.status_code == 200:
                return "ok"
        raise ServerError(f"{self.url} answered neither /health nor /v1/models")

    def tokenize(self, text: str) -> list[int] | None:
        """The server's own tokens for ``text`` (llama-server and vLLM have /tokenize), else None."""
        if self.flavor == "llama":
            body = {"content": text, "add_special": True, "parse_special": True}
        elif self.flavor == "vllm":
            body = {"model": self.model, "prompt": text}
        else:
            return None
        return token_ids(request_json(self.http, "POST", "/tokenize", "tokenizing on the server",
                                      json=body))

    def flush(self) -> None:
        """SGLang: empty the radix cache before a cold run."""
        for _ in range(_FLUSH_TRIES):
            r = self.http.post("/flush_cache")
            if r.status_code < 400:
                return
            time.sleep(0.1)  # requests still running; bounded retries
        raise ServerError("SGLang refused /flush_cache while requests ran; run the bench when "
                          "the server is idle")

    def bypass_cache(self, body: dict) -> None:
        """Make ``body`` a cold request: each kind of server skips its prompt cache its own way
        (llama-server a field, vLLM a fresh cache salt, others only a flush of the cache)."""
        if self.flavor == "llama":
            body["cache_prompt"] = False
        elif self.flavor == "vllm":
            body["cache_salt"] = secrets.token_hex(8)
        else:
            self.flush()

    def complete(self, prompt: str | list[int], n_predict: int, *, cache_prompt: bool = True,
                 slot: int | None = None, seed: int = 0) -> Completion:
        body: dict = {"model": self.model, "prompt": prompt, "max_tokens": n_predict,
                      "temperature": 0.0, "seed": seed, "stream": True,
                      "stream_options": {"include_usage": True}}
        if not cache_prompt:
            self.bypass_cache(body)
        frames, ttft, total = stream_frames(
            self.http, "/v1/completions", body, "completion on the OpenAI API",
            lambda f: any(c.get("text") for c in f.get("choices") or ()))
        text = "".join(str(c.get("text") or "") for f in frames for c in f.get("choices") or ())
        usage = next((f["usage"] for f in reversed(frames) if f.get("usage")), None) or {}
        return Completion(text=text, tokens=[], ttft_ms=ttft, total_ms=total,
                          cached_tokens=self.cached_from(usage),
                          evaluated_tokens=self._evaluated(usage), raw_final=frames[-1])

    def cached_from(self, usage: dict) -> int | None:
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            return int(details["cached_tokens"])
        if self.flavor == "sglang" and usage:
            return 0  # SGLang leaves the field out when nothing was reused
        return None

    def _evaluated(self, usage: dict) -> int | None:
        cached = self.cached_from(usage)
        n = usage.get("prompt_tokens")
        return None if n is None or cached is None else int(n) - cached

    def missing_report_hint(self) -> str:
        return {"vllm": "start vLLM with --enable-prompt-tokens-details",
                "sglang": "start SGLang with --enable-cache-report",
                "llama": "this llama-server reports no cached_tokens; use the one `make server` "
                         "builds"}[self.flavor]
