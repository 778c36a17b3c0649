"""The one token-to-text generation loop: sample, stream the text, evaluate, repeat.

Every one-sequence path (warm, cold, one-shot, the benchmarks' baselines) generates through
``generate``, so they sample and decode text identically and differ only in how the prompt got
into the cache; forked rows step all their sequences in one decode (forked_runs.py, in the
forked rows' slot, slot/forked_rows.py) with the same ``TextStream``. Either way each step is fed by batch_feed.py's one loop. The logits of
the first ``keep_logits`` positions are kept for the verdict.
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..llama.native import NativeContext, NativeModel, NativeSampler
from ..task_state import TaskState


@dataclass(frozen=True)
class GenerationConfig:
    """How a run generates. These defaults are the app's only ones: the CLI's -n/-s, the
    window's options, runs and benchmarks all start from them."""
    max_tokens: int = 16  # new tokens at most (llama.cpp's -n); the verdict compares as many
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def max_new(self, n_tokens: int, n_ctx: int) -> int:
        """The tokens a run of an ``n_tokens`` prompt generates at most in an ``n_ctx``-cell
        context: ``max_tokens``, within the cells left (one at least)."""
        return max(1, min(self.max_tokens, n_ctx - n_tokens - 1))


@dataclass(frozen=True)
class TextDelta:
    """Streamed through TaskState.partial while a path generates."""
    mode: str
    text: str


@dataclass
class Generation:
    tokens: list[int]
    text: str
    logits: list[np.ndarray] = field(repr=False)  # per generated position, the first few
    t_first: float  # perf_counter when the first token was sampled
    t_end: float


class TextStream:
    """Bytes of token pieces in, whole UTF-8 text out (a character may span tokens)."""

    def __init__(self, model: NativeModel):
        self.model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.parts: list[str] = []

    def add(self, token: int) -> str:
        piece = self._decoder.decode(self.model.piece(token, special=False))
        if piece:
            self.parts.append(piece)
        return piece

    def text(self) -> str:
        return "".join(self.parts) + self._decoder.decode(b"", final=True)


def generate(ctx: NativeContext, model: NativeModel, step: Callable[[int], None],
             gen: GenerationConfig, max_new: int, task: TaskState | None, mode: str,
             keep_logits: int = 0) -> Generation:
    """Generate up to ``max_new`` tokens from the logits the last decode left in ``ctx``;
    ``step(token)`` evaluates a sampled token in the caller's sequence."""
    task = task or TaskState()
    out: list[int] = []
    kept: list[np.ndarray] = []
    stream = TextStream(model)
    t_first = 0.0
    with NativeSampler(gen.temperature, gen.top_p, gen.seed) as sampler:
        while True:
            if len(kept) < keep_logits:
                kept.append(ctx.logits(-1))
            tok = sampler.sample(ctx)
            if not out:
                t_first = time.perf_counter()
            out.append(tok)
            if model.is_eog(tok):
                break
            piece = stream.add(tok)
            if piece:
                task.partial(TextDelta(mode, piece))
            if len(out) >= max_new:
                break
            task.check()
            step(tok)
    return Generation(out, stream.text(), kept, t_first, time.perf_counter())
