"""Forked batch runs: one primed prefix, k rows evaluated and generated together.

The prefix lives in the radix cache. Each row gets its own working sequence, forked from the
prefix's node with seq_cp, so the prefix cells are shared, not copied. The k suffixes go into one llama_decode
(several when they do not fit in n_batch: a row longer than n_batch is cut where a one-by-one
run would cut it, and see SMALL_UBATCH), and then every generation step decodes one token for
each unfinished row in a single batch.

Compared with the same rows run one by one warm (run_prompt, in the work context, whose cells
lie where a cold run puts them): the forked rows share one context, where llama.cpp's numerics
move with the cells' place (batch_policy.py, work_context.py), so their logits can differ in the
last bits. ``compare_with_sequential`` compares the greedy tokens and reports the max |Δlogit|
of the first generated token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..cache.radix_cache import RadixCache
from ..cache.radix_tree import RadixNode
from ..errors import KvPrimerError
from ..kv.sequence_ops import SequenceOps
from ..kv.sequence_tokens import SequenceTokens
from ..prompts.prompt_tokens import common_prefix
from ..llama.native import NativeContext, NativeModel, NativeSampler
from ..states.prefix_state import PrefixState
from ..llama.batch_feed import feed_groups, feed_step
from ..llama.batch_policy import SMALL_UBATCH, BatchPolicy
from .generation import GenerationConfig, TextStream
from ..prompts.prompt_segments import prompt_segments
from .prompt_runs import run_prompt
from ..task_state import TaskState
from ..prompts.template import Template

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
    """What a forked batch takes from the engine: the radix cache, the cache context and its
    sequences (their one owner and their tokens), the model and the batch policy."""
    cache: RadixCache
    ctx: NativeContext
    seqs: SequenceOps
    seq_tokens: SequenceTokens
    model: NativeModel
    batching: BatchPolicy

    @classmethod
    def of(cls, engine) -> "ForkParts":
        """The parts of a loaded engine (kv_engine.Engine)."""
        return cls(engine.cache, engine.ctx, engine.seqs, engine.seq_tokens, engine.model,
                   engine.batching)


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
    max_new = [max(1, min(gen.max_tokens, engine.ctx.n_ctx - r.prompt_tokens - 1)) for r in rows]
    need = len(prefix) + sum(r.evaluated_tokens + m for r, m in zip(rows, max_new))
    if need > engine.ctx.n_ctx:
        raise KvPrimerError(f"these {k} rows need up to {need} KV cells but the context has "
                            f"{engine.ctx.n_ctx}; run fewer rows per batch or raise the context size")
    marks = [[seg.start for seg in prompt_segments(engine.tokenize, template, v, toks)]
             for v, toks in zip(values, prompts)]
    return run_forked_rows(ForkParts.of(engine), ForkedRequest(prompts, marks, gen, exact),
                           node, rows, max_new, need, task)


def run_forked_rows(parts: ForkParts, req: ForkedRequest, node: RadixNode,
                    rows: list[ForkedRow], max_new: list[int], need: int,
                    task: TaskState) -> ForkedBatch:
    """Fork ``node`` into a working sequence per row, evaluate the suffixes together, generate
    together (``need``: the cells all of it takes at most)."""
    prefix, prompts, marks, gen = node.tokens(), req.prompts, req.marks, req.gen
    out = ForkedBatch(prefix_tokens=len(prefix), rows=rows)
    samplers = [NativeSampler(gen.temperature, gen.top_p, gen.seed) for _ in rows]
    cache = parts.cache
    try:
        with cache.busy(node):
            cache.ensure_free_cells(need - len(prefix))
            for r in rows:
                r.seq = cache.take_work_seq()
            prefix_seq = cache.materialise(node)
        t0 = time.perf_counter()
        for r in rows:
            parts.seqs.fork(prefix_seq, r.seq, upto=r.reused_tokens)
        t1 = time.perf_counter()
        out.fork_ms = (t1 - t0) * 1000
        first = _evaluate_suffixes(parts, rows, prompts, marks, samplers, task, out, req.exact)
        out.prompt_ms = (time.perf_counter() - t1) * 1000
        out.ttft_ms = (time.perf_counter() - t0) * 1000
        t2 = time.perf_counter()
        _generate(parts, rows, first, samplers, max_new, task, out)
        out.gen_ms = (time.perf_counter() - t2) * 1000
    finally:
        for s in samplers:
            s.close()
        for r in rows:
            if r.seq >= 0:
                cache.give_back(r.seq)
    return out


def _evaluate_suffixes(parts: ForkParts, rows, prompts, marks, samplers, task, out,
                       exact) -> list[int]:
    """Decode every row's suffix; return each row's first sampled token."""
    decodes = parts.batching.forked_decodes(
        [(r, r.reused_tokens, len(prompts[r.index]), marks[r.index]) for r in rows], exact)
    batches = [[e for piece in group for e in _entries(prompts, piece)] for group in decodes]
    first = [0] * len(rows)

    def sample(i: int) -> None:
        out.prompt_decodes += 1
        for k, (_t, _p, r, last) in enumerate(batches[i]):
            if last:
                r.first_logits = parts.ctx.logits(k)
                first[r.index] = samplers[r.index].sample(parts.ctx, k)

    feed_groups(parts.seqs.decode,
                [[(t, p, (r.seq,), last) for t, p, r, last in b] for b in batches],
                task=task, stage="fork", after=sample)
    return first


def _entries(prompts, piece):
    r, a, b = piece
    toks = prompts[r.index]
    return [(toks[i], i, r, i == len(toks) - 1) for i in range(a, b)]


def _generate(parts: ForkParts, rows, first, samplers, max_new, task, out) -> None:
    """Generation for k rows at once: one decode per step holds every unfinished row's token
    (the single-sequence loop is generation.generate; the text streams are shared)."""
    streams = [TextStream(parts.model) for _ in rows]
    pending = {r.index: first[r.index] for r in rows}
    while pending:
        step = []
        for idx, tok in list(pending.items()):
            r = rows[idx]
            r.tokens.append(tok)
            if not parts.model.is_eog(tok):
                streams[idx].add(tok)
            if parts.model.is_eog(tok) or len(r.tokens) >= max_new[idx]:
                del pending[idx]
            else:
                step.append(r)
        if not step:
            break
        # at most n_seq_max - 1 <= 63 tokens: the path a one-token decode takes (SMALL_UBATCH)
        task.check()
        feed_step(parts.seqs.decode,
                  [(pending[r.index], parts.seq_tokens.count(r.seq), r.seq) for r in step])
        out.gen_decodes += 1
        for i, r in enumerate(step):
            pending[r.index] = samplers[r.index].sample(parts.ctx, i)
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
