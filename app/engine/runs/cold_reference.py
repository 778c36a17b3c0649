"""Cold runs from scratch: what a user without any cache would get.

The engine's main context holds the radix cache (many sequences, cells wherever llama.cpp put
them). A cold run there would land its cells after everyone else's and so not be a true cold
run. It runs in the work context instead (slot/work_context.py: the same model and parameters
as a context of its own would have), emptied first, so its cells start at cell 0 in position
order; the warm run it judges has finished there by then, and its result is captured. No third
context holds KV for the whole context size: the engine's peak memory is the cache's context,
the work context and the tiers. What the work context held is kept when the cold run computed
the same history (the usual case: a same-boundary cold run after its warm run leaves the cells
a warm run left); otherwise it is emptied, and the next run copies from the cache. Two kinds
of cold run:
- ``same_boundary``: the batch starts of the warm run's history replayed exactly (see
  batch_policy.py): the reference a warm run must match bit for bit;
- ``oneshot``: plain batches, as any llama.cpp program would evaluate the prompt, with its cells
  one cell further on (a padding cell of another sequence comes first). Its difference from the
  same-boundary run is the model's own numeric noise: what batch grouping and cell placement
  change in the arithmetic, both of which a cache could change without being wrong. It is run
  only to judge a warm run that differs from its same-boundary cold run, or when asked.

A cold run of an 8k-token prompt on a 1B model takes minutes, so what it gave is kept
(``KeptColdRuns``: its generated tokens and the logits the verdict compares, never KV; a byte
cap, least recently used first out) under a ``ColdKey`` holding everything that decides its
bits, and every later run, repeat or mode whose reference has the same key takes it from there.
Before an evaluation expected to take long (``estimate``: from this reference's own earlier
evaluations, else the kernel measurement's prefix, else the warm run's, scaled by the
attention's share of the work at that length: the model's shape says it, or its own runs of
other sizes where they show more) a ``ColdEstimate`` goes out as a partial result.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from ..progress_plan import work_units
from ..task_state import TaskState, duration_text
from ..llama.batch_feed import feed_batches, feed_token
from ..llama.batch_policy import shared_history
from ..llama.cpu_kernels import cpu_facts
from .generation import GenerationConfig, generate
from ..llama.native import ContextParams, NativeContext
from ..slot.work_context import STAGING, WorkContext
from ..states.prefix_state import PrimeTiming
from ..llama.thread_count import llama_default_threads
from ..llama.memory_budget import work_sequences
from ..llama.thread_fit import shared_fit

KEEP_BYTES = 64 * 2**20  # kept cold runs' logits and tokens, at most
LONG_COLD_S = 15.0  # a cold evaluation expected to take this long is announced first
_SAMPLES = 8  # own evaluations remembered for the estimate
OWN = "this engine's evaluations"  # an estimate's basis, and its samples' kind
FROM_STATE = "the saved state's prime"


@dataclass
class PathResult:
    mode: str  # "warm", "cold" or "oneshot"
    reused_tokens: int
    evaluated_tokens: int
    restore_ms: float  # finding, forking or restoring what is reused
    prompt_ms: float  # evaluating the prompt tokens
    ttft_ms: float  # restore + evaluation + first token sampled
    gen_ms: float
    tokens: list[int]
    text: str
    logits: list[np.ndarray] = field(repr=False)  # per generated position (the first few)
    starts: list[int] = field(default_factory=list, repr=False)  # batch starts evaluated

    @property
    def first_logits(self) -> np.ndarray:
        return self.logits[0]

    @property
    def tokens_per_s(self) -> float:
        n = max(len(self.tokens) - 1, 0)  # the first token belongs to time-to-first-token
        return n / (self.gen_ms / 1000) if self.gen_ms > 0 else 0.0

    @property
    def nbytes(self) -> int:
        """What keeping it costs: the logits, and the token ids as Python holds them."""
        return sum(a.nbytes for a in self.logits) + 32 * (len(self.tokens) + len(self.starts)) \
            + len(self.text)


@dataclass(frozen=True)
class ColdKey:
    """Everything that decides a cold run's bits: two runs with one key give the same tokens
    and logits, so a kept run stands in for a new one."""
    prompt: str  # sha256 of the prompt's token ids
    n_tokens: int
    starts: tuple[int, ...] | None  # the warm history's batch starts; None: plain batches
    model: str  # the model file's sha256
    context: ContextParams  # kernel (flash attention), KV types, n_batch/n_ubatch, n_ctx, threads
    gen_threads: int  # one-token decodes' threads, held for the run (ThreadFit.pinned)
    gen: GenerationConfig
    max_new: int
    keep_logits: int


@dataclass(frozen=True)
class ColdEstimate:
    """A partial result sent before a cold evaluation expected to take ``LONG_COLD_S`` or more."""
    mode: str  # "cold" or "oneshot"
    tokens: int
    seconds: float
    basis: str  # what the speed was measured on

    def text(self) -> str:
        what = "a cold run" if self.mode == "cold" else "a one-shot cold run (the noise floor)"
        return (f"verifying against {what} of {self.tokens:,} tokens: about "
                f"{duration_text(self.seconds)}")


def prompt_digest(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()


def generation_threads(params: ContextParams) -> int:
    """The threads a context of ``params`` runs one-token decodes on now (native.py's rule):
    a count set by the user, else the one ThreadFit holds for the run in progress."""
    if params.n_threads > 0:
        return min(params.n_threads_gen, params.n_threads) if params.n_threads_gen > 0 \
            else params.n_threads
    cap = llama_default_threads()
    if params.n_threads_gen > 0:
        return min(params.n_threads_gen, cap)
    return min(cap, shared_fit().generation_threads())


class KeptColdRuns:
    """Cold runs by key, least recently used first out once their bytes pass ``cap``."""

    def __init__(self, cap: int = KEEP_BYTES):
        self.cap = cap
        self._runs: OrderedDict[ColdKey, PathResult] = OrderedDict()
        self.nbytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, key: ColdKey) -> bool:
        """Kept (a plan asks, without counting a hit or refreshing it)."""
        return key in self._runs

    def get(self, key: ColdKey) -> PathResult | None:
        run = self._runs.get(key)
        if run is not None:
            self._runs.move_to_end(key)
            self.hits += 1
        return run

    def put(self, key: ColdKey, run: PathResult) -> None:
        if key in self._runs:
            self.nbytes -= self._runs.pop(key).nbytes
        if run.nbytes > self.cap:
            return
        while self._runs and self.nbytes + run.nbytes > self.cap:
            self.nbytes -= self._runs.popitem(last=False)[1].nbytes
        self._runs[key] = run
        self.nbytes += run.nbytes

    def clear(self) -> None:
        self._runs.clear()
        self.nbytes = 0


class ColdReference:
    """Cold runs in ``work`` (the engine's work context), and the runs kept by key."""

    def __init__(self, engine, work: WorkContext):
        self._engine = engine
        self._work = work
        self.kept = KeptColdRuns()
        self.evaluations = 0  # prompts evaluated here (kept runs served do not count)
        # (start, end, ms, basis) of evaluations from scratch: this engine's own, or a loaded
        # state's prime on this machine
        self._samples: list[tuple[int, int, float, str]] = []

    def close(self) -> None:
        self.kept.clear()

    def _params(self) -> ContextParams:
        # the work context's own (two sequences at least: the noise run's padding cell), so a
        # cold run does not reopen it
        return self._engine.context_params(work_sequences(self._engine.stateful))

    @property
    def context(self) -> NativeContext:
        """The context cold runs evaluate in: the work context's (opened on first use)."""
        return self._work.ctx

    # ---- kept runs
    def key(self, tokens, marks, gen: GenerationConfig, max_new: int, keep_logits: int,
            gen_threads: int | None = None) -> ColdKey:
        """The key of the cold run ``run(tokens, marks, …)`` would make now (``gen_threads``:
        the count a run held, for a verification made later)."""
        params = self._params()
        starts = None if marks is None else tuple(self._engine.batching.replay(len(tokens), marks))
        return ColdKey(prompt_digest(tokens), len(tokens), starts, self._engine.info.sha256,
                       params, gen_threads or generation_threads(params), gen, max_new,
                       keep_logits)

    def reference(self, key: ColdKey, tokens, marks, gen: GenerationConfig, max_new: int,
                  task: TaskState | None, mode: str, keep_logits: int,
                  warm: PathResult | None = None) -> tuple[PathResult, bool]:
        """The cold run of ``key``: kept (True) or evaluated now and kept. Before an evaluation
        expected to take long its estimate goes out through ``task`` (``warm``: the run it
        verifies, one more speed to go on)."""
        run = self.kept.get(key)
        if run is not None:
            return (run if run.mode == mode else replace(run, mode=mode)), True
        task = task or TaskState()
        est = self.estimate(len(tokens), mode, warm)
        if est is not None and est.seconds >= LONG_COLD_S:
            task.partial(est)
        run = self.run(tokens, marks, gen, max_new, task, mode, keep_logits)
        self.kept.put(key, run)
        return run, False

    # ---- how long an evaluation will take
    def note_evaluation(self, start: int, end: int, ms: float, basis: str = OWN) -> None:
        """Positions start..end-1 evaluated from scratch in ``ms`` in this engine (a cold run
        here, or a prime): a sample for ``estimate``."""
        if end > start:
            self._samples = (self._samples + [(start, end, ms, basis)])[-_SAMPLES:]

    def machine(self) -> str:
        """What a timing depends on besides the tokens: the CPU, its cores, the batch threads
        and size, the attention kernel (a saved state's ``PrimeTiming.machine``)."""
        p = self._params()
        fa = {True: "on", False: "off", None: "auto"}[p.flash_attn]
        return (f"{cpu_facts().model}; {os.cpu_count()} cores; batch threads "
                f"{p.n_threads or 'auto'}; n_batch {p.n_batch}; flash attention {fa}")

    def prime_timing(self, n_tokens: int) -> PrimeTiming | None:
        """The latest of this engine's own evaluations that ended at ``n_tokens`` (a prime of
        that prefix), as a saved state keeps it."""
        for start, end, ms, basis in reversed(self._samples):
            if end == n_tokens and basis == OWN:
                return PrimeTiming(start, end, ms, self.machine())
        return None

    def take_timing(self, timing: PrimeTiming | None) -> bool:
        """A loaded state's prime as a sample, when it was timed on this machine as this
        engine runs (another CPU, thread count or kernel: not a basis); True if taken."""
        if timing is None or timing.machine != self.machine():
            return False
        sample = (timing.start, timing.end, timing.ms, FROM_STATE)
        if sample not in self._samples:  # the same file loaded again adds nothing
            self.note_evaluation(*sample)
        return True

    def estimate(self, n_tokens: int, mode: str = "cold",
                 warm: PathResult | None = None) -> ColdEstimate | None:
        """How long evaluating ``n_tokens`` from scratch will take, from the nearest in size of
        this engine's own evaluations (its cold runs and primes), else the kernel measurement's
        prefix (full batches from 0), else the warm run's suffix (None: nothing measured yet).
        Attention makes a token at position p cost more than one at 0: the measured time is
        scaled by ``work_units``, the attention's share taken from the model's shape (its FLOPs
        per position against the weights')."""
        k = self._attention_share()
        gen_ms = warm.gen_ms if warm is not None else 0.0
        if self._samples:
            s, e, ms, basis = min(self._samples,
                                  key=lambda x: abs(np.log(x[1] / max(n_tokens, 1))))
        elif (prefix := self._kernel_prefix()) is not None:
            # full batches from position 0, as a cold run evaluates. After `run --state` alone
            # (scale section's shapes, 2k-8k) this said 0.68-1.05x the cold run's time; the warm
            # run's few suffix tokens, a small batch at the prefix's depth, said 1.25-2.8x
            s, e, ms = 0, *prefix
            basis = "the kernel measurement"
        elif warm is not None and warm.evaluated_tokens > 1 and warm.prompt_ms > 0:
            s, ms = warm.reused_tokens, warm.prompt_ms
            e = s + warm.evaluated_tokens
            basis = "the warm run"
        else:
            return None
        seconds = (ms * work_units(0, n_tokens, k) / work_units(s, e, k) + gen_ms) / 1000
        return ColdEstimate(mode, n_tokens, seconds, basis)

    def _kernel_prefix(self) -> tuple[int, float] | None:
        """(tokens, ms) of the kernel measurement's prefix for the kernel in use, or None."""
        kernels = self._engine.kernels
        t = kernels.timing if kernels is not None else None
        if t is None or t.prefix_tokens <= 0 or t.prefix_ms_per_token <= 0:
            return None
        return t.prefix_tokens, t.prefix_ms_per_token * t.prefix_tokens

    def _attention_share(self) -> float:
        """``work_units``' k: from the model's shape (attention FLOPs per position over the
        weights' per token), or more where this reference's own evaluations of sizes at least
        2x apart show attention costing more than its FLOPs say (t/n = a + b·n: k = 2b/a)."""
        info = self._engine.info
        layers = info.traits.attention_layers
        layers = info.n_layer if layers is None else layers
        k = 2 * layers * info.n_embd / max(info.n_params, 1)
        n = np.array([e - s for s, e, _ms, _b in self._samples if s == 0], dtype=np.float64)
        if len(n) < 2 or n.max() < 2 * n.min():
            return k
        per = np.array([ms for s, _e, ms, _b in self._samples if s == 0]) / n
        b, a = np.polyfit(n, per, 1)
        return min(max(k, 2 * b / a), 20 * k) if a > 0 else k  # a noisy fit stays bounded

    # ---- evaluating
    def run(self, tokens: list[int], marks: list[int] | None, gen: GenerationConfig,
            max_new: int, task: TaskState | None, mode: str, keep_logits: int) -> PathResult:
        """Evaluate ``tokens`` from scratch with batches starting at ``marks`` (None: plain
        n_batch batches, one cell further on), then generate."""
        task = task or TaskState()
        work = self._work
        if work.params != self._params():  # another kernel or setting: not the key's bits
            work.reopen(self._params())
        held = (work.tokens, work.cuts, work.composed_from, work.snapshots)
        work.reset()
        ctx = work.ctx
        starts = self._engine.batching.replay(len(tokens), marks)
        kept = False
        try:
            if marks is None:  # the noise run: another sequence's cell first moves every cell
                # by one, so these cells are no history the work context can keep
                feed_batches(ctx.decode, tokens[:1], 0, [0], seq=STAGING, want_logits=False)
                t0 = time.perf_counter()
                feed_batches(ctx.decode, tokens, 0, starts, task=task, stage=mode)
                pos = [len(tokens)]

                def step(tok: int) -> None:
                    feed_token(ctx.decode, tok, pos[0])
                    pos[0] += 1
            else:
                t0 = time.perf_counter()
                work.evaluate(tokens, starts, task, stage=mode)
                step = work.step
            prompt_s = time.perf_counter() - t0
            self.evaluations += 1
            self.note_evaluation(0, len(tokens), prompt_s * 1000)
            g = generate(ctx, self._engine.model, step, gen, max_new, task, mode, keep_logits)
            kept = marks is not None and self._same_history(*held)
        finally:
            if kept:  # the cells of the history it held, computed again: keep holding them
                work.snapshots = held[3]
            else:
                work.reset()
        return PathResult(mode, 0, len(tokens), 0.0, prompt_s * 1000, (g.t_first - t0) * 1000,
                          (g.t_end - g.t_first) * 1000, g.tokens, g.text, g.logits, starts)

    def _same_history(self, tokens: list[int], cuts: list[int], composed_from: int | None,
                      _snapshots) -> bool:
        """Does the work context now hold the history it held before the cold run (tokens and
        batches: cells computed alike), none of it composed?"""
        work = self._work
        n = len(work.tokens)
        return (composed_from is None and len(tokens) == n
                and shared_history(tokens, cuts, work.tokens, work.cuts, n,
                                   work.grouping_exact()) == n)
