"""The kernel measurement's passes are sized to the model: a first timed batch (the pilot) sets
the prefix, the suffix, the rounds and whether the batch-grouping probe runs, so that the
planned work fits a few seconds on a slow model as on a fast one; the probe is never shortened
(left out instead, which counts as not grouping-exact); a model too slow for even the leanest
plan is not timed, keeps the safe default and says why. Asserted on the plans, never on time."""
from __future__ import annotations

import itertools
import json

import pytest

from app.engine.engine_kernels import EngineKernels
from app.engine.llama import kernel_choice as kc
from app.engine.llama.kernel_measure import KernelMeasurement
from app.engine.llama.kernel_passes import (BUDGET_S, CALIBRATION_PREFIX, CALIBRATION_SUFFIX,
                                            MAX_ROUNDS, MIN_ROUNDS, PROBE_SUFFIX, SKIP_OVER,
                                            plan_passes)
from app.engine.llama.native import ContextParams, NativeModel

BUDGET_MS = BUDGET_S * 1000
SPEEDS = (0.01, 0.5, 1, 2, 3, 5, 8, 12, 20, 35, 60, 100, 300, 1000)  # ms a token, fast to slow


def test_slower_models_get_shorter_passes_within_the_budget():
    plans = [plan_passes(ms, n_ctx=8192, n_batch=512) for ms in SPEEDS]
    fastest = plans[0]
    # a fast model is timed as before the sizing: 1,024 tokens deep, 64-token suffix, probed
    assert (fastest.n_prefix, fastest.n_suffix, fastest.n_probe, fastest.max_rounds) == \
        (CALIBRATION_PREFIX, CALIBRATION_SUFFIX, PROBE_SUFFIX, MAX_ROUNDS)
    for a, b in zip(plans, plans[1:]):  # never more work for a slower model
        assert b.n_prefix <= a.n_prefix and b.n_suffix <= a.n_suffix
        assert b.n_probe <= a.n_probe and b.planned_tokens <= a.planned_tokens
    assert plans[-1].n_prefix < plans[0].n_prefix and plans[-1].n_suffix < plans[0].n_suffix
    lean = min(p.planned_tokens for p in plans)
    for p in plans:
        assert MIN_ROUNDS <= p.max_rounds <= MAX_ROUNDS
        # the probe's suffix is the full one or none: a shorter one could miss the tiled path
        assert p.n_probe in (PROBE_SUFFIX, 0)
        if p.skipped:
            assert "too slow to time here" in p.skipped
        elif p.planned_tokens > lean:  # anything but the leanest plan fits the budget
            assert p.planned_ms <= BUDGET_MS
        else:
            assert p.planned_ms <= SKIP_OVER * BUDGET_MS
    assert any(p.n_probe == 0 and not p.skipped for p in plans)  # probe left out, still timed
    assert plans[-1].skipped  # a second a token: not timed at all
    # the budget bounds the planned work whatever the model: the leanest plan at most
    assert all(p.skipped or p.planned_ms <= max(BUDGET_MS, p.planned_tokens * p.ms_per_token)
               for p in plans)


def test_small_contexts_and_batches_cap_the_passes_as_before():
    p = plan_passes(0.01, n_ctx=256, n_batch=24)
    # half the context, the batch: what the measurement always capped them at
    assert (p.n_prefix, p.n_suffix, p.n_probe) == (128, 24, 24)
    slow = plan_passes(10, n_ctx=256, n_batch=24)
    assert slow.n_prefix <= 128 and slow.n_suffix <= 24 and slow.n_probe in (24, 0)


def stepping_clock(step_s: float):
    """A clock that moves ``step_s`` at every reading: every timed span takes exactly that."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


@pytest.fixture
def tiny(tiny_model):
    model = NativeModel(str(tiny_model))
    yield model
    model.close()


PARAMS = ContextParams(n_ctx=1024, n_batch=32, n_threads=1)


def test_a_slow_pilot_makes_a_real_measurement_short_and_unprobed(tiny):
    # the pilot's 32 tokens "take" 0.5 s: 15.6 ms a token, a 1B model's speed on 2 cores
    m = KernelMeasurement(tiny, PARAMS, clock=stepping_clock(0.5))
    m.step()  # the pilot
    want = plan_passes(500 / 32, PARAMS.n_ctx, PARAMS.n_batch)
    assert m.passes == want and not want.skipped
    assert want.n_prefix < PARAMS.n_ctx // 2 and want.n_suffix < PARAMS.n_batch and not want.n_probe
    assert m.run()
    r = m.result
    assert all((t.prefix_tokens, t.suffix_tokens) == (want.n_prefix, want.n_suffix)
               for t in r.timings)
    assert all(t.grouping_exact is None for t in r.timings)  # not probed
    assert all(len(v) == r.rounds for v in m.samples.values()) and r.rounds <= want.max_rounds
    choice = kc._decide(r.timings, "measured", 1.0)
    assert not choice.grouping_exact  # not probed: chain runs keep a batch per segment
    assert "not probed" in r.timings[0].describe()


def test_a_fast_pilot_keeps_the_full_measurement_and_its_probe(tiny):
    m = KernelMeasurement(tiny, PARAMS, clock=stepping_clock(1e-6))
    assert m.run()
    p = m.passes
    assert (p.n_prefix, p.n_suffix, p.n_probe) == (PARAMS.n_ctx // 2, PARAMS.n_batch, PARAMS.n_batch)
    assert all(t.grouping_exact is not None for t in m.result.timings)  # probed


def test_a_model_too_slow_to_time_keeps_the_safe_default_and_says_why(tiny):
    m = KernelMeasurement(tiny, PARAMS, clock=stepping_clock(60.0))  # 2 s a token
    assert m.run() and m.result.skipped and not m.result.timings
    assert m.samples == {k: [] for k in m.samples}  # nothing timed after the pilot
    params = ContextParams(n_ctx=1024, n_batch=31, n_threads=1)
    choice = kc.finish_choice(m.result, params, "sha-slow")
    assert (choice.flash_attn, choice.how) == (kc.SAFE_DEFAULT, "not measured")
    assert "too slow to time here" in choice.reason and not choice.grouping_exact
    entry = json.loads(kc._cache_path().read_text())[kc._key(params, "sha-slow")]
    assert "too slow" in entry["skipped"]
    # the next start reads it and does not measure again (unless asked, or the machine was busy)
    k = EngineKernels(tiny, params, "sha-slow", "auto", False, False, False, False)
    assert k.choice.how == "not measured" and not k.wanted
    assert k.choice.provisional == m.result.load.busy
    asked = EngineKernels(tiny, params, "sha-slow", "auto", False, False, False, True)
    assert asked.wanted and asked.asked


@pytest.mark.parametrize("n_batch", [16, 32, 64, 512])
def test_each_rung_of_the_ladder_is_less_work_than_the_one_before(n_batch):
    """So the first plan that fits is the richest that fits, and a slower model never gets a
    deeper or longer plan than a faster one."""
    from app.engine.llama.kernel_passes import LADDER, planned_tokens

    costs = []
    for p, s, probe in LADDER:
        p, s = min(p, 1024), min(s, n_batch, p)
        costs.append(planned_tokens(p, s, min(PROBE_SUFFIX, n_batch) if probe else 0, MIN_ROUNDS))
    assert all(b <= a for a, b in zip(costs, costs[1:])), costs
