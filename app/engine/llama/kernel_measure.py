"""Timing the attention kernels on a model, in steps that can stop and resume, until the figures
are stable, and noting how busy the machine was meanwhile; the passes sized to the model's speed
so that a measurement takes a few seconds whatever the model.

**Sized to the model.** The first step is a pilot: a 32-token batch timed in a small context
of its own (after 8 untimed tokens that page the weights in). Its time per token sizes the
passes (kernel_passes.py): on a small model the full plan (a 1,024-token prefix, a 64-token
suffix, 3 to 8 rounds, the probe below), on a larger one a shorter prefix, suffix and fewer
rounds, then no probe, so that the planned work stays within a few seconds; a model too slow
even for the leanest plan is not timed at all (``Measured.skipped``: the safe default stays). A
shorter prefix samples attention at a shallower depth, where the kernels differ less: what that
risks is the choice's speed, never exactness (no probe: not grouping-exact).

For each kernel (flash attention off and on) a small context of its own evaluates the prefix in
n_batch batches and saves the sequence's state. Then, round after round, each kernel times a
suffix in the two batch plans warm runs use: one batch (prefix mode) and one batch per segment
(chain mode, ``SPLIT`` batches). Before every timing the prefix is put back from the saved
state (``state_set``): trimming the suffix with ``seq_rm`` fails on recurrent and hybrid models,
whose state cannot be cut back (llama.cpp returns false and the next decode fails).

Kernels and plans alternate within a round, and the order turns round by round, so that a load
that comes and goes weighs on every series alike. After ``MIN_ROUNDS`` the measurement stops as
soon as every series' relative spread is under ``SPREAD_OK`` or the winner cannot be in doubt
(its slowest quartile beats the other's fastest), and after the plan's rounds (at most
``MAX_ROUNDS``) in any case, saying that the figures did not settle. Other processes' CPU use
over the timed spans is recorded (machine_load.py); a busy machine or unsettled figures make the
result provisional, and a busy machine also ends it at ``MIN_ROUNDS`` (more rounds would not
make it trusted).

**The batch-grouping probe.** After the first round each kernel evaluates a suffix of
``PROBE_SUFFIX`` tokens (fewer only where n_batch or half the context is smaller) untimed in one batch and in uneven batches (two tokens, then three of different
sizes: residues a kernel could tile by), and compares the sequence's cells and last logits bit
for bit. Equal means the kernel computes each cell alike however the tokens are grouped into
batches (``grouping_exact``): chain mode then needs no batch of its own per segment
(prompt_runs.py). Flash attention's tiled path for 64+ tokens is one way to fail it; CPU
repacked weights that multiply rows in fours could be another; the probe measures rather than
assumes. Its suffix is never shortened to fit the budget: a plan that cannot afford it leaves
the probe out, and a kernel not probed counts as not grouping-exact (the safe side).

Every step is short (the pilot, one batch of the prefix, one timed suffix or one probe), so a
job that runs the measurement between the user's jobs can stop between any two steps and resume
later where it stopped: ``run(task)`` raises nothing on cancel, it just returns.
"""
from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Callable

from .batch_feed import feed_batches
from .kernel_passes import (BUDGET_S, CALIBRATION_PREFIX, CALIBRATION_SUFFIX, MAX_ROUNDS, MIN_ROUNDS,
                            PILOT_TOKENS, PILOT_WARMUP, PROBE_SUFFIX, Passes, plan_passes,
                            probe_sizes, quartiles, relative_spread)
from .machine_load import LoadMeter, MachineLoad
from .native import ContextParams, NativeContext, NativeModel

SPLIT = 4  # batches the same suffix is cut into, as a chain run cuts it at segments
SPREAD_OK = 0.10  # (p75 - p25) / median of a series' repeats under which it counts as stable
PLANS = ("one", "split")

# tests: called before every step with (measurement, task); may wait (checking task.cancelled)
before_step: Callable | None = None


@dataclass(frozen=True)
class KernelTiming:
    flash_attn: bool
    prefix_ms_per_token: float  # evaluating the prefix in n_batch batches
    suffix_ms: float  # CALIBRATION_SUFFIX tokens after the prefix in one batch (median)
    split_suffix_ms: float = 0.0  # the same tokens in SPLIT batches, one per segment (median)
    suffix_tokens: int = CALIBRATION_SUFFIX
    suffix_spread: float = 0.0  # relative spread of the one-batch repeats
    split_spread: float = 0.0  # relative spread of the split repeats
    repeats: int = 1
    # the same cells and logits however the suffix is cut into batches (None: not probed)
    grouping_exact: bool | None = None
    prefix_tokens: int = CALIBRATION_PREFIX  # the depth the suffix was timed at

    @property
    def spread(self) -> float:
        return max(self.suffix_spread, self.split_spread)

    def describe(self) -> str:
        grouping = {True: "; cells alike in any batches", False: "; batch grouping changes "
                    "the bits", None: "; batch grouping not probed"}[self.grouping_exact]
        return (f"flash attention {'on' if self.flash_attn else 'off'}: a "
                f"{self.suffix_tokens}-token suffix after {self.prefix_tokens:,} tokens "
                f"{self.suffix_ms:.0f} ms in one batch, "
                f"{self.split_suffix_ms:.0f} ms in {SPLIT} (±{self.spread:.0%} over "
                f"{self.repeats}); prefix {self.prefix_ms_per_token:.2f} ms/token{grouping}")


@dataclass(frozen=True)
class Measured:
    """What a finished measurement found."""
    timings: tuple[KernelTiming, ...]
    load: MachineLoad
    settled: bool  # the figures met the spread test (or the winner was never in doubt)
    rounds: int
    cost_ms: float  # wall time of the timed work (pauses for the user's jobs not counted)
    at: float  # time.time() when it finished
    skipped: str = ""  # nothing timed: why (Passes.skipped); timings are then empty

    @property
    def provisional(self) -> bool:
        """Made on a busy machine or with figures that did not settle: not to be kept forever.
        (A pilot too slow to time anything is provisional only when the machine was busy.)"""
        return self.load.busy or (not self.settled and not self.skipped)

    def why_provisional(self) -> str:
        why = []
        if self.load.busy:
            why.append(f"the machine was busy: {self.load.describe()}")
        if not self.settled and not self.skipped:
            why.append(f"the figures still spread over {max(t.spread for t in self.timings):.0%} "
                       f"after {self.rounds} rounds")
        return " and ".join(why)


def fingerprint(ctx: NativeContext) -> bytes:
    """The sequence's cells (its whole state) and the last logits, hashed: equal bits or not."""
    h = hashlib.sha256(ctx.state_get(0))
    h.update(ctx.logits(-1).tobytes())
    return h.digest()


@dataclass(frozen=True)
class MeasureProgress:
    done: int  # steps done
    total: int  # steps planned (grows when the figures need more rounds)
    eta_s: float | None


class KernelMeasurement:
    """One measurement of ``kernels`` on ``model`` with ``params``, run in steps.

    ``weights`` (one batch, split) weigh the plans when deciding whether the winner is in doubt.
    ``ms_per_token`` sizes the passes without a pilot (a speed already known, or tests);
    ``budget_ms`` bounds their planned work; ``load_meter`` and ``clock`` can be injected."""

    def __init__(self, model: NativeModel, params: ContextParams,
                 kernels: tuple[bool, ...] = (False, True), weights=(0.25, 0.75),
                 load_meter: LoadMeter | None = None, clock=time.perf_counter,
                 ms_per_token: float | None = None, budget_ms: float = BUDGET_S * 1000):
        self.model, self.params, self.kernels, self.weights = model, params, kernels, weights
        self.budget_ms = budget_ms
        self.meter = load_meter or LoadMeter()
        self.clock = clock
        self.passes: Passes | None = None  # set by the pilot
        self.piloted = ms_per_token is None  # the first step times a pilot batch
        self._ctx: dict[bool, NativeContext] = {}
        self._prefix_state: dict[bool, bytes] = {}
        self._prefix_ms: dict[bool, float] = {}
        self._prefix_done: dict[bool, int] = {}  # tokens of the prefix evaluated so far
        self._prefix_t: dict[bool, float] = {}  # seconds spent on them
        self.samples: dict[tuple[bool, str], list[float]] = {(k, p): [] for k in kernels for p in PLANS}
        self.round = 0  # rounds finished
        self._queue: list[tuple[bool, str]] = []  # this round's timings still to take
        self._sample_s: list[float] = []
        self._one_print: dict[bool, bytes] = {}  # fingerprint of the first one-batch suffix
        self.grouping_exact: dict[bool, bool] = {}  # the probe's verdict per kernel
        self.result: Measured | None = None
        if ms_per_token is not None:
            self._size(ms_per_token)

    def _size(self, ms_per_token: float) -> None:
        """Size the passes from a time per token (``plan_passes``)."""
        p = self.passes = plan_passes(ms_per_token, self.params.n_ctx, self.params.n_batch,
                                      self.budget_ms)
        self.n_prefix, self.n_suffix, self.n_probe = p.n_prefix, p.n_suffix, p.n_probe
        # any ids will do for timing; spread over the vocabulary, never the same twice in a row
        n = self.n_prefix + max(self.n_suffix, self.n_probe)
        self.tokens = [(7919 * i + 13) % self.model.n_vocab for i in range(n)]
        step = max(1, self.n_suffix // SPLIT)
        self.plans = {"one": (self.n_suffix,),
                      "split": tuple(min(step, self.n_suffix - a) for a in range(0, self.n_suffix, step))}
        if p.skipped:
            self._finish()

    # ---- progress
    @property
    def finished(self) -> bool:
        return self.result is not None

    def progress(self) -> MeasureProgress:
        pilot = 1 if self.piloted else 0
        if self.passes is None:  # the pilot comes first: nothing to go on yet
            return MeasureProgress(0, pilot, None)
        per_round = len(self.kernels) * len(PLANS)
        batches = -(-self.n_prefix // self._batch)
        prefix_total = batches * len(self.kernels)
        prefix_done = sum(-(-n // self._batch) for n in self._prefix_done.values())
        rounds = max(MIN_ROUNDS, self.round + (0 if self.finished else 1))
        probes = len(self.kernels) if self.n_probe else 0
        done = (pilot + prefix_done + self.round * per_round + len(self.grouping_exact)
                + (per_round - len(self._queue) if self._queue else 0))
        total = pilot + prefix_total + rounds * per_round + probes
        if self.finished:
            return MeasureProgress(total, total, 0.0)
        # what is left, at the speeds seen so far (a suffix timing costs about its suffix's
        # share of a prefix batch before any was taken)
        per_token = (sum(self._prefix_t.values()) / max(1, sum(self._prefix_done.values()))
                     if self._prefix_done else self.passes.ms_per_token / 1000)
        left_prefix = sum(self.n_prefix - self._prefix_done.get(k, 0) for k in self.kernels)
        per_sample = (statistics.median(self._sample_s) if self._sample_s
                      else per_token * self.n_suffix * 1.5)
        restore = 1.2  # putting the prefix back before each timing costs a little too
        eta = (left_prefix * per_token
               + (total - done - (prefix_total - prefix_done)) * per_sample * restore)
        return MeasureProgress(done, total, eta)

    @property
    def _batch(self) -> int:
        return max(1, min(self.params.n_batch, len(self.tokens) + 1))

    # ---- running
    def run(self, check: Callable[[], bool] = lambda: False,
            on_step: Callable[[MeasureProgress], None] | None = None, task=None) -> bool:
        """Take steps until the measurement is finished (True) or ``check()`` says stop (False)."""
        while not self.finished:
            if before_step is not None:
                before_step(self, task)
            if check():
                return False
            self.step()
            if on_step is not None:
                on_step(self.progress())
        return True

    def step(self) -> None:
        """One short piece of work: the pilot, a batch of a kernel's prefix, one timed suffix,
        or one probe."""
        if self.passes is None:
            return self._pilot()
        for k in self.kernels:
            if k not in self._prefix_state:
                return self._prefix_batch(k)
        if not self._queue and self.round >= 1 and self.n_probe:
            for k in self.kernels:
                if k not in self.grouping_exact:
                    return self._probe_grouping(k)
        if not self._queue:
            self._queue = self._round_order(self.round)
        kernel, plan = self._queue[0]
        self._time_suffix(kernel, plan)
        self._queue.pop(0)
        if not self._queue:
            self.round += 1
            # on a busy machine more rounds cannot make it trusted: stop at the minimum
            if self._settled() or self.round >= self.passes.max_rounds \
                    or (self.round >= MIN_ROUNDS and self.meter.result().busy):
                self._finish()

    def _pilot(self) -> None:
        """Time one batch of ``PILOT_TOKENS`` on the first kernel, in a small context of its own
        (closed after), and size the passes by it."""
        n = min(PILOT_TOKENS, self.params.n_batch)
        warm = min(PILOT_WARMUP, self.params.n_batch)
        ids = [(7919 * i + 13) % self.model.n_vocab for i in range(warm + n)]
        ctx = NativeContext(self.model, replace(self.params, n_ctx=warm + n + 1, n_seq_max=1,
                                                flash_attn=self.kernels[0]))
        try:
            # the first decode pages the weights in and allocates the graph: not timed
            feed_batches(ctx.decode, ids[:warm], 0, [0], want_logits=False)
            with self.meter:
                t0 = self.clock()
                feed_batches(ctx.decode, ids[warm:], warm, [warm], want_logits=False)
                dt = self.clock() - t0
        finally:
            ctx.close()
        self._size(dt * 1000 / n)

    def _round_order(self, r: int) -> list[tuple[bool, str]]:
        # turn the order round by round: no kernel or plan always goes first
        ks = self.kernels[r % len(self.kernels):] + self.kernels[:r % len(self.kernels)]
        ps = PLANS if (r // len(self.kernels)) % 2 == 0 else PLANS[::-1]
        return [(k, p) for k in ks for p in ps]

    def _context(self, kernel: bool) -> NativeContext:
        if kernel not in self._ctx:
            self._ctx[kernel] = NativeContext(self.model, replace(
                self.params, n_ctx=len(self.tokens) + 1, n_seq_max=1, flash_attn=kernel))
        return self._ctx[kernel]

    def _prefix_batch(self, kernel: bool) -> None:
        ctx = self._context(kernel)
        a = self._prefix_done.get(kernel, 0)
        b = min(a + self._batch, self.n_prefix)
        with self.meter:
            t0 = self.clock()
            feed_batches(ctx.decode, self.tokens[a:b], a, [a], want_logits=False)
            self._prefix_t[kernel] = self._prefix_t.get(kernel, 0.0) + self.clock() - t0
        self._prefix_done[kernel] = b
        if b == self.n_prefix:
            self._prefix_ms[kernel] = self._prefix_t[kernel] * 1000 / self.n_prefix
            self._prefix_state[kernel] = ctx.state_get(0)

    def _restored(self, kernel: bool) -> NativeContext:
        """The kernel's context holding the prefix again, put back from its state: works on
        every model family (see the docstring)."""
        ctx = self._context(kernel)
        ctx.seq_rm(0)
        if not ctx.state_set(self._prefix_state[kernel], 0):
            from ..errors import ModelError

            raise ModelError("llama.cpp could not restore the timing prefix while measuring the "
                             "attention kernels; set flash attention on or off instead of auto")
        return ctx

    def _feed_suffix(self, ctx: NativeContext, sizes: tuple[int, ...]) -> None:
        start, n = self.n_prefix, sum(sizes)
        starts = [start + k for k in accumulate((0, *sizes[:-1]))]
        feed_batches(ctx.decode, self.tokens[start:start + n], start, starts)

    def _time_suffix(self, kernel: bool, plan: str) -> None:
        ctx = self._restored(kernel)
        with self.meter:
            t0 = self.clock()
            self._feed_suffix(ctx, self.plans[plan])
            ctx.logits(-1)
            dt = self.clock() - t0
        self.samples[(kernel, plan)].append(dt * 1000)
        self._sample_s.append(dt)
        if plan == "one" and kernel not in self._one_print and self.n_suffix == self.n_probe:
            self._one_print[kernel] = fingerprint(ctx)

    def _probe_grouping(self, kernel: bool) -> None:
        """Evaluate the probe's suffix (untimed) in one batch, unless a timing just did, and in
        uneven batches, and compare their bits (see the module docstring)."""
        if kernel not in self._one_print:
            ctx = self._restored(kernel)
            self._feed_suffix(ctx, (self.n_probe,))
            self._one_print[kernel] = fingerprint(ctx)
        ctx = self._restored(kernel)
        self._feed_suffix(ctx, probe_sizes(self.n_probe))
        self.grouping_exact[kernel] = fingerprint(ctx) == self._one_print[kernel]

    def _score_range(self, kernel: bool) -> tuple[float, float]:
        lo = hi = 0.0
        for w, plan in zip(self.weights, PLANS):
            if plan == "split" and self.grouping_exact.get(kernel):
                plan = "one"  # chain cuts no batch per segment on this kernel (grouping_exact)
            q1, q3 = quartiles(self.samples[(kernel, plan)])
            lo, hi = lo + w * q1, hi + w * q3
        return lo, hi

    def _settled(self) -> bool:
        if self.round < MIN_ROUNDS:
            return False
        if all(relative_spread(v) <= SPREAD_OK for v in self.samples.values()):
            return True
        # the winner's slowest quartile beats every other kernel's fastest: more rounds
        # cannot change the answer
        ranges = {k: self._score_range(k) for k in self.kernels}
        best = min(ranges, key=lambda k: statistics.fmean(ranges[k]))
        return all(ranges[best][1] < ranges[k][0] for k in self.kernels if k != best)

    def _finish(self) -> None:
        load = self.meter.result()
        if self.passes.skipped:
            self.result = Measured((), load, False, 0, load.wall_s * 1000, time.time(),
                                   self.passes.skipped)
            return self.close()
        timings = tuple(KernelTiming(
            k, self._prefix_ms[k], statistics.median(self.samples[(k, "one")]),
            statistics.median(self.samples[(k, "split")]), self.n_suffix,
            round(relative_spread(self.samples[(k, "one")]), 4),
            round(relative_spread(self.samples[(k, "split")]), 4), len(self.samples[(k, "one")]),
            self.grouping_exact.get(k), self.n_prefix)
            for k in self.kernels)
        spreads_ok = all(relative_spread(v) <= SPREAD_OK for v in self.samples.values())
        settled = spreads_ok or self._settled()
        self.result = Measured(timings, load, settled, self.round, load.wall_s * 1000, time.time())
        self.close()

    def close(self) -> None:
        """Free the timing contexts. A measurement closed mid-way can still go on: a saved
        prefix is restored into a new context; a prefix not yet saved is evaluated again."""
        for ctx in self._ctx.values():
            ctx.close()
        self._ctx.clear()
        for k in self.kernels:
            if k not in self._prefix_state:
                self._prefix_done.pop(k, None)
                self._prefix_t.pop(k, None)
        if self.finished:
            self._prefix_state.clear()
