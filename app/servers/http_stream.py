"""What every server target shares: the error class, a streamed completion's result, and one
helper that times a streamed request to its first token.

Time to first token is taken at the first streamed frame that carries generated content:
llama-server and the OpenAI-compatible servers send their headers before they evaluate the
prompt, so the response's arrival says nothing about prompt processing.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import httpx
from httpx_sse import SSEError, connect_sse

from app.engine.errors import KvPrimerError

DEFAULT_TIMEOUT_S = 600.0  # a cold prompt on a slow CPU can take minutes; connect fails fast
CONNECT_TIMEOUT_S = 5.0


class ServerError(KvPrimerError):
    """A server is unreachable, refused a request, or answered something we cannot read."""


@dataclass
class Completion:
    """One streamed completion as a server reported it."""
    text: str
    tokens: list[int]  # generated token ids, when the server sends them (llama-server)
    ttft_ms: float  # request sent → first frame with generated content
    total_ms: float
    cached_tokens: int | None  # prompt tokens the server says it reused (None: not reported)
    evaluated_tokens: int | None  # prompt tokens it says it evaluated
    prompt_ms: float | None = None  # the server's own prompt-processing time
    slot: int | None = None
    raw_final: dict = field(default_factory=dict, repr=False)  # the last frame, for --json


def client(base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
           transport: httpx.BaseTransport | None = None,
           headers: dict[str, str] | None = None) -> httpx.Client:
    """An httpx client for one server; ``transport`` lets tests replay recorded responses."""
    url = normalise_url(base_url)
    return httpx.Client(base_url=url, transport=transport, headers=headers,
                        timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))


class ServerClient:
    """What every server client shares: one connection pool to one URL, closed by ``with``,
    a one-line error for a server that cannot be reached, and the facts server_bench asks of
    any server (overridden where a server differs)."""

    api = ""
    flavor = "llama"
    block_size = 1  # the granularity of a reported cached-token count

    def __init__(self, url: str, timeout_s: float | None = None,
                 transport: httpx.BaseTransport | None = None,
                 headers: dict[str, str] | None = None):
        kw = {} if timeout_s is None else {"timeout_s": timeout_s}
        self.http = client(url, transport=transport, headers=headers, **kw)
        self.url = str(self.http.base_url).rstrip("/")

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response:
        """A short GET whose failure to connect is one ServerError."""
        try:
            return self.http.get(path, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach {self.url} ({_short(e)}); is the server "
                              "running?") from None

    def served_model(self) -> str:
        """The model the server says it runs ('' when it does not say)."""
        return ""

    def missing_report_hint(self) -> str:
        """What to do when the server does not report the tokens it reused."""
        return "this server does not report reused prompt tokens"


def token_ids(out: dict) -> list[int]:
    """A /tokenize answer's ids (plain ids, or {id, piece} objects with ``with_pieces``)."""
    return [int(t) if not isinstance(t, dict) else int(t["id"]) for t in out["tokens"]]


def normalise_url(url: str) -> str:
    """'localhost:8080' → 'http://localhost:8080'; a bad URL is one clear error."""
    url = (url or "").strip()
    if not url:
        raise ServerError("no server URL given; give one like http://127.0.0.1:8080")
    if "://" not in url:
        url = "http://" + url
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise ServerError(f"'{url}' is not a server URL ({e}); give one like "
                          "http://127.0.0.1:8080") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ServerError(f"'{url}' is not an http(s) server URL; give one like "
                          "http://127.0.0.1:8080")
    return url.rstrip("/")


def request_json(http: httpx.Client, method: str, path: str, what: str, **kw) -> dict | list:
    """One JSON request; every failure becomes a one-line ServerError that names ``what``."""
    try:
        r = http.request(method, path, **kw)
    except httpx.TimeoutException:
        raise ServerError(f"{what}: {http.base_url} did not answer in time") from None
    except httpx.HTTPError as e:
        raise ServerError(f"{what}: cannot reach {http.base_url} ({_short(e)}); is the server "
                          "running?") from None
    if r.status_code >= 400:
        raise ServerError(f"{what}: the server answered {r.status_code}: {error_text(r)}")
    try:
        return r.json()
    except ValueError:
        raise ServerError(f"{what}: the server's answer is not JSON: {r.text[:120]!r}") from None


def error_text(r: httpx.Response) -> str:
    """The message inside llama-server's / OpenAI's error body, or the body's start."""
    try:
        body = r.json()
    except ValueError:
        return r.text.strip()[:200] or r.reason_phrase
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err)[:200]
    return str(err)[:200]


def stream_frames(http: httpx.Client, path: str, body: dict, what: str,
                  has_content: Callable[[dict], bool]
                  ) -> tuple[list[dict], float, float]:
    """POST ``body`` and read its SSE frames; returns (frames, ttft_ms, total_ms).

    ``has_content`` says whether a frame carries generated output; the first one that does
    sets the time to first token (the last frame's time when none does).
    """
    frames: list[dict] = []
    t0 = time.perf_counter()
    t_first = None
    try:
        # a fresh connection per stream: llama-server may close a kept-alive one just as the
        # pool hands it out again ("Server disconnected without sending a response")
        with connect_sse(http, "POST", path, json=body, headers={"Connection": "close"}) as source:
            if source.response.status_code >= 400:
                source.response.read()
                raise ServerError(f"{what}: the server answered {source.response.status_code}: "
                                  f"{error_text(source.response)}")
            for frame in _json_frames(source.iter_sse(), what):
                frames.append(frame)
                if t_first is None and has_content(frame):
                    t_first = time.perf_counter()
    except httpx.TimeoutException:
        raise ServerError(f"{what}: {http.base_url} did not answer in time") from None
    except SSEError as e:
        raise ServerError(f"{what}: the server did not stream ({e}); is this the right API "
                          "kind for this server?") from None
    except httpx.HTTPError as e:
        raise ServerError(f"{what}: cannot reach {http.base_url} ({_short(e)}); is the server "
                          "running?") from None
    t_end = time.perf_counter()
    if not frames:
        raise ServerError(f"{what}: the server closed the stream without an answer")
    return frames, ((t_first or t_end) - t0) * 1000, (t_end - t0) * 1000


def _json_frames(events, what: str) -> Iterator[dict]:
    for ev in events:
        data = ev.data.strip()
        if not data or data == "[DONE]":
            continue
        try:
            frame = json.loads(data)
        except ValueError:
            raise ServerError(f"{what}: a streamed frame is not JSON: {data[:120]!r}") from None
        if isinstance(frame, dict) and "error" in frame:
            err = frame["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise ServerError(f"{what}: the server reported an error: {str(msg)[:200]}")
        yield frame


def _short(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:120]
