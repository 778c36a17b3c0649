"""Benchmark rows cold versus warm: the figures behind `kvprimer bench` and the Benchmark view.

The prefix is primed once (not timed as part of any row). Each row is run ``repeat`` times on
both paths; the one-shot comparison runs on the first repeat only (it is deterministic).
A row that fails (too long, bad values) is reported with its error; the others still run.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from .errors import Cancelled, KvPrimerError
from .kv_engine import Engine
from .prefix_state import PrefixState
from .prompt_runs import GenerationConfig, run_prompt
from .rows import Row
from .task_state import TaskState
from .template import Template


@dataclass
class BenchRow:
    row: int
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    reused_tokens: int = 0
    evaluated_tokens: int = 0
    cold_ms: float = 0.0
    warm_ms: float = 0.0
    cold_ms_min: float = 0.0
    cold_ms_max: float = 0.0
    warm_ms_min: float = 0.0
    warm_ms_max: float = 0.0
    restore_ms: float = 0.0
    speedup: float = 0.0
    tokens_equal: bool = False
    first_diff: int | None = None
    max_logit_diff: float = 0.0
    oneshot_tokens_equal: bool | None = None
    oneshot_max_logit_diff: float | None = None
    state_bytes: int = 0
    error: str | None = None


@dataclass
class BenchResult:
    model: dict
    rows: list[BenchRow] = field(default_factory=list)
    repeat: int = 1
    cancelled: bool = False

    def summary(self) -> dict:
        ok = [r for r in self.rows if r.error is None]
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {
            "rows": len(self.rows),
            "failed_rows": len(self.rows) - len(ok),
            "speedup_median": med([r.speedup for r in ok]),
            "cold_ms_median": med([r.cold_ms for r in ok]),
            "warm_ms_median": med([r.warm_ms for r in ok]),
            "restore_ms_median": med([r.restore_ms for r in ok]),
            "all_tokens_equal": all(r.tokens_equal for r in ok) if ok else None,
            "max_logit_diff": max((r.max_logit_diff for r in ok), default=None),
            "oneshot_max_logit_diff": max((r.oneshot_max_logit_diff or 0.0 for r in ok), default=None),
            "repeat": self.repeat,
            "cancelled": self.cancelled,
        }

    def as_dict(self) -> dict:
        return {"model": self.model, "rows": [asdict(r) for r in self.rows], "summary": self.summary()}


def bench_rows(engine: Engine, template: Template, rows: list[Row], *, repeat: int = 1,
               state: PrefixState | None = None, gen: GenerationConfig = GenerationConfig(max_tokens=8),
               task: TaskState | None = None) -> BenchResult:
    task = task or TaskState()
    if repeat < 1:
        raise KvPrimerError("--repeat must be at least 1")
    result = BenchResult(model=engine.info.as_dict(), repeat=repeat)
    if state is None:
        state = engine.prime(template, task=task)
    total = len(rows) * repeat
    task.report("bench", 0, total)
    try:
        for k, row in enumerate(rows):
            result.rows.append(_bench_one(engine, template, row, repeat, state, gen, task))
            task.report("bench", (k + 1) * repeat, total)
            task.partial(result)
    except Cancelled:
        result.cancelled = True
    return result


def _bench_one(engine, template, row, repeat, state, gen, task) -> BenchRow:
    out = BenchRow(row=row.number, prefix_tokens=state.n_tokens, state_bytes=state.nbytes)
    colds, warms, restores = [], [], []
    try:
        for r in range(repeat):
            rep = run_prompt(engine, template, row.values, state=state, oneshot=(r == 0), gen=gen,
                             task=task)
            colds.append(rep.cold.ttft_ms)
            warms.append(rep.warm.ttft_ms)
            restores.append(rep.warm.restore_ms)
            if r == 0:
                eq = rep.equivalence
                out.suffix_tokens = rep.prompt_tokens - rep.reused_tokens
                out.reused_tokens = rep.reused_tokens
                out.evaluated_tokens = rep.evaluated_tokens
                out.tokens_equal = eq.tokens_equal
                out.first_diff = eq.first_diff
                out.max_logit_diff = eq.max_logit_diff
                out.oneshot_tokens_equal = eq.oneshot_tokens_equal
                out.oneshot_max_logit_diff = eq.oneshot_max_logit_diff
    except Cancelled:
        raise
    except KvPrimerError as e:
        out.error = str(e)
        return out
    out.cold_ms, out.warm_ms = statistics.median(colds), statistics.median(warms)
    out.cold_ms_min, out.cold_ms_max = min(colds), max(colds)
    out.warm_ms_min, out.warm_ms_max = min(warms), max(warms)
    out.restore_ms = statistics.median(restores)
    out.speedup = out.cold_ms / out.warm_ms if out.warm_ms > 0 else 0.0
    return out
