"""Forked batches against one-by-one warm runs: the figures behind `kvprimer bench --fork K`.

The prefix is primed once. The rows run in batches of k (run_forked); each batch is then run
again row by row warm (restore, suffix, generate) and compared token for token. Timings exclude
tokenization on both sides: forked = fork + suffixes + generation of the whole batch;
sequential = the sum over its rows of restore + suffix + generation.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import KvPrimerError
from ..runs.forked_runs import compare_with_sequential, run_forked
from ..states.prefix_state import PrefixState
from ..runs.generation import GenerationConfig
from ..prompts.rows import Row
from ..task_state import TaskState
from ..prompts.template import Template


@dataclass
class ForkedBatchFigures:
    rows: list[int]  # row numbers
    evaluated_tokens: int
    generated_tokens: int
    prompt_decodes: int
    forked_ms: float
    sequential_ms: float
    tokens_equal: bool
    rows_equal: list[bool]  # per row: greedy tokens equal to its one-by-one run
    max_logit_diff: float  # first generated position, forked vs one-by-one warm

    @property
    def speedup(self) -> float:
        return self.sequential_ms / self.forked_ms if self.forked_ms > 0 else 0.0


@dataclass
class ForkedBenchResult:
    k: int
    prefix_tokens: int
    batches: list[ForkedBatchFigures] = field(default_factory=list)

    def summary(self) -> dict:
        fms = sum(b.forked_ms for b in self.batches)
        sms = sum(b.sequential_ms for b in self.batches)
        rows = sum(len(b.rows) for b in self.batches)
        toks = sum(b.evaluated_tokens + b.generated_tokens for b in self.batches)
        return {
            "k": self.k, "rows": rows, "batches": len(self.batches),
            "forked_ms": fms, "sequential_ms": sms,
            "forked_rows_per_s": rows / (fms / 1000) if fms else 0.0,
            "sequential_rows_per_s": rows / (sms / 1000) if sms else 0.0,
            "forked_tokens_per_s": toks / (fms / 1000) if fms else 0.0,
            "sequential_tokens_per_s": toks / (sms / 1000) if sms else 0.0,
            "speedup": sms / fms if fms else 0.0,
            "all_tokens_equal": all(b.tokens_equal for b in self.batches),
            "rows_tokens_equal": sum(sum(b.rows_equal) for b in self.batches),
            "max_logit_diff": max((b.max_logit_diff for b in self.batches), default=0.0),
        }

    def as_dict(self) -> dict:
        return {"batches": [{**asdict(b), "speedup": b.speedup} for b in self.batches],
                "summary": self.summary(), "prefix_tokens": self.prefix_tokens}


def bench_forked(engine, template: Template, rows: list[Row], k: int, *,
                 state: PrefixState | None = None,
                 gen: GenerationConfig = GenerationConfig(),
                 task: TaskState | None = None, exact: bool = True) -> ForkedBenchResult:
    task = task or TaskState()
    if k < 1:
        raise KvPrimerError("forked batches need at least 1 row each")
    node = engine.prime_node(template, task) if state is None else engine.adopt(state)
    result = ForkedBenchResult(k=k, prefix_tokens=node.depth)
    for start in range(0, len(rows), k):
        chunk = rows[start:start + k]
        values = [r.values for r in chunk]
        batch = run_forked(engine, template, values, state=state, gen=gen, task=task, exact=exact)
        cmp = compare_with_sequential(engine, template, values, batch, state, gen, task)
        result.batches.append(ForkedBatchFigures(
            rows=[r.number for r in chunk], evaluated_tokens=batch.evaluated_tokens,
            generated_tokens=batch.generated_tokens, prompt_decodes=batch.prompt_decodes,
            forked_ms=batch.total_ms, sequential_ms=sum(c.sequential_ms for c in cmp),
            tokens_equal=all(c.tokens_equal for c in cmp), rows_equal=[c.tokens_equal for c in cmp],
            max_logit_diff=max(c.max_logit_diff for c in cmp)))
        task.report("bench", min(start + k, len(rows)), len(rows))
        task.partial(result)
    return result
