"""Cold runs in a context of their own: what a user without any cache would get.

The engine's main context holds the radix cache (many sequences, cells wherever llama.cpp put
them). A cold run there would land its cells after everyone else's and so not be a true cold
run. Here a second context with the same model and parameters is cleared before every run, so
its cells always start at cell 0 in position order. Two kinds of cold run:
- ``same_boundary``: the batch starts of the warm run's history replayed exactly (see
  batch_plan.py): the reference a warm run must match bit for bit;
- ``oneshot``: plain batches, as any llama.cpp program would evaluate the prompt, with its cells
  one cell further on (a padding cell of another sequence comes first). Its difference from the
  same-boundary run is the model's own numeric noise: what batch grouping and cell placement
  change in the arithmetic, both of which a cache could change without being wrong. It is run
  only to judge a warm run that differs from its same-boundary cold run, or when asked.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .batch_feed import feed_batches, feed_token
from .batch_plan import batch_starts
from .generation import GenerationConfig, generate
from ..llama.native import NativeContext
from ..task_state import TaskState


@dataclass
class PathResult:
    mode: str  # "warm", "cold" or "oneshot"
    reused_tokens: int
    evaluated_tokens: int
    restore_ms: float  # finding, forking or restoring what is reused
    prompt_ms: float  # evaluating the prompt tokens
    ttft_ms: float  # restore + evaluation + first token sampled
    gen_ms: float
    tokens: list[int]
    text: str
    logits: list[np.ndarray] = field(repr=False)  # per generated position (the first few)
    starts: list[int] = field(default_factory=list, repr=False)  # batch starts evaluated

    @property
    def first_logits(self) -> np.ndarray:
        return self.logits[0]

    @property
    def tokens_per_s(self) -> float:
        n = max(len(self.tokens) - 1, 0)  # the first token belongs to time-to-first-token
        return n / (self.gen_ms / 1000) if self.gen_ms > 0 else 0.0


class ColdReference:
    def __init__(self, engine):
        self._engine = engine
        self._ctx: NativeContext | None = None

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def _context(self) -> NativeContext:
        if self._ctx is None:  # two sequences: the noise run's padding cell is another's
            self._ctx = NativeContext(self._engine.model, self._engine.context_params(2))
        return self._ctx

    def run(self, tokens: list[int], marks: list[int] | None, gen: GenerationConfig,
            max_new: int, task: TaskState | None, mode: str, keep_logits: int) -> PathResult:
        """Evaluate ``tokens`` from scratch with batches starting at ``marks`` (None: plain
        n_batch batches, one cell further on), then generate."""
        task = task or TaskState()
        ctx = self._context()
        ctx.clear()
        if marks is None:  # the noise run: another sequence's cell first moves every cell by one
            feed_batches(ctx.decode, tokens[:1], 0, [0], seq=1, want_logits=False)
        n_batch = self._engine.config.n_batch
        starts = batch_starts(0, len(tokens), n_batch, marks or ())
        t0 = time.perf_counter()
        feed_batches(ctx.decode, tokens, 0, starts, task=task, stage=mode)
        prompt_s = time.perf_counter() - t0
        pos = [len(tokens)]

        def step(tok: int) -> None:
            feed_token(ctx.decode, tok, pos[0])
            pos[0] += 1

        g = generate(ctx, self._engine.model, step, gen, max_new, task, mode, keep_logits)
        ctx.clear()
        return PathResult(mode, 0, len(tokens), 0.0, prompt_s * 1000, (g.t_first - t0) * 1000,
                          (g.t_end - g.t_first) * 1000, g.tokens, g.text, g.logits, starts)
