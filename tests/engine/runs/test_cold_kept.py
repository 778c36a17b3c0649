"""Kept cold runs: a cold reference is evaluated once per key (prompt, batches, kernel, settings,
generation threads, generation) and every later run, repeat and mode with that key is judged
against it; another key evaluates again; memory stays under a byte cap; a long cold run is
announced first. Tiny model; evaluations are counted with a spy on the cold reference."""
from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from app.cli import main
from app.engine import Engine, EngineConfig, run_prompt
from app.engine.benchmarks.bench_rows import bench_rows
from app.engine.llama.thread_fit import shared_fit
from app.engine.prompts.rows import Row
from app.engine.runs import cold_reference
from app.engine.progress_plan import work_units
from app.engine.runs.cold_reference import ColdEstimate

from tests.cold_runs import GEN, TPL, VALS, evaluations  # noqa: F401 (a fixture)


def _same_verdict(a, b) -> bool:
    return asdict(a) == asdict(b)


def test_a_repeat_of_the_same_prompt_is_judged_against_the_kept_cold_run(engine, evaluations):
    first = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    assert evaluations == ["cold"] and not first.cold_kept
    again = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    assert again.plan == first.plan
    assert evaluations == ["cold"] and again.cold_kept  # no second evaluation
    assert again.cold is first.cold and again.verdict.equivalence == "bit-identical"
    assert _same_verdict(again.verdict, first.verdict)  # the kept verdict is the fresh one's
    assert again.verdict_text().endswith("against a cold run kept from an earlier run")
    assert not first.verdict_text().endswith("earlier run")
    assert engine.cold.kept.hits == 1 and engine.cold.evaluations == 1


def test_every_mode_and_repeat_evaluates_once_per_batch_plan(engine, evaluations):
    reports = [run_prompt(engine, TPL, VALS, reuse=mode, gen=GEN)
               for mode in ("prefix", "chain", "chain", "prefix")]
    plans = {tuple(r.plan) for r in reports}
    # one cold run per distinct batch plan, whichever mode or repeat made it
    assert evaluations == ["cold"] * len(plans)
    assert all(r.verdict.exact for r in reports)
    kept = [r for r in reports if r.cold_kept]
    assert len(kept) == len(reports) - len(plans)
    for r in kept:  # a kept verdict is the fresh one of the run that evaluated it
        fresh = next(f for f in reports if f.plan == r.plan and not f.cold_kept)
        assert _same_verdict(r.verdict, fresh.verdict)


def test_a_benchmark_after_a_run_reuses_its_cold_run(engine, evaluations):
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    assert evaluations == ["cold"]
    res = bench_rows(engine, TPL, [Row(1, VALS)], repeat=2, modes=("prefix",), gen=GEN)
    assert evaluations == ["cold"] and res.rows[0].equivalence == "bit-identical"


def test_a_warm_only_run_is_judged_by_a_kept_cold_run_without_evaluating(engine, evaluations):
    both = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    warm = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False)
    assert evaluations == ["cold"]
    assert warm.cold_kept and warm.verified and _same_verdict(warm.verdict, both.verdict)
    other = run_prompt(engine, TPL, {**VALS, "question": "how?"}, reuse="prefix", gen=GEN,
                       cold=False)
    assert evaluations == ["cold"] and other.cold is None and other.verdict is None
    assert not other.verified and other.verdict_text() == "not yet verified (warm only)"


def test_other_batches_or_another_kernel_evaluate_again(engine, evaluations):
    tokens = engine.tokenize(TPL.fill(VALS))
    ref = engine.cold

    def cold(marks):
        key = ref.key(tokens, marks, GEN, 4, 4)
        return key, ref.reference(key, tokens, marks, GEN, 4, None, "cold", 4)

    k1, (r1, kept1) = cold([0, 20])
    k2, (r2, kept2) = cold([0, 21])
    assert k1 != k2 and not kept1 and not kept2 and evaluations == ["cold", "cold"]
    again, kept = cold([0, 20])[1]
    assert again is r1 and kept and len(evaluations) == 2
    # another attention kernel: another key, and the context opened again with it
    engine._flash_attn = not engine._flash_attn
    k3, (r3, kept3) = cold([0, 20])
    assert k3.context.flash_attn != k1.context.flash_attn and not kept3
    assert len(evaluations) == 3 and ref.context.params == k3.context


def test_the_key_names_kv_types_micro_batches_and_the_model(tiny_model, other_tiny_model):
    def key(path, **kw):
        with Engine(EngineConfig(model_path=str(path), n_ctx=1024, n_batch=32, n_threads=1,
                                 **kw)) as e:
            tokens = e.tokenize(TPL.fill(VALS))
            return e.cold.key(tokens, [0], GEN, 4, 4)

    base = key(tiny_model)
    assert key(tiny_model) == base  # another engine, same settings: same key
    assert key(tiny_model, n_ubatch=16) != base
    assert key(tiny_model, type_k="q8_0") != base
    assert key(other_tiny_model).model != base.model


def test_another_generation_thread_count_evaluates_again(tiny_model, monkeypatch, evaluations):
    """With auto threads the count a run holds is the fit's when it starts (ThreadFit.pinned):
    a run on another count needs its own cold run, a run on the same count takes the kept one."""
    count = [1]
    monkeypatch.setattr(shared_fit(), "threads", lambda: count[0])
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32,
                             n_threads=0)) as e:
        one = run_prompt(e, TPL, VALS, reuse="prefix", gen=GEN)
        count[0] = 2
        two = run_prompt(e, TPL, VALS, reuse="prefix", gen=GEN)
        count[0] = 1
        again = run_prompt(e, TPL, VALS, reuse="prefix", gen=GEN)
    assert (one.reference.gen_threads, two.reference.gen_threads) == (1, 2)
    assert evaluations == ["cold", "cold"]
    assert not two.cold_kept and again.cold_kept and again.cold is one.cold


def test_kept_runs_stay_under_their_byte_cap_least_recently_used_out(engine, evaluations):
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    one = engine.cold.kept.nbytes
    assert one > 0 and len(engine.cold.kept) == 1
    engine.cold.kept.cap = one + one // 2  # room for one run only
    run_prompt(engine, TPL, {**VALS, "question": "how?"}, reuse="prefix", gen=GEN)
    assert len(engine.cold.kept) == 1 and engine.cold.kept.nbytes <= engine.cold.kept.cap
    again = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)  # evicted: evaluated again
    assert evaluations == ["cold"] * 3 and not again.cold_kept


def test_a_long_cold_run_is_announced_with_its_estimate(engine, monkeypatch):
    seen = []
    from app.engine.task_state import TaskState

    task = TaskState(on_partial=seen.append)
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, task=task)
    assert not [x for x in seen if isinstance(x, ColdEstimate)]  # short: nothing said
    monkeypatch.setattr(cold_reference, "LONG_COLD_S", 0.0)
    seen.clear()
    rep = run_prompt(engine, TPL, {**VALS, "question": "how?"}, reuse="prefix", gen=GEN,
                     task=task)
    est = [x for x in seen if isinstance(x, ColdEstimate)]
    assert len(est) == 1 and est[0].tokens == rep.prompt_tokens
    assert est[0].basis == "this engine's evaluations" and est[0].seconds > 0
    assert est[0].text().startswith(f"verifying against a cold run of {rep.prompt_tokens:,} "
                                    "tokens: about ")
    seen.clear()  # a kept cold run takes no time: nothing to announce
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, task=task)
    assert not [x for x in seen if isinstance(x, ColdEstimate)]


def test_the_estimate_scales_with_the_attention_and_falls_back_to_the_warm_run(engine):
    ref = engine.cold
    assert ref.estimate(1000) is None  # nothing measured yet (the tests set the kernel)
    warm = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False).warm
    assert ref.estimate(1000).basis == "this engine's evaluations"  # the warm run's prime
    ref._samples.clear()  # as after `run --state`: nothing evaluated from scratch here
    from_warm = ref.estimate(1000, warm=warm)
    assert from_warm.basis == "the warm run" and from_warm.seconds > 0
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    small, big = ref.estimate(1000), ref.estimate(8000)
    assert small.basis == "this engine's evaluations"
    assert big.seconds > 8 * small.seconds  # later tokens attend to more: more than linear


def test_the_kernel_measurements_prefix_comes_before_the_warm_runs_suffix(engine, monkeypatch):
    """`run --state` alone, nothing evaluated from scratch here: the kernel measurement's prefix
    (full batches from position 0, as a cold run evaluates) is the basis, not the warm run's
    few suffix tokens (a small batch, slower a token: the estimate came out 1.25-2.8x the cold
    run's time on the scale section's shapes, against 0.68-1.05x from the prefix)."""
    from app.engine.llama.kernel_choice import KernelChoice, KernelTiming

    ref = engine.cold
    warm = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False).warm
    ref._samples.clear()
    fa = engine.kernels.flash_attn
    other = KernelTiming(not fa, 99.0, 1.0, 1.0, 16, prefix_tokens=256)
    mine = KernelTiming(fa, 2.0, 1.0, 1.0, 16, prefix_tokens=128)
    choice = KernelChoice(fa, "measured", "test", (other, mine))
    monkeypatch.setattr(type(engine), "kernels", property(lambda self: choice))
    est = ref.estimate(1000, warm=warm)
    assert est.basis == "the kernel measurement"
    k = ref._attention_share()
    assert est.seconds == pytest.approx((2.0 * 128 * work_units(0, 1000, k) / work_units(0, 128, k)
                                         + warm.gen_ms) / 1000)
    ref.note_evaluation(0, 500, 400.0)  # an evaluation of its own comes first
    assert ref.estimate(1000, warm=warm).basis == "this engine's evaluations"
    ref._samples.clear()
    bare = KernelChoice(fa, "measured", "test", (other,))  # the kernel in use not measured
    monkeypatch.setattr(type(engine), "kernels", property(lambda self: bare))
    assert ref.estimate(1000, warm=warm).basis == "the warm run"


def test_a_prime_in_this_engine_is_the_next_cold_runs_basis(engine):
    """The prefix's evaluation, not the warm run's few suffix tokens (a small batch, slower a
    token), estimates the cold run that follows a prime."""
    ref = engine.cold
    assert ref.estimate(1000) is None
    engine.prime(TPL)
    n = len(engine.tokenize(TPL.prefix_prompt()))
    (start, end, ms, _basis), = ref._samples
    assert (start, end) == (0, n) and ms > 0
    est = ref.estimate(n)
    assert est.basis == "this engine's evaluations"
    assert est.seconds == pytest.approx(ms / 1000)
    assert ref.evaluations == 0  # a prime is no cold run: nothing kept, nothing counted


def test_kvprimer_run_says_how_long_a_long_cold_run_will_take(tmp_path, tiny_model, capsys,
                                                             monkeypatch):
    monkeypatch.setattr(cold_reference, "LONG_COLD_S", 0.0)
    (tmp_path / "t.tmpl").write_text(TPL.source, encoding="utf-8")
    args = ["run", str(tmp_path / "t.tmpl"), "-m", str(tiny_model), "-t", "1", "-c", "1024",
            "-b", "32", "--max-tokens", "3", *(f"--set={k}={v}" for k, v in VALS.items())]
    assert main(args) == 0
    out, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if "verifying against a cold run of" in x)
    assert "tokens: about " in line and line.endswith("; --warm skips it")
    assert "verdict: bit-identical" in out
    assert main([*args, "--warm"]) == 0
    out, err = capsys.readouterr()
    assert "verifying" not in err and "verdict: not yet verified (warm only)" in out


def test_the_estimate_learns_the_attention_cost_from_its_own_runs(engine):
    """Own cold runs of sizes 2x apart show the per-token time rising with the length: a cold
    run of 4,000 tokens costing n + 0.01·n² ms is estimated from runs of 500 and 1,000."""
    info = engine.info
    assert 2 * info.n_layer * info.n_embd / info.n_params < 0.02  # the shape says less
    ref = engine.cold
    ref._samples = [(0, n, n + 0.01 * n * n, "own") for n in (500, 1000)]
    assert ref.estimate(4000).seconds == pytest.approx((4000 + 0.01 * 4000 ** 2) / 1000)
    ref._samples = ref._samples[:1]  # one size: the model's shape alone scales it
    assert ref.estimate(4000).seconds < (4000 + 0.01 * 4000 ** 2) / 1000


def test_a_loaded_states_prime_is_the_cold_runs_basis_on_the_same_machine(engine, tiny_model,
                                                                         tmp_path):
    """`run --state` alone: the state's file keeps how long its prime took, and an engine on
    the same machine, CPU, threads and kernel estimates the cold run from it, not from the
    warm run's few suffix tokens. Another machine's timing is no basis."""
    from dataclasses import replace

    from app.engine import Engine, EngineConfig, state_flows

    state = engine.prime(TPL)
    n = state.n_tokens
    timing = state.prime_timing
    assert (timing.start, timing.end) == (0, n) and timing.ms > 0
    assert timing.machine == engine.cold.machine()
    path = tmp_path / "p.kvstate"
    state.save(path)
    config = EngineConfig(model_path=str(tiny_model), n_ctx=engine.n_ctx, n_batch=32,
                          n_threads=1)
    with Engine(config) as fresh:
        if fresh.cold.machine() != timing.machine:
            pytest.skip("the fixture engine runs other settings than a fresh one")
        loaded = state_flows.load_state(fresh, path, TPL)
        assert loaded.prime_timing == timing  # kept by the file
        est = fresh.cold.estimate(n)
        assert est.basis == "the saved state's prime"
        assert est.seconds == pytest.approx(timing.ms / 1000)
    with Engine(config) as other:
        assert not other.cold.take_timing(replace(timing, machine="another CPU; 64 cores"))
        assert other.cold.estimate(n) is None or other.cold.estimate(n).basis != \
            "the saved state's prime"
