"""The attention kernel: measured once per build, CPU, model and settings, cached, overridable,
and the same in every context of an engine (states move between them)."""
from __future__ import annotations

import json
import math

import pytest

from app.engine import Engine, EngineConfig, KvPrimerError
from app.engine.llama.kernel_choice import _cache_path, _decide, KernelTiming


def make(tiny_model, **kw) -> Engine:
    kw = {"n_ctx": 1024, "n_batch": 32, "n_threads": 1, "flash_attn": "auto", **kw}
    return Engine(EngineConfig(model_path=str(tiny_model), **kw))


def test_auto_measures_both_kernels_once_then_reads_the_measurement(tiny_model):
    with make(tiny_model, n_batch=48, remeasure_kernels=True) as e:
        first = e.kernels
    assert first.how == "measured"
    assert {t.flash_attn for t in first.timings} == {True, False}
    # every timing was taken (a suffix time stays infinite until measured), and what the
    # measuring cost covers them all
    assert all(math.isfinite(t.suffix_ms) and math.isfinite(t.split_suffix_ms)
               for t in first.timings)
    assert first.calibration_ms >= sum(t.suffix_ms + t.split_suffix_ms for t in first.timings)
    best = min(first.timings, key=lambda t: t.suffix_ms + t.split_suffix_ms)
    assert first.flash_attn == best.flash_attn  # the faster one on this machine, whichever
    stored = json.loads(_cache_path().read_text())
    assert any(len(v["timings"]) == 2 for v in stored.values())
    with make(tiny_model, n_batch=48) as e:
        again = e.kernels
    assert again.how == "measured earlier" and again.calibration_ms == 0
    assert again.timings == first.timings and again.flash_attn == first.flash_attn
    # other settings are another measurement
    with make(tiny_model, n_batch=40) as e:
        assert e.kernels.how == "measured"
    assert ("faster on suffixes as chain mode batches them" in again.reason
            or "as fast within" in again.reason) and again.describe().startswith("flash attention")
    # the figures behind it: each kernel's times and spread, the machine's load, when
    lines = again.figure_lines()
    assert sum("48-token suffix" in line and "±" in line for line in lines) == 2
    assert any("cores" in line and "measured 2" in line and "rounds" in line for line in lines)


@pytest.mark.parametrize("setting,want", [("on", True), ("off", False)])
def test_a_setting_overrides_the_measurement_in_every_context(tiny_model, setting, want):
    from app.engine import Template, run_prompt

    with make(tiny_model, flash_attn=setting) as e:
        assert (e.kernels.flash_attn, e.kernels.how) == (want, "set")
        tpl = Template.parse("hello world of the answer. " * 8 + "<q>")
        rep = run_prompt(e, tpl, {"q": "why?"}, reuse="chain")
        # cells moved from the work context into the cache and back: one V layout everywhere
        e.work.reset()
        again = run_prompt(e, tpl, {"q": "why?"}, reuse="chain")
        assert again.copied_tokens > 0 and again.verdict.exact and rep.verdict.exact


def test_cases_without_a_choice(tiny_model, arch_models):
    with make(tiny_model, type_k="q8_0", type_v="q8_0") as e:
        assert (e.kernels.flash_attn, e.kernels.how) == (True, "required")
    with pytest.raises(KvPrimerError, match="quantized V cache needs flash attention"):
        make(tiny_model, type_v="q8_0", flash_attn="off")
    with make(arch_models["gemma3"]) as e:  # sliding window: exact only on the small-batch path
        assert (e.kernels.flash_attn, e.kernels.how) == (True, "required")
        assert not e.runs_in_work_context
    with pytest.raises(KvPrimerError, match="flash attention must be one of auto, on, off"):
        make(tiny_model, flash_attn="fast")


def test_the_faster_suffixes_win_and_the_reason_says_by_how_much():
    on, off = KernelTiming(True, 3.0, 500.0, 500.0), KernelTiming(False, 3.5, 125.0, 125.0)
    c = _decide((off, on), "measured", 10.0)
    assert c.flash_attn is False and c.reason.startswith("4.00x faster")
    assert _decide((KernelTiming(False, 3.5, 600.0, 600.0), on), "measured", 1.0).flash_attn is True
    # faster in one batch but much slower in small ones (seen: flash attention on this build)
    on = KernelTiming(True, 8.0, 634.0, 1074.0)
    off = KernelTiming(False, 9.0, 645.0, 689.0)
    assert _decide((on, off), "measured", 1.0).flash_attn is False
    # within the noise: the kernel less slowed by small batches (chain mode's weights: 654
    # against 664 ms)
    on, off = KernelTiming(True, 7.4, 516.0, 700.0), KernelTiming(False, 8.4, 629.0, 676.0)
    tie = _decide((on, off), "measured", 1.0)
    assert tie.flash_attn is False and tie.reason.startswith("as fast within 5%")
