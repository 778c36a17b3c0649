"""KV Primer's own paths, timed to the first token: cold, warm from memory, warm from file, and
the limit (prefix already resident, nothing restored).

Each returns a Sample with the time from the first step of the path to the first sampled token
(greedy), and the number of tokens it actually evaluated, counted from the engine's resident
token list before and after, so the report can show every path evaluated the same suffix.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine import Engine, PrefixState
from app.engine.native import NativeSampler

from .workload import RowTokens


@dataclass
class Sample:
    ms: float  # time to first token
    evaluated: int  # tokens the path evaluated
    first_token: int
    logits: np.ndarray | None = field(default=None, repr=False)  # at the first generated position
    restore_ms: float = 0.0  # ours only: engine.restore's share of ms
    load_ms: float = 0.0  # reading a state: a .kvstate file, or a LlamaDiskCache entry


def greedy(engine: Engine) -> int:
    with NativeSampler() as s:  # temperature 0: greedy, as every path here samples
        return s.sample(engine.ctx)


def continue_greedy(engine: Engine, seq: int, first: int, n: int) -> list[int]:
    """``n`` greedy tokens starting with ``first`` (untimed: for the equivalence check)."""
    out = [first]
    while len(out) < n and not engine.model.is_eog(out[-1]):
        engine.evaluate([out[-1]], seq, stage="generate")
        out.append(greedy(engine))
    return out


class OurPaths:
    def __init__(self, engine: Engine, seq: int = 0):
        self.engine = engine
        self.seq = seq

    def cold(self, row: RowTokens) -> Sample:
        """Every token from an empty sequence, with a batch starting at the boundary (as warm)."""
        e, s = self.engine, self.seq
        e.clear_seq(s)
        t0 = time.perf_counter()
        logits = e.evaluate(row.tokens, s, split_at=row.boundary)
        tok = greedy(e)
        ms = (time.perf_counter() - t0) * 1000
        return Sample(ms, len(e.resident[s]), tok, logits)

    def warm_memory(self, row: RowTokens) -> Sample:
        """The state found in the engine's PrefixStore, restored, then the suffix evaluated."""
        e = self.engine
        e.clear_seq(self.seq)
        t0 = time.perf_counter()
        match = e.store.longest_prefix(row.tokens)
        if match is None:
            raise RuntimeError("the prefix is not in the engine's store; prime it first")
        return self._restore_and_finish(match.state, row, t0, 0.0)

    def warm_file(self, path: Path, row: RowTokens) -> Sample:
        """The .kvstate file read and validated (PrefixState.load), restored, suffix evaluated."""
        e = self.engine
        e.clear_seq(self.seq)
        t0 = time.perf_counter()
        state = e.load_state(path)
        load_s = time.perf_counter() - t0
        return self._restore_and_finish(state, row, t0, load_s * 1000)

    def warm_state(self, state: PrefixState, row: RowTokens) -> Sample:
        """A given state restored (the sweep's states are not in the store)."""
        self.engine.clear_seq(self.seq)
        return self._restore_and_finish(state, row, time.perf_counter(), 0.0)

    def _restore_and_finish(self, state: PrefixState, row: RowTokens, t0: float,
                            load_ms: float) -> Sample:
        e, s = self.engine, self.seq
        restore_s = e.restore(state, s)
        e.trim(s, row.boundary)
        before = len(e.resident[s])
        logits = e.evaluate(row.tokens[row.boundary:], s)
        tok = greedy(e)
        ms = (time.perf_counter() - t0) * 1000
        return Sample(ms, len(e.resident[s]) - before, tok, logits, restore_s * 1000, load_ms)

    def limit(self, row: RowTokens) -> Sample:
        """The prefix is already resident in the sequence: drop what follows it, evaluate the
        suffix. No restore at all, so no warm path can beat this."""
        e, s = self.engine, self.seq
        if e.resident[s][:row.boundary] != row.tokens[:row.boundary]:
            raise RuntimeError("the limit path needs the prefix resident; run cold or warm first")
        t0 = time.perf_counter()
        e.trim(s, row.boundary)
        before = len(e.resident[s])
        logits = e.evaluate(row.tokens[row.boundary:], s)
        tok = greedy(e)
        ms = (time.perf_counter() - t0) * 1000
        return Sample(ms, len(e.resident[s]) - before, tok, logits)
