"""Time to first token against prefix length, cold and warm, with the suffix alone as the floor.

Qt-free; it runs as a worker job behind the Benchmark view. For each prefix length L (a share
of the template's static prefix, in tokens) and one row's suffix, on the paths runs take:
  warm  = a state of the first L prefix tokens set into the work context (work_context.py: its
          cells where a cold run puts them, as a run from a saved state takes it), then the
          suffix evaluated there in n_batch batches and the first token sampled;
  cold  = the L prefix tokens and the suffix from scratch in the cold reference context
          (cold_reference.py), replaying the warm run's batch starts: the run a warm run must
          match bit for bit;
  floor = the suffix alone from scratch in the cold reference context (what no cache can beat).
The prefix is evaluated once, in the work context, in n_batch batches that also end at every L,
so each L-token state is whole batches of one history. The radix cache is not touched. Cutting
tokens makes text no one would write, but the timings are the point.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..errors import KvPrimerError
from ..runs.generation import GenerationConfig
from ..runs.warm_runs import evaluate_and_generate
from ..prompts.prompt_tokens import common_prefix
from ..task_state import TaskState
from ..prompts.template import Template

SHARES = (0.125, 0.25, 0.5, 0.75, 1.0)
_FIRST_TOKEN = GenerationConfig(max_tokens=1)  # greedy: the time to the first token


@dataclass(frozen=True)
class SweepPoint:
    prefix_tokens: int
    suffix_tokens: int
    cold_ms: float
    warm_ms: float
    floor_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def prefix_sweep(engine, template: Template, values: dict[str, str], *,
                 shares: tuple[float, ...] = SHARES, task: TaskState | None = None) -> list[SweepPoint]:
    task = task or TaskState()
    if not engine.runs_in_work_context:
        raise KvPrimerError(f"{engine.info.name or 'this model'} runs in the cache's shared "
                            "context (sliding-window layers), not in a work "
                            "context: the prefix-length sweep times the work context only")
    tokens = engine.tokenize(template.fill(values))
    prefix = engine.tokenize(template.prefix_prompt())
    p = min(common_prefix(prefix, tokens), len(tokens) - 1)
    if p < 2:
        raise KvPrimerError("the template's static prefix is too short to sweep; "
                            "put more text before the first placeholder")
    suffix = tokens[p:]
    engine.check_fits(len(tokens))
    lengths = sorted({max(1, round(p * s)) for s in shares})
    slot = engine.work_slot
    # one evaluation of the prefix (untimed), its batches ending at every length
    slot.reset()
    plan = engine.batching.plain(0, p, lengths)
    # the cells, and on a hybrid or recurrent model the recurrent state at n (kept apart)
    states = slot.checkpoints(prefix[:p], plan, task, lengths)
    points = []
    task.begin_job("sweep", len(lengths), unit="prefix length")  # "prefix length 3 of 8"
    for k, n in enumerate(lengths):
        task.begin_item(k + 1, len(lengths))
        run = prefix[:n] + suffix
        cuts = [c for c in plan if c < n]
        slot.reset()  # as a run from a saved state finds it: nothing to keep
        t0 = time.perf_counter()
        cells, recurrent = states.pop(n)
        slot.restore(cells, run[:n], n, recurrent, cuts)
        warm = evaluate_and_generate(slot, engine.model, run, n, (), _FIRST_TOKEN, 1, task, t0,
                                     time.perf_counter(), 1)
        cold = engine.cold.run(run, warm.starts, _FIRST_TOKEN, 1, task, "cold", 1)
        floor = engine.cold.run(suffix, [], _FIRST_TOKEN, 1, task, "floor", 1)
        points.append(SweepPoint(n, len(suffix), cold.ttft_ms, warm.ttft_ms, floor.ttft_ms))
        task.end_item()
        task.partial(list(points))
    slot.reset()
    return points
