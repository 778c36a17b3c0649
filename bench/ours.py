"""KV Primer's own paths, timed to the first token: cold, warm (the resident static prefix forked,
as a run of the app does), warm from a .kvstate file, and the limit (the prefix resident in its
own sequence, only the suffix evaluated there, then trimmed back).

Every path evaluates the suffix in the same decode batches (``RowTokens.suffix_starts``: chunks
of EXACT_CHUNK tokens, a batch starting at every segment), and the cold path replays the prefix's
batches too, in the engine's cold reference context (a context of its own, cells from 0), so a
warm path that is exact gives the cold path's logits bit for bit.

Each returns a Sample with the time from the first step of the path to the first sampled token
(greedy), the number of tokens it evaluated, counted from the engine's resident token list, and,
when asked, more greedy tokens (untimed) for the equivalence check.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine import Engine, GenerationConfig, PrefixState
from app.engine.batch_plan import EXACT_CHUNK
from app.engine.generation import generate
from app.engine.radix_tree import RadixNode

from .workload import RowTokens


@dataclass
class Sample:
    ms: float  # time to first token
    evaluated: int  # tokens the path evaluated
    first_token: int
    logits: np.ndarray | None = field(default=None, repr=False)  # at the first generated position
    restore_ms: float = 0.0  # ours: finding and forking the prefix, or engine.restore
    load_ms: float = 0.0  # reading a state: a .kvstate file, or a LlamaDiskCache entry
    tokens: list[int] = field(default_factory=list)  # the first token and the untimed ones after


class OurPaths:
    """The paths on one engine whose radix cache holds ``prefix`` (the primed static prefix)."""

    def __init__(self, engine: Engine, prefix: RadixNode, user_seq: int = 0):
        self.engine = engine
        self.prefix = prefix
        self.seq = user_seq  # where warm_file and warm_state restore a state

    # ---- the shared tail of every path
    def _suffix(self, seq: int, row: RowTokens, t0: float, more: int, restore_ms: float = 0.0,
                load_ms: float = 0.0) -> Sample:
        e = self.engine
        before = len(e.resident[seq])
        e.evaluate(row.suffix, seq, chunk=EXACT_CHUNK, marks=list(row.marks))
        evaluated = len(e.resident[seq]) - before
        # greedy, as every path here samples; the tokens after the first are untimed (they
        # are for the equivalence check)
        n = max(1, more)
        g = generate(e.ctx, e.model, lambda tok: e.evaluate([tok], seq, stage="generate"),
                     GenerationConfig(max_tokens=n), n, None, "bench", 1)
        ms = (g.t_first - t0) * 1000
        return Sample(ms, evaluated, g.tokens[0], g.logits[0], restore_ms, load_ms, g.tokens)

    # ---- the paths
    def cold(self, row: RowTokens, more: int = 0) -> Sample:
        """Every token from an empty context, in the batches the warm paths' history used."""
        plan = [c for c in self.prefix.all_cuts() if c < row.boundary] + row.suffix_starts()
        n = max(1, more)
        r = self.engine.cold.run(row.tokens, plan, GenerationConfig(max_tokens=n), n, None,
                                 "cold", 1)
        return Sample(r.ttft_ms, r.evaluated_tokens, r.tokens[0], r.first_logits,
                      tokens=r.tokens[:n])

    def limit(self, row: RowTokens, more: int = 0, seq: int | None = None) -> Sample:
        """The prefix already resident in its own sequence: the suffix evaluated right after it,
        then trimmed back. Nothing is found, forked or restored: no warm path can beat this."""
        e, cache = self.engine, self.engine.cache
        own = None
        if seq is None:
            seq = cache.materialise(self.prefix)
            if self.prefix.depth != row.boundary:  # the row's tokens leave the prefix early
                own = cache.take_work_seq()
                e.fork(seq, own, upto=row.boundary)
                seq = own
        if e.resident[seq] != row.tokens[:row.boundary]:
            raise RuntimeError("the limit path needs exactly the prefix resident in its sequence")
        try:
            return self._suffix(seq, row, time.perf_counter(), more)
        finally:
            if own is not None:
                cache.give_back(own)
            else:
                e.trim(seq, row.boundary)

    def warm_memory(self, row: RowTokens, more: int = 0) -> Sample:
        """The app's warm run: look the prompt up in the radix cache, fork the resident prefix
        into a working sequence (cells shared, nothing copied), evaluate the suffix."""
        cache = self.engine.cache
        t0 = time.perf_counter()
        hit = cache.lookup(row.tokens, limit=row.boundary)
        if hit.node is None or hit.reused != row.boundary:
            raise RuntimeError("the prefix is not in the engine's radix cache; prime it first")
        work = cache.take_work_seq()
        try:
            cache.fork_into(hit, work)
            fork_ms = (time.perf_counter() - t0) * 1000
            return self._suffix(work, row, t0, more, fork_ms)
        finally:
            cache.give_back(work)

    def warm_file(self, path: Path, row: RowTokens, more: int = 0) -> Sample:
        """The .kvstate file read and validated, restored into a sequence, suffix evaluated."""
        with self.prefix_set_aside():
            e = self.engine
            t0 = time.perf_counter()
            state = e.load_state(path)
            load_s = time.perf_counter() - t0
            return self._restore_and_finish(state, row, t0, load_s * 1000, more)

    def warm_state(self, state: PrefixState, row: RowTokens, more: int = 0) -> Sample:
        """A given state restored (the sweep's shortened prefixes are not cached)."""
        return self._restore_and_finish(state, row, time.perf_counter(), 0.0, more)

    def _restore_and_finish(self, state: PrefixState, row: RowTokens, t0: float,
                            load_ms: float, more: int) -> Sample:
        e, s = self.engine, self.seq
        e.clear_seq(s)
        try:
            restore_s = e.restore(state, s)
            e.trim(s, row.boundary)
            return self._suffix(s, row, t0, more, restore_s * 1000, load_ms)
        finally:
            e.clear_seq(s)

    @contextmanager
    def prefix_set_aside(self):
        """The cached prefix moved to RAM while a restore path runs, and back after.

        A restore lands in the first free cells; with the cached prefix resident beside it the
        attention of every batch would span both copies. Set aside, the restored prefix takes
        cells 0.. as the resident one does, and comes back there when the restore is cleared."""
        cache = self.engine.cache
        if self.prefix.seq is not None:
            cache.spill(self.prefix)
            cache.compact()  # free its cells, not only hold them
        try:
            yield
        finally:
            self.engine.clear_seq(self.seq)
            cache.materialise(self.prefix)
