"""Time to first token against prefix length, cold and warm, with the suffix alone as the floor.

Qt-free; it runs as a worker job behind the Benchmark view. For each prefix length L (a share
of the template's static prefix, in tokens) and one row's suffix:
  cold  = evaluate L prefix tokens + the suffix from an empty sequence (batches split at L);
  warm  = restore a state of those L tokens, then evaluate the suffix;
  floor = evaluate the suffix alone from an empty sequence (what no cache can beat).
The L-token states are cut from one priming of the whole prefix (trim, then snapshot), so the
sweep primes once. Cutting tokens makes text no one would write, but the timings are the point.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from .errors import KvPrimerError
from .kv_engine import Engine
from .prompt_tokens import common_prefix
from .task_state import TaskState
from .template import Template

SHARES = (0.125, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class SweepPoint:
    prefix_tokens: int
    suffix_tokens: int
    cold_ms: float
    warm_ms: float
    floor_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def _timed_eval(engine: Engine, tokens: list[int], seq: int, task: TaskState, stage: str,
                split_at: int | None = None) -> float:
    t0 = time.perf_counter()
    engine.evaluate(tokens, seq, task, stage=stage, marks=[split_at] if split_at else [])
    return (time.perf_counter() - t0) * 1000


def prefix_sweep(engine: Engine, template: Template, values: dict[str, str], *,
                 shares: tuple[float, ...] = SHARES, seq: int = 0,
                 task: TaskState | None = None) -> list[SweepPoint]:
    task = task or TaskState()
    tokens = engine.tokenize(template.fill(values))
    prefix = engine.tokenize(template.prefix_prompt())
    p = min(common_prefix(prefix, tokens), len(tokens) - 1)
    if p < 2:
        raise KvPrimerError("the template's static prefix is too short to sweep; "
                            "put more text before the first placeholder")
    suffix = tokens[p:]
    lengths = sorted({max(1, round(p * s)) for s in shares})
    engine.clear_seq(seq)
    engine.evaluate(prefix[:p], seq, task, stage="prime", want_logits=False)
    states = {}
    for n in reversed(lengths):  # longest first: trimming only shortens
        engine.trim(seq, n)
        states[n] = engine.snapshot(seq)
    points = []
    for k, n in enumerate(lengths):
        task.report("sweep", k, len(lengths))
        engine.clear_seq(seq)
        cold = _timed_eval(engine, prefix[:n] + suffix, seq, task, "cold", split_at=n)
        engine.clear_seq(seq)
        t0 = time.perf_counter()
        engine.restore(states[n], seq)
        warm = (time.perf_counter() - t0) * 1000 + _timed_eval(engine, suffix, seq, task, "warm")
        engine.clear_seq(seq)
        floor = _timed_eval(engine, suffix, seq, task, "floor")
        points.append(SweepPoint(n, len(suffix), cold, warm, floor))
        task.partial(list(points))
    engine.clear_seq(seq)
    task.report("sweep", len(lengths), len(lengths))
    return points
