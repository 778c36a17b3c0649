"""The verdict on synthetic logits: bit-identical, within-noise, diverged, and KL."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.engine.runs.verdict import (BIT_IDENTICAL, DIVERGED, WITHIN_NOISE, compare_runs, judge,
                                kl_divergence)

RNG = np.random.default_rng(3)
LOGITS = [RNG.normal(size=50).astype(np.float32) for _ in range(4)]
TOKENS = [int(np.argmax(x)) for x in LOGITS]


def nudged(by: float, at: int | None = None):
    out = [x.copy() for x in LOGITS]
    for i, x in enumerate(out):
        if at is None or i == at:
            x[7] += by
    return out


def test_kl_divergence():
    a = LOGITS[0]
    assert kl_divergence(a, a) == 0.0
    assert kl_divergence(a, a + 5.0) == pytest.approx(0.0, abs=1e-12)  # a shift is no change
    # two tokens: P = (1/2, 1/2), Q = softmax(0, log 3) = (1/4, 3/4)
    p, q = np.array([0.0, 0.0]), np.array([0.0, math.log(3.0)])
    expect = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_divergence(p, q) == pytest.approx(expect, rel=1e-12)
    assert kl_divergence(a, nudged(2.0)[0]) > 0 and kl_divergence(a, -a) > 0.1


def test_identical_runs_are_bit_identical():
    c = compare_runs(TOKENS, LOGITS, list(TOKENS), [x.copy() for x in LOGITS])
    assert (c.tokens_equal, c.first_diff, c.max_logit_diff, c.kl_divergence, c.top1_agree,
            c.positions) == (True, None, 0.0, 0.0, 1.0, 4)
    v = judge(c, c)
    assert v.equivalence == BIT_IDENTICAL and v.exact and v.describe() == BIT_IDENTICAL
    assert judge(c, None, note="why").describe() == "bit-identical; why"


def test_same_tokens_small_difference_within_the_measured_noise():
    warm = compare_runs(TOKENS, LOGITS, TOKENS, nudged(1e-3))
    noise = compare_runs(TOKENS, LOGITS, TOKENS, nudged(1e-2))
    assert warm.tokens_equal and 0 < warm.max_logit_diff < noise.max_logit_diff
    v = judge(warm, noise)
    assert v.equivalence == WITHIN_NOISE and not v.exact
    assert v.noise_max_logit_diff == pytest.approx(1e-2, rel=1e-3)
    assert v.describe().startswith("within-noise (|Δlogit|")
    # the same difference without a noise measurement, or above the noise, is not noise
    assert judge(warm, None).equivalence == DIVERGED
    assert judge(noise, warm).equivalence == DIVERGED
    # no noise at all (the model's grouping changes nothing): any difference diverges
    zero = compare_runs(TOKENS, LOGITS, TOKENS, LOGITS)
    d = judge(warm, zero)
    assert d.equivalence == DIVERGED and d.tokens_equal and d.first_diff is None
    assert "tokens equal" in d.describe() and "DIFF at None" not in d.describe()


def test_diverged_tokens_report_where_and_compare_only_shared_contexts():
    other = list(TOKENS)
    other[2] = (other[2] + 1) % 50
    logits = nudged(0.5)
    logits[3] = -LOGITS[3]  # after the first difference the contexts differ: not compared
    c = compare_runs(TOKENS, LOGITS, other, logits)
    assert not c.tokens_equal and c.first_diff == 2 and c.positions == 3
    assert c.max_logit_diff == pytest.approx(0.5)
    v = judge(c, compare_runs(TOKENS, LOGITS, TOKENS, nudged(5.0)))
    assert v.equivalence == DIVERGED and v.first_diff == 2  # tokens differ: never noise
    assert "first differing token 2" in v.describe()


def test_top1_agreement_and_kl_when_the_argmax_moves():
    flipped = [x.copy() for x in LOGITS]
    flipped[0][TOKENS[0]] -= 100.0
    c = compare_runs(TOKENS, LOGITS, TOKENS, flipped)
    assert c.top1_agree == pytest.approx(3 / 4) and c.kl_divergence > 1.0


def test_a_shorter_run_differs_where_it_stops():
    c = compare_runs(TOKENS, LOGITS, TOKENS[:2], LOGITS[:2])
    assert not c.tokens_equal and c.first_diff == 2
    c = compare_runs(TOKENS, [], TOKENS, [])
    assert c.positions == 0 and c.top1_agree == 1.0 and c.tokens_equal


def test_a_rounding_difference_is_within_noise_even_when_the_measured_noise_is_zero():
    # a kernel insensitive to batch grouping and placement measures no noise at all; a
    # difference in the last bits must still not read as a changed prediction
    warm = compare_runs(TOKENS, LOGITS, TOKENS, nudged(1e-6))
    zero = compare_runs(TOKENS, LOGITS, TOKENS, [x.copy() for x in LOGITS])
    assert warm.max_logit_diff > 0 and zero.max_logit_diff == 0.0
    v = judge(warm, zero)
    assert v.equivalence == WITHIN_NOISE and "float rounding" in v.describe()
    # but a real difference past the rounding floor, with no noise to cover it, diverges
    assert judge(compare_runs(TOKENS, LOGITS, TOKENS, nudged(0.5)), zero).equivalence == DIVERGED


def test_nothing_compared_is_not_called_identical():
    c = compare_runs([], [], [], [])
    assert c.positions == 0
    v = judge(c, c)
    assert v.equivalence == DIVERGED and not v.exact
    assert "no position compared" in v.describe()


def test_zero_positions_is_never_equality_whatever_else_the_comparison_says():
    # built directly: equal tokens, no difference and full agreement, but nothing compared;
    # judged against a noise measurement that would cover any difference
    from app.engine.runs.verdict import Comparison

    empty = Comparison(True, None, 0.0, 0.0, 1.0, 0)
    noise = compare_runs(TOKENS, LOGITS, TOKENS, nudged(5.0))
    for v in (judge(empty, noise), judge(empty, None), judge(empty, empty)):
        assert v.equivalence == DIVERGED and not v.exact and v.positions == 0
        assert v.describe().startswith("diverged (no position compared")


def test_a_run_that_ends_at_once_still_compares_its_first_position():
    # the first generated token is the end of generation: no tokens kept, but the logits that
    # chose it were, and they are what the verdict weighs
    c = compare_runs([], LOGITS[:1], [], nudged(0.5)[:1])
    assert c.positions == 1 and c.tokens_equal and c.max_logit_diff == pytest.approx(0.5)
    assert judge(c, None).equivalence == DIVERGED
    same = compare_runs([], LOGITS[:1], [], [LOGITS[0].copy()])
    assert same.positions == 1 and judge(same, None).equivalence == BIT_IDENTICAL
