"""A client for llama.cpp's llama-server: health, props, tokenize, slots, streamed completions.

Prompts go as token ids where we have them, so the server evaluates exactly the tokens KV
Primer would (``/completion`` uses a token list as sent). ``timings.cache_n`` is what the
server reused; it is at most n − 1, because one prompt token is always evaluated again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from .http_stream import (Completion, ServerClient, ServerError, error_text, request_json,
                          _short, stream_frames, token_ids)

SLOT_ACTIONS = ("save", "restore", "erase")


@dataclass(frozen=True)
class ServerProps:
    n_ctx: int
    total_slots: int
    model_path: str
    build_info: str


@dataclass(frozen=True)
class SlotResult:
    slot: int
    filename: str
    tokens: int  # n_saved / n_restored
    bytes: int
    ms: float


class LlamaServer(ServerClient):
    """One llama-server at ``url``. Close it (or use ``with``) to free the connection pool."""

    api = "llama"

    # -- state of the server
    def health(self) -> str:
        """'ok', or 'loading' while the model loads (llama-server answers 503 then)."""
        r = self.get("/health")
        if r.status_code == 503:
            return "loading"
        if r.status_code >= 400:
            raise ServerError(f"health check: the server answered {r.status_code}: {error_text(r)}")
        return "ok"

    def wait_ready(self, timeout_s: float = 120.0, alive=lambda: True) -> None:
        """Poll /health until 'ok' (bounded); ``alive()`` False stops the wait (process died)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                if self.health() == "ok":
                    return
            except ServerError:
                pass
            if not alive():
                raise ServerError(f"the server at {self.url} stopped while starting")
            if time.monotonic() > deadline:
                raise ServerError(f"the server at {self.url} was not ready after {timeout_s:.0f} s")
            time.sleep(delay)  # a bounded poll of another process, not a test wait
            delay = min(delay * 2, 0.5)

    def props(self) -> ServerProps:
        p = request_json(self.http, "GET", "/props", "reading the server's properties")
        gen = p.get("default_generation_settings") or {}
        return ServerProps(n_ctx=int(gen.get("n_ctx") or p.get("n_ctx") or 0),
                           total_slots=int(p.get("total_slots") or 0),
                           model_path=str(p.get("model_path") or ""),
                           build_info=str(p.get("build_info") or ""))

    def served_model(self) -> str:
        try:
            return self.props().model_path
        except ServerError:  # a server without /props: the model stays unknown
            return ""

    def missing_report_hint(self) -> str:
        return "this llama-server reports no timings.cache_n; use the one `make server` builds"

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int] | None:
        return token_ids(request_json(self.http, "POST", "/tokenize", "tokenizing on the server",
                                      json={"content": text, "add_special": add_special,
                                            "parse_special": parse_special}))

    # -- slots
    def slot(self, slot: int, action: str, filename: str = "") -> SlotResult:
        if action not in SLOT_ACTIONS:
            raise ServerError(f"unknown slot action '{action}'; use one of {', '.join(SLOT_ACTIONS)}")
        body = {"filename": filename} if action != "erase" else {}
        try:
            r = self.http.post(f"/slots/{slot}", params={"action": action}, json=body)
        except httpx.HTTPError as e:
            raise ServerError(f"slot {slot} {action}: cannot reach {self.url} ({_short(e)})") from None
        if r.status_code >= 400:
            raise ServerError(slot_error(slot, action, r))
        d = r.json()
        t = d.get("timings") or {}
        return SlotResult(slot=int(d.get("id_slot", slot)), filename=str(d.get("filename", filename)),
                          tokens=int(d.get("n_saved", d.get("n_restored", d.get("n_erased", 0)))),
                          bytes=int(d.get("n_written", d.get("n_read", 0))),
                          ms=float(t.get("save_ms", t.get("restore_ms", 0.0))))

    # -- completions
    def complete(self, prompt: list[int] | str, n_predict: int, *, cache_prompt: bool = True,
                 slot: int | None = None, seed: int = 0) -> Completion:
        """Stream a greedy completion; ``cache_prompt=False`` makes the server evaluate the whole
        prompt (a cold run)."""
        body = {"prompt": prompt, "n_predict": n_predict, "stream": True,
                "cache_prompt": cache_prompt, "return_tokens": True, "temperature": 0.0,
                "top_k": 1, "seed": seed}
        if slot is not None:
            body["id_slot"] = slot
        frames, ttft, total = stream_frames(
            self.http, "/completion", body, "completion on llama-server",
            lambda f: bool(f.get("content") or f.get("tokens")) and not f.get("stop"))
        text = "".join(str(f.get("content", "")) for f in frames)
        toks = [int(t) for f in frames for t in (f.get("tokens") or [])]
        final = next((f for f in reversed(frames) if f.get("timings")), frames[-1])
        tm = final.get("timings") or {}
        if len(toks) < int(final.get("tokens_predicted") or 0):
            # tokens that end in half a UTF-8 character are never streamed: ask for the ids
            # once more, unstreamed (the prompt is cached by now, so this costs the generation)
            toks = self._generated_ids(prompt, n_predict, slot, seed, cache_prompt)
        return Completion(text=text, tokens=toks, ttft_ms=ttft, total_ms=total,
                          cached_tokens=_int(tm.get("cache_n")),
                          evaluated_tokens=_int(tm.get("prompt_n")),
                          prompt_ms=_float(tm.get("prompt_ms")),
                          slot=_int(final.get("id_slot")), raw_final=final)

    def _generated_ids(self, prompt, n_predict: int, slot: int | None, seed: int,
                       cache_prompt: bool) -> list[int]:
        body = {"prompt": prompt, "n_predict": n_predict, "stream": False,
                "cache_prompt": cache_prompt,
                "return_tokens": True, "temperature": 0.0, "top_k": 1, "seed": seed}
        if slot is not None:
            body["id_slot"] = slot
        out = request_json(self.http, "POST", "/completion", "completion on llama-server", json=body)
        return [int(t) for t in out.get("tokens") or []]


def slot_error(slot: int, action: str, r: httpx.Response) -> str:
    msg = error_text(r)
    if r.status_code == 501 or "slot-save-path" in msg or "not supported" in msg.lower():
        return (f"slot {action} refused: the server was started without a slot directory; "
                "restart it with --slot-save-path DIR")
    return f"slot {slot} {action}: the server answered {r.status_code}: {msg}"


def _int(v) -> int | None:
    return None if v is None else int(v)


def _float(v) -> float | None:
    return None if v is None else float(v)
