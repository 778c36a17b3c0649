"""Running a filled prompt cold and warm, and proving the two equivalent.

Cold: clear the sequence, evaluate every token. Warm: restore the prefix state, drop what of it
the prompt does not share, evaluate only the rest. Both then generate with the same sampler.

llama.cpp's logits depend on how tokens are grouped into batches, so the cold path starts a new
batch at the same token where the warm path starts evaluating: then cold and warm agree bit for
bit (max |Δlogit| = 0). A third, one-shot cold run (plain batches from token 0) is compared too
and reported apart, so the batch-grouping effect is visible for what it is, not a cache error.
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import KvPrimerError
from .kv_engine import Engine, common_prefix
from .native import NativeSampler
from .prefix_state import PrefixState
from .task_state import TaskState
from .template import Template


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class TextDelta:
    """Streamed through TaskState.partial while a path generates."""
    mode: str
    text: str


@dataclass
class PathResult:
    mode: str  # "cold", "warm" or "oneshot"
    reused_tokens: int
    evaluated_tokens: int
    restore_ms: float
    prompt_ms: float  # evaluating the prompt tokens
    ttft_ms: float  # restore + evaluation + first token sampled
    gen_ms: float
    tokens: list[int]
    text: str
    first_logits: np.ndarray = field(repr=False)

    @property
    def tokens_per_s(self) -> float:
        n = max(len(self.tokens) - 1, 0)  # the first token belongs to time-to-first-token
        return n / (self.gen_ms / 1000) if self.gen_ms > 0 else 0.0


@dataclass(frozen=True)
class Equivalence:
    tokens_equal: bool
    first_diff: int | None  # first generated position where cold and warm differ
    max_logit_diff: float  # at the first generated position
    oneshot_tokens_equal: bool | None = None
    oneshot_max_logit_diff: float | None = None

    @property
    def exact(self) -> bool:
        return self.tokens_equal and self.max_logit_diff == 0.0


@dataclass
class RunReport:
    prompt_tokens: int
    prefix_tokens: int  # tokens in the prefix state used (0 when none)
    reused_tokens: int
    evaluated_tokens: int
    tokenize_ms: float
    state_bytes: int
    cold: PathResult | None = None
    warm: PathResult | None = None
    oneshot: PathResult | None = None
    equivalence: Equivalence | None = None

    @property
    def speedup(self) -> float | None:
        if self.cold and self.warm and self.warm.ttft_ms > 0:
            return self.cold.ttft_ms / self.warm.ttft_ms
        return None


def compare(a: PathResult, b: PathResult) -> tuple[bool, int | None, float]:
    diff = float(np.max(np.abs(a.first_logits - b.first_logits)))
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
    if first is None and len(a.tokens) != len(b.tokens):
        first = min(len(a.tokens), len(b.tokens))
    return first is None, first, diff


def run_prompt(engine: Engine, template: Template, values: dict[str, str], *,
               state: PrefixState | None = None, cold: bool = True, warm: bool = True,
               oneshot: bool = True, gen: GenerationConfig = GenerationConfig(), seq: int = 0,
               task: TaskState | None = None) -> RunReport:
    """Run one filled prompt on the chosen paths; see the module docstring."""
    if not (cold or warm):
        raise KvPrimerError("choose cold, warm or both")
    task = task or TaskState()
    t0 = time.perf_counter()
    tokens = engine.tokenize(template.fill(values))
    tokenize_ms = (time.perf_counter() - t0) * 1000
    if not tokens:
        raise KvPrimerError("the filled prompt is empty; nothing to evaluate")
    engine.check_fits(len(tokens))
    def static() -> int:  # tokens the template's static prefix shares with this prompt
        return common_prefix(engine.tokenize(template.prefix_prompt()), tokens)

    if warm:
        if state is None:
            # A stored state is worth restoring only if it covers this template's static prefix.
            match = engine.store.longest_prefix(tokens)
            state = match.state if match and match.common_tokens >= static() else engine.prime(template, seq, task)
        engine.check_state(state)
        boundary = common_prefix(state.tokens, tokens)
    else:
        boundary = static()
    boundary = min(boundary, len(tokens) - 1)  # evaluate at least one token, for its logits
    report = RunReport(prompt_tokens=len(tokens), prefix_tokens=state.n_tokens if state else 0,
                       reused_tokens=boundary, evaluated_tokens=len(tokens) - boundary,
                       tokenize_ms=tokenize_ms, state_bytes=state.nbytes if state else 0)
    max_new = max(1, min(gen.max_tokens, engine.ctx.n_ctx - len(tokens) - 1))
    if warm:
        report.warm = _warm(engine, state, tokens, boundary, seq, gen, max_new, task)
        task.partial(report)
    if cold:
        report.cold = _cold(engine, tokens, boundary, seq, gen, max_new, task, "cold")
        task.partial(report)
    if oneshot:
        report.oneshot = _cold(engine, tokens, None, seq, gen, max_new, task, "oneshot")
    if cold and warm:
        eq, first, diff = compare(report.cold, report.warm)
        o_eq = o_diff = None
        if report.oneshot:
            o_eq, _, o_diff = compare(report.oneshot, report.warm)
        report.equivalence = Equivalence(eq, first, diff, o_eq, o_diff)
    task.partial(report)
    return report


def _cold(engine, tokens, boundary, seq, gen, max_new, task, mode) -> PathResult:
    engine.clear_seq(seq)
    t0 = time.perf_counter()
    logits = engine.evaluate(tokens, seq, task, stage=mode, split_at=boundary)
    prompt_s = time.perf_counter() - t0
    return _finish(engine, mode, 0, len(tokens), 0.0, prompt_s, t0, logits, seq, gen, max_new, task)


def _warm(engine, state, tokens, boundary, seq, gen, max_new, task) -> PathResult:
    engine.clear_seq(seq)
    t0 = time.perf_counter()
    restore_s = engine.restore(state, seq)
    engine.trim(seq, boundary)
    t1 = time.perf_counter()
    logits = engine.evaluate(tokens[boundary:], seq, task, stage="warm")
    prompt_s = time.perf_counter() - t1
    return _finish(engine, "warm", boundary, len(tokens) - boundary, restore_s, prompt_s, t0,
                   logits, seq, gen, max_new, task)


def _finish(engine, mode, reused, evaluated, restore_s, prompt_s, t0, logits, seq, gen, max_new,
            task) -> PathResult:
    out: list[int] = []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text: list[str] = []
    with NativeSampler(gen.temperature, gen.top_p, gen.seed) as sampler:
        tok = sampler.sample(engine.ctx)
        t_first = time.perf_counter()
        while True:
            out.append(tok)
            if engine.model.is_eog(tok):
                break
            piece = decoder.decode(engine.model.piece(tok, special=False))
            if piece:
                text.append(piece)
                task.partial(TextDelta(mode, piece))
            if len(out) >= max_new:
                break
            task.check(kept_tokens=len(engine.resident[seq]))
            engine.evaluate([tok], seq, stage="generate")
            tok = sampler.sample(engine.ctx)
    t_end = time.perf_counter()
    text.append(decoder.decode(b"", final=True))
    return PathResult(mode, reused, evaluated, restore_s * 1000, prompt_s * 1000,
                      (t_first - t0) * 1000, (t_end - t_first) * 1000, out, "".join(text), logits)
