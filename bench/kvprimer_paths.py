"""KV Primer's own paths, timed to the first token, and the limits they are measured against.

- cold: every token from an empty context (the engine's cold reference), in the batches the
  warm run's history used, so an exact warm run gives its logits bit for bit;
- warm_memory: the app's warm run in prefix mode, the engine's own code
  (``warm_in_work_context``), after the work context held something else (as llama-cpp-python's
  cache paths run after an unrelated prompt): the static prefix is copied from the radix cache
  into the work context (from the state of the last copy, kept in RAM: one state_set, as
  llama-cpp-python's RAM cache does), the suffix evaluated in one batch with the kernel the
  engine chose;
- warm_in_place: the same when the work context holds the previous row of the template (the
  usual case: rows of one template in a row): the prefix is kept, the old suffix trimmed;
- warm_file / warm_state: the same after reading a .kvstate file (or from a given state) into an
  empty cache, as a fresh process would;
- limit: the fastest suffix evaluation llama.cpp can do here (the physical limit): the prefix
  already resident in a plain context of its own, the chosen kernel, the suffix in one batch,
  nothing looked up, kept or copied;
- limit_cache_context: the old limit, kept as a named extra: the prefix resident in the cache's
  shared context and the suffix in small batches there (what exactness cost before cells were
  laid out as a cold run lays them out).

Each returns a Sample with the time from the first step of the path to the first sampled token
(greedy), the tokens it evaluated and, when asked, more greedy tokens (untimed) for the
equivalence check.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine import Engine, GenerationConfig, PrefixState, Template
from app.engine.llama.batch_feed import feed_batches, feed_token
from app.engine.llama.batch_policy import EXACT_CHUNK, batch_starts
from app.engine.runs.generation import generate
from app.engine.llama.native import NativeContext
from app.engine.runs.prompt_runs import state_hit, warm_in_work_context

from .workload import RowTokens


@dataclass
class Sample:
    ms: float  # time to first token
    evaluated: int  # tokens the path evaluated
    first_token: int
    logits: np.ndarray | None = field(default=None, repr=False)  # at the first generated position
    restore_ms: float = 0.0  # ours: keeping or copying the prefix, or restoring a state
    load_ms: float = 0.0  # reading a state: a .kvstate file, or a LlamaDiskCache entry
    tokens: list[int] = field(default_factory=list)  # the first token and the untimed ones after


class OurPaths:
    """The paths on one engine whose radix cache holds the template's static prefix."""

    def __init__(self, engine: Engine, template: Template):
        self.engine = engine
        self.template = template
        self._limit = FastestLimit(engine)

    def close(self) -> None:
        self._limit.close()

    @property
    def prefix(self):
        return self.engine.prime_node(self.template)  # cached: a lookup

    def cold(self, row: RowTokens, more: int = 0) -> Sample:
        """Every token from an empty context, in the batches the warm paths' history used."""
        return self.cold_from(row, self.prefix.all_cuts(), more)

    def cold_from(self, row: RowTokens, prefix_cuts: list[int], more: int = 0) -> Sample:
        """The cold run of a row whose prefix was evaluated in batches from ``prefix_cuts``."""
        n_batch = self.engine.config.n_batch
        plan = [c for c in prefix_cuts if c < row.boundary] + row.suffix_starts(n_batch)
        n = max(1, more)
        r = self.engine.cold.run(row.tokens, plan, GenerationConfig(max_tokens=n), n, None,
                                 "cold", 1)
        return Sample(r.ttft_ms, r.evaluated_tokens, r.tokens[0], r.first_logits,
                      tokens=r.tokens[:n])

    def warm_memory(self, row: RowTokens, more: int = 0) -> Sample:
        """The app's warm run in prefix mode, the prefix copied from the radix cache."""
        self.engine.work.reset()
        return self.warm_in_place(row, more)

    def warm_in_place(self, row: RowTokens, more: int = 0) -> Sample:
        """The app's warm run in prefix mode (what `kvprimer run --reuse prefix` times), with
        whatever the work context holds."""
        cache = self.engine.cache
        self.prefix
        t0 = time.perf_counter()
        hit = cache.whole_batches(cache.lookup(row.tokens, limit=row.boundary))
        if hit.node is None or hit.reused != row.boundary:
            raise RuntimeError("the prefix is not in the engine's radix cache; prime it first")
        return self._warm(hit, row, more, t0)

    def warm_file(self, path: Path, row: RowTokens, more: int = 0) -> Sample:
        """A .kvstate file read and validated into an empty cache, then the warm run."""
        self._empty()
        t0 = time.perf_counter()
        state = self.engine.load_state(path)
        load_ms = (time.perf_counter() - t0) * 1000
        return self._from_state(state, row, more, t0, load_ms)

    def warm_state(self, state: PrefixState, row: RowTokens, more: int = 0) -> Sample:
        """A given state (the sweep's shortened prefixes) into an empty cache, then the run."""
        self._empty()
        return self._from_state(state, row, more, time.perf_counter(), 0.0)

    def _empty(self) -> None:
        self.engine.cache.clear()
        self.engine.work.reset()

    def _from_state(self, state: PrefixState, row: RowTokens, more: int, t0: float,
                    load_ms: float) -> Sample:
        hit = state_hit(self.engine, state, row.tokens, row.boundary)
        s = self._warm(hit, row, more, t0, state)
        s.load_ms = load_ms
        return s

    def _warm(self, hit, row: RowTokens, more: int, t0: float, state=None) -> Sample:
        n = max(1, more)
        before_ms = (time.perf_counter() - t0) * 1000  # the lookup, or reading a state file
        r, _copied = warm_in_work_context(self.engine, row.tokens, hit,
                                          GenerationConfig(max_tokens=n), n, keep_logits=1,
                                          state=state)
        return Sample(before_ms + r.ttft_ms, r.evaluated_tokens, r.tokens[0], r.first_logits,
                      before_ms + r.restore_ms, tokens=r.tokens[:n])

    def limit(self, row: RowTokens, more: int = 0) -> Sample:
        return self._limit.run(row, more)

    def limit_cache_context(self, row: RowTokens, more: int = 0) -> Sample:
        """The old limit: the prefix resident in the cache's own context, the suffix in small
        batches after it in the prefix's own sequence (then trimmed back)."""
        e, cache = self.engine, self.engine.cache
        node = self.prefix
        with cache.busy(node):
            seq = cache.materialise(node)
            own = cache.take_work_seq()
            try:
                e.seqs.fork(seq, own, upto=row.boundary)
                t0 = time.perf_counter()
                e.evaluate(row.suffix, own,
                           starts=e.batch_plan(own, len(row.suffix), EXACT_CHUNK, row.marks))
                n = max(1, more)
                g = generate(e.ctx, e.model, lambda tok: e.evaluate([tok], own, stage="generate"),
                             GenerationConfig(max_tokens=n), n, None, "bench", 1)
                return Sample((g.t_first - t0) * 1000, len(row.suffix), g.tokens[0], g.logits[0],
                              tokens=g.tokens)
            finally:
                cache.give_back(own)


class FastestLimit:
    """The physical limit: a plain context (the engine's kernel choice, one sequence) holding
    the prefix, evaluated once and untimed; each sample trims back to the row's boundary and
    evaluates only the suffix, in n_batch batches, then samples the first token."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._ctx: NativeContext | None = None
        self.tokens: list[int] = []

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def _context(self) -> NativeContext:
        if self._ctx is None:
            self._ctx = NativeContext(self.engine.model, self.engine.context_params(1))
        return self._ctx

    def run(self, row: RowTokens, more: int = 0) -> Sample:
        ctx, n_batch = self._context(), self.engine.config.n_batch
        prefix = row.tokens[:row.boundary]
        if self.tokens[:row.boundary] != prefix:  # another prefix: evaluate it (untimed)
            ctx.clear()
            feed_batches(ctx.decode, prefix, 0, batch_starts(0, len(prefix), n_batch),
                         want_logits=False)
            self.tokens = list(prefix)
        ctx.seq_rm(0, row.boundary, -1)
        self.tokens = self.tokens[:row.boundary]
        pos = [row.boundary]

        def step(tok: int) -> None:
            feed_token(ctx.decode, tok, pos[0])
            pos[0] += 1

        t0 = time.perf_counter()
        end = len(row.tokens)
        feed_batches(ctx.decode, row.suffix, row.boundary, row.suffix_starts(n_batch))
        pos[0] = end
        n = max(1, more)
        g = generate(ctx, self.engine.model, step, GenerationConfig(max_tokens=n), n, None,
                     "limit", 1)
        ctx.seq_rm(0, row.boundary, -1)
        return Sample((g.t_first - t0) * 1000, len(row.suffix), g.tokens[0], g.logits[0],
                      tokens=g.tokens)
