"""What a run costs: two evaluations when warm equals cold, the noise run only when they differ
(or when asked), where the warm time went, and when chain's batching costs more than it saves.
Tiny model; evaluations are counted with a spy on the cold reference, never timed."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.engine import report_dict, run_prompt
from app.engine.project.project_file import bench_from_dict, report_from_dict
from app.engine.llama.kernel_choice import SPLIT, KernelChoice, KernelTiming
from app.engine.benchmarks.bench_rows import bench_rows
from app.engine.runs.verdict import compare_runs, judge
from app.engine.runs.warm_cost import BatchCost, batching_note
from app.engine.prompts.rows import Row

from tests.cold_runs import GEN, TPL, VALS, evaluations  # noqa: F401 (a fixture)


def test_a_bit_identical_run_makes_two_evaluations(engine, evaluations):
    rep = run_prompt(engine, TPL, VALS, reuse="chain", gen=GEN)
    assert rep.verdict.equivalence == "bit-identical"
    assert rep.warm is not None and evaluations == ["cold"]  # warm + cold, no noise run
    assert rep.oneshot is None and rep.verdict.noise_max_logit_diff is None
    assert report_dict(rep)["oneshot"] is None  # the key stays, null


def test_the_noise_run_when_asked_changes_nothing_of_the_verdicts_word(engine, evaluations):
    rep = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, oneshot=True)
    assert evaluations == ["cold", "oneshot"] and rep.oneshot is not None
    assert rep.verdict.equivalence == "bit-identical"
    assert rep.verdict.noise_max_logit_diff is not None


def test_a_run_that_differs_measures_the_noise_and_is_judged_as_before(engine, evaluations):
    # compose places <c2>'s module, which never attended to <c1>: warm differs from cold
    rep = run_prompt(engine, TPL, VALS, reuse="compose", gen=GEN)
    assert rep.verdict.equivalence != "bit-identical"
    assert evaluations == ["cold", "oneshot"] and rep.oneshot is not None
    w = compare_runs(rep.cold.tokens, rep.cold.logits, rep.warm.tokens, rep.warm.logits)
    noise = compare_runs(rep.cold.tokens, rep.cold.logits, rep.oneshot.tokens, rep.oneshot.logits)
    assert rep.verdict == judge(w, noise, rep.note)
    assert rep.verdict.noise_max_logit_diff == noise.max_logit_diff


def test_never_asked_means_no_noise_run_even_when_warm_differs(engine, evaluations):
    rep = run_prompt(engine, TPL, VALS, reuse="compose", gen=GEN, oneshot=False)
    assert evaluations == ["cold"] and rep.oneshot is None and rep.verdict is not None


@pytest.mark.parametrize("reuse", ["prefix", "chain", "compose"])
def test_the_warm_breakdown_adds_up(engine, reuse):
    run_prompt(engine, TPL, VALS, reuse=reuse, gen=GEN, cold=False)
    rep = run_prompt(engine, TPL, {**VALS, "question": "how?"}, reuse=reuse, gen=GEN, cold=False)
    b = rep.breakdown
    assert b is not None and b.total_ms == rep.warm.ttft_ms
    parts = (b.restore_ms, b.evaluate_ms, b.first_token_ms)
    assert all(p >= 0 for p in parts)
    assert sum(parts) <= b.total_ms + 1e-6
    assert b.reused_tokens + b.evaluated_tokens == rep.prompt_tokens
    assert (b.reused_tokens, b.evaluated_tokens) == (rep.reused_tokens, rep.evaluated_tokens)
    assert 0 <= b.copied_tokens <= b.reused_tokens
    assert 1 <= b.batches <= b.evaluated_tokens
    text = b.describe()
    assert f"evaluate {b.evaluated_tokens:,} tokens in {b.batches} batch" in text
    assert "first token" in text


def test_a_chain_run_batches_at_segment_ends_and_prefix_mode_does_not(engine):
    chain = run_prompt(engine, TPL, VALS, reuse="chain", gen=GEN, cold=False)
    prefix = run_prompt(engine, TPL, {**VALS, "question": "how?"}, reuse="prefix", gen=GEN,
                        cold=False)
    # the tiny engine's n_batch (32) holds each run's evaluated part: prefix mode needs
    # ceil(evaluated / 32) batches, chain one more per segment start it passed (<c2>, question)
    assert prefix.breakdown.batches == -(-prefix.evaluated_tokens // 32)
    assert chain.breakdown.batches > -(-chain.evaluated_tokens // 32)
    assert chain.breakdown.batching_note == ""  # nothing measured (the tests set the kernel)


def _measured(flash_attn: bool, one_ms: float, split_ms: float) -> KernelChoice:
    t = KernelTiming(flash_attn, 1.0, one_ms, split_ms, 64)
    return KernelChoice(flash_attn, "measured", "test", (t, KernelTiming(not flash_attn, 1.0, 1, 1)))


def _use_measurement(monkeypatch, engine, choice: KernelChoice) -> None:
    """The engine's kernel measurement, as the run reads it (a property of the engine)."""
    monkeypatch.setattr(type(engine), "kernels", property(lambda self: choice))


def test_chain_says_when_its_small_batches_cost_more_than_the_segments_save(engine, monkeypatch):
    # 64 tokens cost 64 ms in one batch and 64 + 3 × 500 ms in SPLIT: a batch more costs 500
    # ms, far more than the few tokens the stored segments can save at 1 ms each
    _use_measurement(monkeypatch, engine,
                     _measured(engine.kernels.flash_attn, 64.0, 64.0 + (SPLIT - 1) * 500.0))
    rep = run_prompt(engine, TPL, VALS, reuse="chain", gen=GEN, cold=False)
    note = rep.breakdown.batching_note
    plain = -(-rep.evaluated_tokens // 32)
    extra = rep.breakdown.batches - plain
    assert extra > 0
    assert f"into {rep.breakdown.batches} batches where prefix mode makes {plain}" in note
    assert f"{extra} more at ≈500 ms each" in note
    # prefix mode cuts nothing, so says nothing; nor does chain when a batch costs nothing more
    assert run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN,
                      cold=False).breakdown.batching_note == ""
    _use_measurement(monkeypatch, engine, _measured(engine.kernels.flash_attn, 64.0, 64.0))
    again = run_prompt(engine, TPL, {**VALS, "c1": "another passage"}, reuse="chain", gen=GEN,
                       cold=False)
    assert again.breakdown.batching_note == ""


def test_batching_note_weighs_extra_batches_against_what_the_segments_save():
    cost = BatchCost(tokens=64, one_batch_ms=320.0, split=4, split_ms=620.0)  # 100 ms a batch
    assert cost.extra_ms_per_batch == 100.0 and cost.ms_per_token == 5.0
    note = batching_note(4, 1, 49, cost)  # 300 ms more against 245 ms saved
    assert "4 batches where prefix mode makes 1: 3 more at ≈100 ms each, ≈300 ms" in note
    assert "save ≈245 ms (49 tokens at 5.00 ms)" in note
    assert batching_note(4, 1, 61, cost) == ""  # 305 ms saved: worth it
    assert batching_note(1, 1, 0, cost) == ""  # no extra batch
    assert batching_note(4, 1, 0, None) == ""  # nothing measured


def test_the_breakdown_survives_the_project_file_and_the_benchmark_json(engine, evaluations):
    rep = run_prompt(engine, TPL, VALS, reuse="chain", gen=GEN)
    back = report_from_dict(json.loads(json.dumps(report_dict(rep))))
    assert back.breakdown == rep.breakdown
    rows = [Row(1, VALS), Row(2, {**VALS, "question": "how?"})]
    evaluations.clear()
    res = bench_rows(engine, TPL, rows, repeat=3, modes=("prefix", "chain"), gen=GEN)
    assert "oneshot" not in evaluations  # every row bit-identical: no noise run
    d = json.loads(json.dumps(res.as_dict()))
    for row in d["rows"]:
        b = row["breakdown"]
        assert b["reused_tokens"] + b["evaluated_tokens"] == row["prefix_tokens"] + row["suffix_tokens"]
        assert b["total_ms"] == row["warm_ms"]  # the median repeat's (three repeats)
    assert bench_from_dict(d).rows[0].breakdown == res.rows[0].breakdown
    evaluations.clear()
    bench_rows(engine, TPL, rows[:1], repeat=1, modes=("chain",), gen=GEN, noise=True)
    assert evaluations.count("oneshot") == 1


def test_kvprimer_run_prints_where_the_warm_time_went(tmp_path, tiny_model, capsys, evaluations):
    (tmp_path / "t.tmpl").write_text(TPL.source, encoding="utf-8")
    args = ["run", str(tmp_path / "t.tmpl"), "-m", str(tiny_model), "-t", "1", "-c", "1024",
            "-b", "32", "--max-tokens", "3", *(f"--set={k}={v}" for k, v in VALS.items())]
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("warm time: "))
    assert "copy " in line and " batch" in line and "first token" in line
    assert "noise run" not in out and evaluations == ["cold"]
    assert "verdict: bit-identical" in out
    evaluations.clear()
    assert main([*args, "--noise", "--json-out", str(tmp_path / "run.json")]) == 0
    assert "noise run (one-shot cold)" in capsys.readouterr().out
    d = json.loads((tmp_path / "run.json").read_text())
    assert evaluations == ["cold", "oneshot"] and d["oneshot"] is not None
    b = d["breakdown"]
    assert b["reused_tokens"] + b["evaluated_tokens"] == d["prompt_tokens"]
    assert b["total_ms"] == d["warm"]["ttft_ms"]


def test_measure_noise_is_a_run_option_kept_in_the_project():
    from app.engine import session_flows as flows
    from app.engine.session import Options, Session

    rows = [Row(1, VALS)]
    assert flows.run_plan(TPL, rows, Options()).oneshot is None  # only when warm and cold differ
    asked = Options(measure_noise=True)
    assert flows.run_plan(TPL, rows, asked).oneshot is True
    assert flows.run_plan(TPL, rows, asked, paths="warm").oneshot is False
    assert flows.run_plan(TPL, rows, Options(), oneshot=False).oneshot is False
    s = Session(asked)
    s.set_template(TPL.source)
    back = Session()
    back.apply_project(s.to_project())
    assert back.options.measure_noise is True


def test_the_breakdown_names_the_warm_runs_threads_not_the_cold_runs(tiny_model, monkeypatch):
    """Batch threads follow the load (thread_fit.py): when the machine gets busy between the
    warm run and the cold run that verifies it, the breakdown still says the warm run's count."""
    from app.engine import Engine, EngineConfig
    from app.engine.llama import thread_fit
    from app.engine.runs import prompt_runs
    from tests.engine.llama.test_thread_fit import Machine

    m = Machine()
    monkeypatch.setattr(thread_fit, "_SHARED", m.fit(n_cores=4))
    real_verify = prompt_runs.verify_run

    warm_threads = []

    def busy_then_verify(engine, *args, **kwargs):
        warm_threads.append(engine.slot_context.batch_threads)
        m.run(2.0, others=3.0)  # other programs take 3 of the 4 cores before the cold run
        return real_verify(engine, *args, **kwargs)

    monkeypatch.setattr(prompt_runs, "verify_run", busy_then_verify)
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=0))
    try:
        m.run(2.0, others=0.0)
        rep = run_prompt(eng, TPL, VALS, reuse="prefix", gen=GEN)
        cold_threads = eng.slot_context.batch_threads
    finally:
        eng.close()
    assert cold_threads < warm_threads[0]  # the cold run's batches got fewer threads ...
    assert rep.breakdown.batch_threads == warm_threads[0]  # ... the warm run's are said
