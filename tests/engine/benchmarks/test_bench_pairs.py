"""Modes compared side by side: a benchmark runs every mode on a row before the next row, in an
order that balances (ABBA for two modes), records the machine's load during each call, flags a
row measured under load, and takes its headline against prefix mode from each row's pairs."""
from __future__ import annotations

import pytest

from app.engine import GenerationConfig, Template
from app.engine.benchmarks import bench_rows as bench_module
from app.engine.benchmarks.bench_rows import BenchResult, BenchRow, bench_summary
from app.engine.benchmarks.mode_pairs import bench_order, mode_order
from app.engine.llama.machine_load import LoadMeter
from app.engine.prompts.rows import Row
from .test_bench_plan import kept_plans

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
ROWS = [Row(i + 1, {"c": f"the world is question {i}", "q": "why?"}) for i in range(4)]
GEN = GenerationConfig(max_tokens=2)


def test_two_modes_run_abba_and_three_modes_balance_every_place():
    assert [mode_order(("A", "B"), k) for k in range(4)] == [("A", "B"), ("B", "A"),
                                                             ("B", "A"), ("A", "B")]
    three = [mode_order(("A", "B", "C"), k) for k in range(6)]
    assert len(set(three)) == 6  # every order once
    for place in range(3):
        assert sorted(o[place] for o in three) == ["A", "A", "B", "B", "C", "C"]
    # a repeat is a round of its own: with two repeats a row runs A B B A, the next B A A B
    steps = bench_order(2, ("A", "B"), 2)
    assert [(s.row, s.mode) for s in steps] == [(0, "A"), (0, "B"), (0, "B"), (0, "A"),
                                                 (1, "B"), (1, "A"), (1, "A"), (1, "B")]


def test_a_benchmark_runs_the_modes_of_each_row_side_by_side(engine, monkeypatch):
    calls = []
    real = bench_module.run_prompt

    def record(eng, tpl, values, **kw):
        calls.append((values["c"][-1], kw["reuse"]))
        return real(eng, tpl, values, **kw)

    monkeypatch.setattr(bench_module, "run_prompt", record)
    # a quiet machine (a busy one could have a round measured again)
    res = bench_module.bench_rows(engine, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                                  load_meter=Readings([0.0]))
    assert calls == [("0", "prefix"), ("0", "chain"), ("1", "chain"), ("1", "prefix"),
                     ("2", "chain"), ("2", "prefix"), ("3", "prefix"), ("3", "chain")]
    # the results still read mode by mode, each row's warm runs kept in round order
    assert [(r.reuse, r.row) for r in res.rows] == [(m, n) for m in ("prefix", "chain")
                                                    for n in (1, 2, 3, 4)]
    assert all(len(r.warm_runs_ms) == 1 and r.warm_runs_ms[0] == r.warm_ms for r in res.rows)
    assert all(r.verdict().exact for r in res.rows)
    chain = [r for r in res.rows if r.reuse == "chain"]
    prefix = {r.row: r for r in res.rows if r.reuse == "prefix"}
    for r in chain:
        assert r.vs_prefix == pytest.approx(r.warm_ms / prefix[r.row].warm_ms)


def row(number, mode, runs, reused=100, **kw):
    return BenchRow(row=number, reuse=mode, warm_runs_ms=runs, warm_ms=sorted(runs)[len(runs) // 2],
                    reused_tokens=reused, equivalence="bit-identical", tokens_equal=True, **kw)


def test_the_headline_comes_from_the_pairs_not_from_the_phases():
    # a busy spell slowed rows 2 and 3 in both modes alike: the medians over rows say chain is
    # 4x prefix, each row's own pair says 1.5, 1.0 and 1.0
    rows = [row(1, "prefix", [100.0]), row(2, "prefix", [400.0]), row(3, "prefix", [100.0]),
            row(1, "chain", [150.0]), row(2, "chain", [400.0]),
            row(3, "chain", [400.0], reused=300)]
    rows[2].warm_runs_ms = [400.0]  # (prefix row 3 also ran in the busy spell)
    res = BenchResult(model={}, rows=rows, modes=("prefix", "chain"))
    paired = res.summary()["paired"]["chain_vs_prefix"]
    assert paired["ratio"] == pytest.approx(1.0) and paired["rows"] == 3
    # rows 1 and 2 reused only what prefix mode reused
    assert paired["static_rows_ratio"] == pytest.approx(1.25) and paired["static_rows"] == 2
    text = bench_summary(res)
    assert "chain ×1.00 of prefix's warm time, side by side (median of 3 rows" in text
    assert "×1.25 on the 2 reusing no more than prefix" in text


def test_repeats_pair_round_by_round():
    rows = [row(1, "prefix", [100.0, 300.0, 100.0]), row(1, "compose", [50.0, 150.0, 60.0])]
    res = BenchResult(model={}, rows=rows, modes=("prefix", "compose"), repeat=3)
    assert res.paired()[0].ratio == pytest.approx(0.5)


class Readings:
    """LoadMeters whose readings the test gives: other programs' busy CPU seconds per call."""

    def __init__(self, busy_cores_per_call):
        self.per_call = list(busy_cores_per_call)
        self.calls = 0

    def __call__(self):
        cores = self.per_call[min(self.calls, len(self.per_call) - 1)]
        self.calls += 1
        t = {"clock": 0.0, "busy": 0.0}

        def clock():
            return t["clock"]

        def busy():
            # each reading: one second of wall time in which others used ``cores`` cores
            t["clock"] += 0.5
            t["busy"] += cores * 0.5
            return t["busy"]
        return LoadMeter(busy_s=busy, own_s=lambda: 0.0, clock=clock, n_cores=2)


def test_a_row_measured_under_load_is_flagged(engine, capsys):
    # rows 1, 3, 4 quiet; both of row 2's calls while others used 1.5 of 2 cores (the same
    # load on both sides: nothing to measure again)
    readings = Readings([0.0, 0.0, 1.5, 1.5, 0.0, 0.0, 0.0, 0.0])
    res = bench_module.bench_rows(engine, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                                  load_meter=readings)
    assert readings.calls == 8
    assert res.rows_under_load() == [2]
    flagged = [(r.row, r.reuse) for r in res.rows if r.under_load]
    assert sorted(flagged) == [(2, "chain"), (2, "prefix")]
    assert not any(r.remeasured for r in res.rows)
    assert max(r.load for r in res.rows) == pytest.approx(0.75)
    assert res.summary()["rows_under_load"] == [2]
    assert "measured under load (other programs used over a quarter of the cores): row 2" \
        in bench_summary(res)


def test_the_benchmark_panel_shows_the_paired_headline_and_the_busy_row(qtbot):
    from app.engine.session import Session
    from app.ui.bench_cells import UNDER_LOAD_COLOR
    from app.ui.bench_view import BenchView

    s = Session()
    v = BenchView(s)
    qtbot.addWidget(v)
    rows = [row(1, "prefix", [100.0], load=0.02),
            row(2, "prefix", [400.0], load=0.8, under_load=True),
            row(1, "chain", [100.0], load=0.01, vs_prefix=1.0),
            row(2, "chain", [400.0], load=0.1, vs_prefix=1.0, remeasured=1)]
    s.set_bench(BenchResult(model={}, rows=rows, modes=("prefix", "chain")))
    col = {v.table.horizontalHeaderItem(c).text(): c for c in range(v.table.columnCount())}
    busy = v.table.item(1, col["load"])
    assert busy.text() == "80% busy" and busy.foreground().color().name() == UNDER_LOAD_COLOR
    assert "other programs" in busy.toolTip()
    assert v.table.item(0, col["load"]).text() == "2%"
    again = v.table.item(3, col["load"])  # chain's row 2: its round was measured again
    assert again.text() == "10% ↻" and again.toolTip() == "re-measured: load changed"
    assert v.table.item(2, col["vs prefix (×)"]).text() == "×1.00"
    assert v.table.item(0, col["vs prefix (×)"]).text() == ""
    text = v.summary.text()
    assert "chain ×1.00 of prefix's warm time, side by side (median of 2 rows)" in text
    assert "measured under load" in text and "row 2" in text


def recorded_reports(monkeypatch) -> list:
    """The reports of every call from now on, in order: (row's last character, mode, report)."""
    got = []
    real = bench_module.run_prompt

    def record(eng, tpl, values, **kw):
        rep = real(eng, tpl, values, **kw)
        got.append((values["c"][-1], kw["reuse"], rep))
        return rep

    monkeypatch.setattr(bench_module, "run_prompt", record)
    return got


def test_a_pair_straddling_a_change_of_load_is_measured_again(engine, monkeypatch):
    # row 2's chain run quiet, its prefix run beside 1.5 busy cores: the round runs again
    # (quiet), and row 2's pair is the new one
    calls = recorded_reports(monkeypatch)
    readings = Readings([0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    res = bench_module.bench_rows(engine, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                                  load_meter=readings)
    assert readings.calls == 10
    assert [(c, m) for c, m, _r in calls] == [
        ("0", "prefix"), ("0", "chain"), ("1", "chain"), ("1", "prefix"),
        ("1", "chain"), ("1", "prefix"),  # measured again
        ("2", "chain"), ("2", "prefix"), ("3", "prefix"), ("3", "chain")]
    again = {m: r for c, m, r in calls[4:6]}
    row2 = {r.reuse: r for r in res.rows if r.row == 2}
    for mode, r in row2.items():
        assert r.warm_runs_ms == [again[mode].warm.ttft_ms]
        assert r.remeasured == 1 and not r.load_changed and not r.under_load
        assert r.load_words() == "re-measured: load changed"
    assert row2["chain"].vs_prefix == pytest.approx(again["chain"].warm.ttft_ms
                                                    / again["prefix"].warm.ttft_ms)
    assert not any(r.remeasured for r in res.rows if r.row != 2)
    assert all(r.verdict().exact for r in res.rows)  # every row still bit-identical
    assert res.summary()["rows_remeasured"] == [2] and res.summary()["rows_load_changed"] == []
    assert "re-measured (load changed between a row's side-by-side runs): row 2" \
        in bench_summary(res)


def test_a_pair_tried_twice_more_and_still_straddling_is_flagged(engine, monkeypatch):
    # row 1's prefix runs always quiet, its chain runs always busy: two more tries, then the
    # row is flagged; the plan counted every warm run made again
    plans = kept_plans(monkeypatch)
    readings = Readings([0.0, 1.5] * 3 + [0.0] * 6)
    res = bench_module.bench_rows(engine, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                                  load_meter=readings)
    assert readings.calls == 12
    row1 = [r for r in res.rows if r.row == 1]
    assert all(r.remeasured == 2 and r.load_changed for r in row1)
    assert "still changed" in row1[0].load_words()
    assert res.rows_remeasured() == ([1], [1])
    assert "still changed on 1: less sure" in bench_summary(res)
    plan, = plans
    first = plan.steps[1]  # the round's last call, where its tries ran
    assert sorted(p.kind for p in first.passes).count("remeasure") == 4
    assert sorted(d.kind for d in first.done).count("remeasure") == 4
    assert plan.pass_kinds() == plan.run_kinds()


class SpellOverTheWarmRun:
    """LoadMeters on a fake machine whose other programs run only while a warm run does: each
    batch of a warm run takes 0.3 s beside 1.5 busy cores, each of any other pass 3 s quiet
    (the cold run, ten times as long). Averaged over a call that is 0.1 of the cores or less."""

    def __init__(self):
        self.t = {"clock": 0.0, "busy": 0.0}
        self.meters = []

    def progress(self, p):  # the time up to the next report is the reported pass's
        dt, cores = (0.3, 1.5) if p.stage == "warm" else (3.0, 0.0)
        self.t["clock"] += dt
        self.t["busy"] += cores * dt

    def __call__(self):
        t = self.t
        self.meters.append(LoadMeter(busy_s=lambda: t["busy"], own_s=lambda: 0.0,
                                     clock=lambda: t["clock"], n_cores=2))
        return self.meters[-1]


def test_a_busy_spell_over_part_of_a_call_flags_the_row(engine):
    from app.engine.task_state import TaskState

    spell = SpellOverTheWarmRun()
    res = bench_module.bench_rows(engine, TPL, ROWS[:2], modes=("prefix", "chain"), gen=GEN,
                                  load_meter=spell, task=TaskState(on_progress=spell.progress))
    assert res.rows_under_load() == [1, 2]
    assert all(r.under_load and r.load > 0.25 for r in res.rows)
    assert not any(r.remeasured for r in res.rows)  # both sides of each pair alike
    # over a whole call with a cold run the spell averages out below a quarter (a call that
    # found its cold run made is its warm run alone): read so, the flag missed it
    assert len(spell.meters) == 4
    diluted = [m for m in spell.meters if m.result().share < 0.25]
    assert len(diluted) >= 2 and all(m.result("warm").share > 0.25 for m in diluted)


class ThreadsByLoad(Readings):
    """Readings whose calls also see the generation thread count the load gives them: a
    busy call generates on one thread, a quiet one on two; the tries made again see
    ``again`` (a third count, that no first try used)."""

    def __init__(self, busy_cores_per_call, fit, again=None):
        super().__init__(busy_cores_per_call)
        self.fit, self.again = fit, dict(again or {})

    def __call__(self):
        cores = self.per_call[min(self.calls, len(self.per_call) - 1)]
        self.fit.count = self.again.get(self.calls, 1 if cores > 0.5 else 2)
        return super().__call__()


def test_a_round_measured_again_runs_its_warm_runs_only(tiny_model, monkeypatch):
    # the load changed, so auto threads would give the row's later call and its tries other
    # generation counts: a cold run's bits depend on it (its key holds it), so the row's cold
    # and noise runs would be made again, which the plan does not count. A row generates on
    # the count its first call began with: its tries are warm runs only, the plan is what
    # ran, and every row is still bit-identical
    from app.engine import Engine, EngineConfig
    from app.engine.llama import native, thread_fit
    from app.engine.runs import cold_reference

    class ScriptedFit(thread_fit.ThreadFit):
        count = 2

        def threads(self):
            return self.count

    fit = ScriptedFit(n_cores=3, busy_s=lambda: 0.0, own_s=lambda: 0.0, clock=lambda: 0.0)
    monkeypatch.setattr(thread_fit, "_SHARED", fit)
    for module in (native, cold_reference):
        monkeypatch.setattr(module, "llama_default_threads", lambda: 3)
    plans = kept_plans(monkeypatch)
    made = []
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=0))
    try:
        real = eng.cold.reference

        def count(key, *args, **kw):
            made.append(key)
            return real(key, *args, **kw)

        monkeypatch.setattr(eng.cold, "reference", count)
        # row 2 (calls 2, 3): chain quiet, prefix beside 1.5 busy cores; its try made again
        # (calls 4, 5) quiet, on three threads
        readings = ThreadsByLoad([0.0, 0.0, 0.0, 1.5] + [0.0] * 6, fit, again={4: 3, 5: 3})
        res = bench_module.bench_rows(eng, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                                      noise=True, load_meter=readings)
    finally:
        eng.close()
    assert readings.calls == 10
    assert [r.row for r in res.rows if r.remeasured] == [2, 2]
    plan, = plans
    assert plan.pass_kinds() == plan.run_kinds(), [
        (st.label, k, r) for st, k, r in zip(plan.steps, plan.pass_kinds(), plan.run_kinds())
        if k != r]
    again = plan.steps[3]  # row 2's last call: the round's tries ran there
    assert sorted(d.kind for d in again.done) == ["remeasure", "remeasure", "warm"]
    # every cold and noise run made once, each row's on one thread count
    assert len(made) == len(set(made))
    assert len({(k.prompt, k.gen_threads) for k in made}) == len({k.prompt for k in made})
    assert all(r.verdict().exact for r in res.rows)
