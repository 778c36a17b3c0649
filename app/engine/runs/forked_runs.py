"""Forked batch runs: one primed prefix, k rows evaluated and generated together.

The prefix lives in the radix cache. The rows run in a slot of k sequences
(slot/forked_rows.py): each row gets its own working sequence, forked from the prefix's node
with seq_cp, so the prefix cells are shared, not copied. The k suffixes go into one
llama_decode (several when they do not fit in n_batch: a row longer than n_batch is cut where a
one-by-one run would cut it, and see SMALL_UBATCH), and then every generation step decodes one
token for each unfinished row in a single batch.

Compared with the same rows run one by one warm (run_prompt, in the work context, whose cells
lie where a cold run puts them): the forked rows share one context, where llama.cpp's numerics
move with the cells' place (batch_policy.py, work_context.py), so their logits can differ in the
last bits. ``compare_with_sequential`` compares the greedy tokens and reports the max |Δlogit|
of the first generated token.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from ..cache.radix_tree import RadixNode
from ..errors import KvPrimerError
from ..llama.batch_policy import SMALL_UBATCH
from ..llama.native import NativeModel, NativeSampler
from ..prompts.prompt_segments import prompt_segments
from ..prompts.prompt_tokens import common_prefix
from ..prompts.template import Template
from ..slot.forked_rows import ForkedRows
from ..states.prefix_state import PrefixState
from ..task_state import TaskState
from .generation import GenerationConfig, TextStream
from .prompt_runs import run_prompt

__all__ = ["SMALL_UBATCH", "ForkComparison", "ForkedBatch", "ForkedRow", "compare_with_sequential",
           "run_forked"]


@dataclass
class ForkedRow:
    index: int  # position in the values list given
    seq: int
    prompt_tokens: int
    reused_tokens: int
    evaluated_tokens: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    first_logits: np.ndarray | None = field(default=None, repr=False)


@dataclass
class ForkedBatch:
    prefix_tokens: int
    rows: list[ForkedRow]
    fork_ms: float = 0.0  # seq_cp + trim for every row
    prompt_ms: float = 0.0  # evaluating all suffixes
    ttft_ms: float = 0.0  # fork + suffixes + first token of every row
    gen_ms: float = 0.0  # the remaining tokens of every row
    prompt_decodes: int = 0  # llama_decode calls for the suffixes (1 when they fit n_batch)
    gen_decodes: int = 0

    @property
    def total_ms(self) -> float:
        return self.ttft_ms + self.gen_ms

    @property
    def evaluated_tokens(self) -> int:
        return sum(r.evaluated_tokens for r in self.rows)

    @property
    def generated_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)


@dataclass(frozen=True)
class ForkParts:
    """What a forked batch takes from the engine: the model, and the slot its rows run in
    (slot/forked_rows.py: ``rows(node, k, cells)`` lends k sequences beside ``node``)."""
    model: NativeModel
    rows: Callable[[RadixNode, int, int], AbstractContextManager[ForkedRows]]

    @classmethod
    def of(cls, engine) -> "ForkParts":
        """The parts of a loaded engine (kv_engine.Engine)."""
        return cls(engine.model, engine.forked_rows)


@dataclass(frozen=True)
class ForkedRequest:
    """The rows of one forked batch, tokenized, beside the prefix node they fork from."""
    prompts: list[list[int]]  # each row's filled prompt, in tokens
    marks: list[list[int]]  # each row's segment starts (batches cut there as a run's would)
    gen: GenerationConfig
    exact: bool  # False: suffixes in as few decodes as n_batch allows (see run_forked)


@dataclass(frozen=True)
class ForkComparison:
    row: int
    tokens_equal: bool
    max_logit_diff: float
    forked_tokens: tuple[int, ...]
    sequential_tokens: tuple[int, ...]
    sequential_ms: float  # the one-by-one warm run: restore + suffix + generation


def run_forked(engine, template: Template, values: list[dict[str, str]], *,
               state: PrefixState | None = None, gen: GenerationConfig = GenerationConfig(),
               task: TaskState | None = None, exact: bool = True) -> ForkedBatch:
    """Run ``values`` (k rows) as one forked batch; see the module docstring.

    ``exact=False`` puts all suffixes in as few decodes as n_batch allows, even where that moves
    tokens across SMALL_UBATCH (faster for short suffixes; logits then differ slightly).
    """
    task = task or TaskState()
    engine.refuse_stateful("a forked batch", "hold one state per sequence: rows forked from "
                           "one prefix would share it in the cache's cells")
    k = len(values)
    if k == 0:
        raise KvPrimerError("no rows to run")
    cap = engine.config.n_seq_max // 2
    if k > cap:
        raise KvPrimerError(f"{k} rows need {k} working sequences beside the cache's; run at "
                            f"most {cap} rows per forked batch")
    prompts = [engine.tokenize(template.fill(v)) for v in values]
    for i, toks in enumerate(prompts):
        if not toks:
            raise KvPrimerError(f"row {i + 1}: the filled prompt is empty; nothing to evaluate")
        engine.check_fits(len(toks))
    node = (engine.prime_node(template, task) if state is None
            else engine.adopt(state))
    prefix = node.tokens()
    rows = []
    for i, toks in enumerate(prompts):
        b = min(common_prefix(prefix, toks), len(toks) - 1)
        rows.append(ForkedRow(i, -1, len(toks), b, len(toks) - b))
    max_new = [gen.max_new(r.prompt_tokens, engine.n_ctx) for r in rows]
    need = len(prefix) + sum(r.evaluated_tokens + m for r, m in zip(rows, max_new))
    if need > engine.n_ctx:
        raise KvPrimerError(f"these {k} rows need up to {need} KV cells but the context has "
                            f"{engine.n_ctx}; run fewer rows per batch or raise the context size")
    marks = [[seg.start for seg in prompt_segments(engine.tokenize, template, v, toks)]
             for v, toks in zip(values, prompts)]
    return run_forked_rows(ForkParts.of(engine), ForkedRequest(prompts, marks, gen, exact),
                           node, rows, max_new, need, task)


def run_forked_rows(parts: ForkParts, req: ForkedRequest, node: RadixNode,
                    rows: list[ForkedRow], max_new: list[int], need: int,
                    task: TaskState) -> ForkedBatch:
    """Fork ``node`` into a working sequence per row, evaluate the suffixes together, generate
    together (``need``: the cells all of it takes at most)."""
    prefix, gen = node.tokens(), req.gen
    out = ForkedBatch(prefix_tokens=len(prefix), rows=rows)
    samplers = [NativeSampler(gen.temperature, gen.top_p, gen.seed) for _ in rows]
    try:
        with parts.rows(node, len(rows), need - len(prefix)) as slot:
            for r in rows:
                r.seq = slot.seq(r.index)
            t0 = time.perf_counter()
            slot.fork([r.reused_tokens for r in rows])
            t1 = time.perf_counter()
            out.fork_ms = (t1 - t0) * 1000
            first = _evaluate_suffixes(slot, rows, req, samplers, task, out)
            out.prompt_ms = (time.perf_counter() - t1) * 1000
            out.ttft_ms = (time.perf_counter() - t0) * 1000
            t2 = time.perf_counter()
            _generate(slot, parts.model, rows, first, samplers, max_new, task, out)
            out.gen_ms = (time.perf_counter() - t2) * 1000
    finally:
        for s in samplers:
            s.close()
    return out


def _evaluate_suffixes(slot: ForkedRows, rows, req: ForkedRequest, samplers, task,
                       out) -> list[int]:
    """Evaluate every row's suffix in the slot; return each row's first sampled token."""
    first = [0] * len(rows)

    def at_last(row: int, i: int) -> None:
        rows[row].first_logits = slot.ctx.logits(i)
        first[row] = samplers[row].sample(slot.ctx, i)

    out.prompt_decodes += slot.evaluate(req.prompts, [r.reused_tokens for r in rows], req.marks,
                                        exact=req.exact, task=task, at_last=at_last)
    return first


def _generate(slot: ForkedRows, model, rows, first, samplers, max_new, task, out) -> None:
    """Generation for k rows at once: one decode per step holds every unfinished row's token
    (the single-sequence loop is generation.generate; the text streams are shared)."""
    streams = [TextStream(model) for _ in rows]
    pending = {r.index: first[r.index] for r in rows}
    while pending:
        step = []
        for idx, tok in list(pending.items()):
            r = rows[idx]
            r.tokens.append(tok)
            if not model.is_eog(tok):
                streams[idx].add(tok)
            if model.is_eog(tok) or len(r.tokens) >= max_new[idx]:
                del pending[idx]
            else:
                step.append(r)
        if not step:
            break
        # at most n_seq_max - 1 <= 63 tokens: the path a one-token decode takes (SMALL_UBATCH)
        task.check()
        slot.step([(r.index, pending[r.index]) for r in step])
        out.gen_decodes += 1
        for i, r in enumerate(step):
            pending[r.index] = samplers[r.index].sample(slot.ctx, i)
    for r, stream in zip(rows, streams):
        r.text = stream.text()


def compare_with_sequential(engine, template: Template, values: list[dict[str, str]],
                            batch: ForkedBatch, state: PrefixState | None,
                            gen: GenerationConfig = GenerationConfig(),
                            task: TaskState | None = None) -> list[ForkComparison]:
    """Run the same rows one by one warm (fork the prefix, suffix, generate) and compare."""
    out = []
    for r in batch.rows:
        rep = run_prompt(engine, template, values[r.index], reuse="prefix", state=state,
                         cold=False, oneshot=False, keep=False, gen=gen, task=task)
        w = rep.warm
        ms = w.ttft_ms + w.gen_ms  # restore + suffix + every token, as ForkedBatch.total_ms
        diff = float(np.max(np.abs(w.first_logits - r.first_logits)))
        out.append(ForkComparison(r.index, list(w.tokens) == r.tokens, diff, tuple(r.tokens),
                                  tuple(w.tokens), ms))
    return out
