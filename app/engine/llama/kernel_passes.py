"""How much a kernel measurement times: passes sized to the model's speed (kernel_measure.py).

A measurement on a 135M model and on an 8B one should both cost a few seconds. So its first
step times a pilot batch, and ``plan_passes`` takes the richest plan of ``LADDER`` whose work at
that speed fits ``BUDGET_S``: the prefix (the depth the suffix is timed at), the timed suffix, the
grouping probe, and as many rounds beyond ``MIN_ROUNDS`` as still fit. The ladder shrinks the
rounds, then the prefix and the suffix, and leaves the probe out before the leanest plans: the
probe's suffix is never shortened (a shorter one would not reach flash attention's tiled path,
and could call a kernel grouping-exact that is not). A model too slow for even the leanest plan
within ``SKIP_OVER`` budgets is not timed at all (``Passes.skipped``).

The plan is work in tokens (``planned_tokens``); its time is only the pilot's estimate, and a
small batch is counted as ``SMALL_BATCH_COST`` tokens of a big one: planning, not measuring.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

# tokens the timed suffix attends to at most (shorter for small contexts and slow models): flash
# attention's penalty on small batches grows with the context (seen: 1.16x at 512 tokens, 1.6x
# at 1,761), so a short prefix would favour it; cached prompts are long
CALIBRATION_PREFIX = 1024
CALIBRATION_SUFFIX = 64  # one batch: the size of a typical row's variable part
MIN_ROUNDS = 3
MAX_ROUNDS = 8
# the probe's one batch: flash attention's tiled path starts at 64 tokens (LLAMA_FACTS.md)
PROBE_SUFFIX = 64

BUDGET_S = 8.0  # the planned work of one measurement, at the pilot's speed
SKIP_OVER = 4.0  # the leanest plan costing more than this many budgets: not timed at all
PILOT_WARMUP, PILOT_TOKENS = 8, 32
# planning only: a token in a small batch costs about this many in a big one (small batches
# use the weights less well; flash attention's small-batch path is slower still)
SMALL_BATCH_COST = 2.0
# (prefix, suffix, probe) from the richest plan down: the first that fits the budget is taken
LADDER = ((1024, 64, True), (512, 64, True), (256, 64, True), (256, 32, True), (128, 32, True),
          (128, 16, True), (128, 16, False), (64, 16, False))


@dataclass(frozen=True)
class Passes:
    """What a measurement times: sized by ``plan_passes`` from the pilot's speed."""
    n_prefix: int  # tokens the timed suffix attends to
    n_suffix: int  # the timed suffix (one batch, or SPLIT)
    n_probe: int  # the grouping probe's suffix (0: no probe)
    max_rounds: int  # rounds at most (MIN_ROUNDS..MAX_ROUNDS)
    ms_per_token: float  # the pilot's speed the plan was sized by
    skipped: str = ""  # why nothing is timed (too slow to time here), or ""

    @property
    def planned_tokens(self) -> float:
        """The work planned at most, in tokens of a big batch (both kernels)."""
        return planned_tokens(self.n_prefix, self.n_suffix, self.n_probe, self.max_rounds)

    @property
    def planned_ms(self) -> float:
        return self.planned_tokens * self.ms_per_token


def planned_tokens(n_prefix: int, n_suffix: int, n_probe: int, rounds: int, kernels: int = 2) -> float:
    per_round = n_suffix * (1 + SMALL_BATCH_COST)  # one batch and split, per kernel
    # the probe's one batch is the first timed one when the suffixes are the same
    probe = n_probe * SMALL_BATCH_COST + (0 if n_probe == n_suffix else n_probe) if n_probe else 0
    return kernels * (n_prefix + rounds * per_round + probe)


def plan_passes(ms_per_token: float, n_ctx: int, n_batch: int,
                budget_ms: float = BUDGET_S * 1000) -> Passes:
    """The richest plan of ``LADDER`` whose work at ``ms_per_token`` fits ``budget_ms``, with as
    many rounds as fit beyond ``MIN_ROUNDS``; else the leanest, unless even that costs over
    ``SKIP_OVER`` budgets (``skipped`` then says why). Prefix and suffix never exceed what the
    unsized measurement timed (half the context, n_batch)."""
    ms = max(ms_per_token, 1e-6)
    cap = max(8, min(CALIBRATION_PREFIX, n_ctx // 2))
    probe_full = min(PROBE_SUFFIX, n_batch, cap)  # as long as the runs' batches can be, up to 64
    plans = []
    for p, s, probe in LADDER:
        p = min(p, cap)
        s = min(s, n_batch, p)
        plans.append((p, s, probe_full if probe else 0))
    for p, s, n_probe in plans:
        spare = budget_ms / ms - planned_tokens(p, s, n_probe, MIN_ROUNDS)
        if spare >= 0:
            extra = int(spare // planned_tokens(0, s, 0, 1))
            return Passes(p, s, n_probe, min(MAX_ROUNDS, MIN_ROUNDS + extra), ms)
    p, s, n_probe = plans[-1]
    lean = Passes(p, s, n_probe, MIN_ROUNDS, ms)
    if lean.planned_ms > SKIP_OVER * budget_ms:
        return replace(lean, skipped=(
            f"too slow to time here: at {ms:.0f} ms a token even the shortest passes would take "
            f"about {lean.planned_ms / 1000:.0f} s"))
    return lean


def probe_sizes(n: int) -> tuple[int, ...]:
    """Uneven batches of two tokens or more for ``n`` tokens: two, then three of different sizes
    and residues (for 64: 2, 13, 29, 20), fewer when ``n`` is small. (A one-token batch is
    another computation, which the runs keep apart: batch_policy.py.)"""
    if n < 4:
        return (n,)
    rest = n - 2
    a = max(2, rest * 2 // 9)
    b = max(2, (rest - a) * 3 // 5) if rest - a >= 4 else 0
    parts = [x for x in (2, a, b, rest - a - b) if x > 0]
    if parts[-1] < 2:  # never a lone token
        parts[-2:] = [parts[-2] + parts[-1]]
    return tuple(parts)


def relative_spread(values: list[float]) -> float:
    """(p75 - p25) / median: how far repeats of one timing stray, robust to one outlier."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    med = statistics.median(values)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return q[0], q[2]
