"""A benchmark's time left holds: the job plans every pass before it starts (prime, warm, cold,
noise, modules, each with its tokens), times each from the machine's speed now and each kind's
cost against it, and learns from the passes finished. A scripted job of 10 rows in three modes,
with passes as long as the default model's, checks the time left at 25%, 50% and 75% of the
actual time, also after a slow start; the tiny model checks that the plan is exactly the
passes each call of the benchmark really runs."""
from __future__ import annotations

import os

import numpy as np
import pytest

from app.engine import GenerationConfig, Template, run_prompt
from app.engine.benchmarks import bench_rows as bench_module
from app.engine.benchmarks.load_rounds import LoadWatch
from app.engine.benchmarks.mode_pairs import bench_order
from app.engine.llama.machine_load import LoadMeter
from app.engine.progress_plan import DonePass, JobPlan, PlannedPass, PlanStep, work_units
from app.engine.prompts.rows import Row
from app.engine.runs.recompute_choice import default_recompute
from app.engine.task_state import Progress, TaskState

MODES = ("prefix", "chain", "compose")
PREFIX, K, GEN = 1761, 5e-5, 8
# seconds per prefill unit, per kind of pass, and per generated token (a 1B model, 2 cores)
TRUE_RATE = {"prime": 0.011, "cold": 0.011, "oneshot": 0.011, "warm": 0.014, "module": 0.012}
TRUE_GEN, TRUE_OVERHEAD = 0.12, 0.4


def scripted_job(seed: int):
    """(plan, true passes per step): 10 rows of 3 modes as bench_passes plans them, and what
    really runs: chain reuses more than foreseen on later rows, two cold runs were kept."""
    rng = np.random.default_rng(seed)
    order = bench_order(10, MODES, 1)
    suffix = rng.integers(120, 260, size=10)
    steps, truth, colds = [], [], set()
    for i, s in enumerate(order):
        n = PREFIX + int(suffix[s.row])
        start = {"prefix": PREFIX, "chain": PREFIX, "compose": n - 20}[s.mode]
        planned = [PlannedPass("prime", 0, PREFIX)] if i == 0 else []
        if s.mode == "compose":
            planned += [PlannedPass("module", PREFIX, PREFIX + 80),
                        PlannedPass("module", PREFIX, PREFIX + 60)]
        planned.append(PlannedPass("warm", start, n, GEN))
        if (s.row, start) not in colds:
            colds.add((s.row, start))
            planned.append(PlannedPass("cold", 0, n, GEN))
        if s.mode == "compose":
            planned.append(PlannedPass("oneshot", 0, n, GEN))
        real = []
        for p in planned:
            if p.kind == "cold" and s.row in (3, 8) and s.mode != order[3 * s.row].mode:
                continue  # kept from an earlier run: planned, not run
            st = p.start
            if p.kind == "warm" and s.mode == "chain" and s.row >= 5:
                st = n - 40  # chain found more of the prompt cached than foreseen
            real.append(DonePass(p.kind, st, p.end, p.generate, 0.0))
        steps.append(PlanStep(f"row {s.row + 1} · {s.mode}", planned))
        truth.append(real)
    return JobPlan(steps, K), truth


def run_scripted(clock, plan, truth, seed, labels=None, slow=lambda t: 1.0, free=None):
    """Run the job on the fake clock, reporting each pass in batches as the engine does;
    returns the (time, time left) of every report and the job's whole time. ``free(t)``: the
    share of the cores other programs leave the job at t (it then runs that much slower), read
    to the plan as bench_rows reads it (after each batch, and over each step)."""
    rng = np.random.default_rng(seed + 100)
    seen: list[tuple[float, float | None]] = []
    task = TaskState(on_progress=lambda p: seen.append((clock.now, p.job.eta_s if p.job else None)))
    t0 = clock.now
    task.begin_job("bench", len(truth), plan=plan)
    for i, passes in enumerate(truth):
        label = plan.steps[i].label if plan is not None else labels[i]
        task.begin_item(i // 3 + 1, 10, part=label.split(" · ")[1])
        done, step_free, step_s = [], 0.0, 0.0
        for d in passes:
            f = slow(clock.now - t0) * (1 + rng.uniform(-0.08, 0.08))
            pre = 0.0
            for a in range(d.start, d.end, 256):  # batches of 256
                b = min(a + 256, d.end)
                share = free(clock.now - t0) if free else 1.0
                dt = TRUE_RATE[d.kind] * work_units(a, b, K) * f / share
                clock.now += dt
                pre += dt
                step_free, step_s = step_free + share * dt, step_s + dt
                if free and plan is not None:
                    plan.note_load(now=share)
                task.report(d.kind, b - d.start, d.end - d.start)
            share = free(clock.now - t0) if free else 1.0
            g = d.generate * TRUE_GEN * f / share
            clock.now += g
            step_free, step_s = step_free + share * g, step_s + g
            done.append(DonePass(d.kind, d.start, d.end, d.generate, pre, g))
            # the prime gives the first speed, as bench_rows does
            if d.kind == "prime" and plan is not None and plan.prefill_prior is None:
                plan.prefill_prior = pre / plan.units(d)
        clock.now += TRUE_OVERHEAD * (1 + rng.uniform(-0.2, 0.2))
        if free and plan is not None and step_s > 0:
            plan.note_load(step=step_free / step_s, now=free(clock.now - t0))
        task.end_item(done)
    return seen, clock.now - t0, t0


def errors_at(seen, total, t0, marks=(0.25, 0.5, 0.75)):
    out = []
    for m in marks:
        t, eta = next((t, eta) for t, eta in seen if t - t0 >= m * total)
        actual = total - (t - t0)
        out.append((eta - actual) / actual)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_time_left_holds_at_a_quarter_half_and_three_quarters(clock, seed):
    plan, truth = scripted_job(seed)
    seen, total, t0 = run_scripted(clock, plan, truth, seed)
    assert total > 300  # minutes of work, as on the default model
    for err in errors_at(seen, total, t0):
        assert abs(err) <= 0.20, errors_at(seen, total, t0)


@pytest.mark.parametrize("seed", range(3))
def test_time_left_holds_when_the_machine_is_busy_for_a_while(clock, seed):
    # a third slower for a minute around the middle, as when another program runs
    plan, truth = scripted_job(seed)
    seen, total, t0 = run_scripted(clock, plan, truth, seed,
                                   slow=lambda t: 1.33 if 150 <= t < 210 else 1.0)
    for err in errors_at(seen, total, t0):
        assert abs(err) <= 0.20, errors_at(seen, total, t0)


SPELL_END = 240


def spell(t: float) -> float:
    """Two busy processes from 60 s to 240 s into the job: it keeps 0.4 of the cores."""
    return 0.4 if 60 <= t < SPELL_END else 1.0


@pytest.mark.parametrize("seed", range(3))
def test_time_left_recovers_as_soon_as_a_busy_spell_ends(clock, seed):
    # each step's speed is scaled to a quiet machine's by the cores it had, and the steps
    # left are timed with the cores free now: once the spell ends, the slow steps it left
    # in the last few do not hold the estimate up
    plan, truth = scripted_job(seed)
    seen, total, t0 = run_scripted(clock, plan, truth, seed, free=spell)
    after = [t for t, _eta in seen if t - t0 >= SPELL_END]
    assert after and total > 250
    marks = [m for m in (0.25, 0.5, 0.75) if m * total >= SPELL_END] + [
        (after[0] - t0 + d) / total for d in (1, 20, 40)]
    for err in errors_at(seen, total, t0, marks):
        assert abs(err) <= 0.20, errors_at(seen, total, t0, marks)


def test_without_the_cores_free_the_estimate_misses_after_a_busy_spell(clock):
    """The same spell with no readings of the load (the plan's speeds as measured): the
    median of the last steps still holds the slow steps after the spell ends."""
    plan, truth = scripted_job(0)
    seen, total, t0 = run_scripted(clock, plan, truth, 0,
                                   slow=lambda t: 1 / spell(t))
    after = next(t for t, _eta in seen if t - t0 >= SPELL_END)
    marks = [(after - t0 + d) / total for d in (1, 20, 40)]
    assert max(abs(e) for e in errors_at(seen, total, t0, marks)) > 0.40


def test_a_step_on_a_busy_machine_counts_at_a_quiet_machines_speed():
    passes = [PlannedPass("warm", 100, 200, 0), PlannedPass("cold", 0, 200, 0)]
    plan = JobPlan([PlanStep(str(i), list(passes)) for i in range(4)], k=0.0)
    t = 0.0
    for free in (1.0, 0.5):  # the second step had half the cores: twice as long
        plan.begin(t)
        plan.note_load(step=free, now=free)
        t += 3.0 / free
        plan.end(t, [DonePass("warm", 100, 200, 0, 1.0 / free),
                     DonePass("cold", 0, 200, 0, 2.0 / free)])
    assert plan.prefill_rate("cold") == pytest.approx(0.01 / 0.5)  # half the cores now
    plan.note_load(now=1.0)  # the spell ended
    assert plan.prefill_rate("cold") == pytest.approx(0.01)
    assert plan.time_left(t) == pytest.approx(2 * 3.0)


@pytest.mark.parametrize("seed", range(6))
def test_time_left_holds_after_a_slow_start(clock, seed):
    # the first minute at little more than half speed (a new context's allocations, the
    # weights paged in, another program finishing): speeds remembered with a slow decay told
    # a quarter too much at 25%; the median of the last steps' speeds follows the machine
    plan, truth = scripted_job(seed)
    seen, total, t0 = run_scripted(clock, plan, truth, seed,
                                   slow=lambda t: 1.8 if t < 60 else 1.0)
    for err in errors_at(seen, total, t0):
        assert abs(err) <= 0.20, errors_at(seen, total, t0)


def test_one_slow_step_does_not_move_the_speed():
    passes = [PlannedPass("warm", 100, 200, 0), PlannedPass("cold", 0, 200, 0)]
    plan = JobPlan([PlanStep(str(i), list(passes)) for i in range(6)], k=0.0)
    t = 0.0
    for i, f in enumerate([1.0, 1.0, 3.0, 1.0]):  # the third step three times slower
        plan.begin(t)
        t += 3.0 * f
        plan.end(t, [DonePass("warm", 100, 200, 0, 1.0 * f), DonePass("cold", 0, 200, 0, 2.0 * f)])
    assert plan.prefill_rate("cold") == pytest.approx(0.01)
    assert plan.prefill_rate("warm") == pytest.approx(0.01)  # 1 s for 100 units, as cold
    assert plan.time_left(t) == pytest.approx(2 * 3.0)


def test_each_kind_costs_against_the_others_in_its_own_steps():
    # the machine halves its speed; warm passes cost twice cold's per unit throughout: the
    # ratio holds whatever the speed, and the level is the machine's now
    passes = [PlannedPass("warm", 100, 200, 0), PlannedPass("cold", 0, 200, 0)]
    plan = JobPlan([PlanStep(str(i), list(passes)) for i in range(8)], k=0.0)
    t = 0.0
    for f in [1.0, 1.0, 2.0, 2.0, 2.0]:
        plan.begin(t)
        t += 4.0 * f
        plan.end(t, [DonePass("warm", 100, 200, 0, 2.0 * f), DonePass("cold", 0, 200, 0, 2.0 * f)])
    assert plan.prefill_rate("warm") / plan.prefill_rate("cold") == pytest.approx(2.0)
    assert plan.prefill_rate("cold") == pytest.approx(0.02)
    assert plan.time_left(t) == pytest.approx(3 * 8.0)


def test_without_the_plan_the_mean_of_the_rows_finished_misses(clock):
    """The same job timed by the mean of the items finished (no plan) misses the goal."""
    plan, truth = scripted_job(0)
    seen, total, t0 = run_scripted(clock, None, truth, 0, [s.label for s in plan.steps])
    assert max(abs(e) for e in errors_at(seen, total, t0)) > 0.20


def test_a_planned_pass_not_run_and_a_pass_not_planned_are_learned():
    passes = [PlannedPass("warm", 0, 100, 2), PlannedPass("cold", 0, 100, 2)]
    plan = JobPlan([PlanStep("a", list(passes)), PlanStep("b", list(passes))], k=0.0,
                   prefill_prior=0.01)
    assert plan.time_left(0.0) == pytest.approx(2 * (2 + 2 * 0.03 * 2))  # the guess for a token
    plan.begin(0.0)
    # the cold run was kept (not run); a noise run, not planned, ran instead
    plan.end(5.0, [DonePass("warm", 0, 100, 2, 1.0, 0.2), DonePass("oneshot", 0, 100, 2, 2.0, 0.2)])
    assert plan.ran_share("cold") == 0.0 and plan.ran_share("warm") == 1.0
    # the step's time outside its planned kinds (the noise run too) counts as overhead
    assert plan.overhead() == pytest.approx(5.0 - 1.2)
    assert plan.time_left(5.0) == pytest.approx(1.0 + 0.2 + 5.0 - 1.2)


# ---- on the tiny model: the plan counts every pass the benchmark runs -----------------------

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<a>\n<b>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")


def rows_with_repeats():
    values = [("the world is round", "and blue", "why?"), ("the world is flat", "and blue", "how?"),
              ("the world is round", "and blue", "why?"), ("", "empty", "what?"),
              ("a new passage here", "and green", "why?")]
    return [Row(i + 1, {"a": a, "b": b, "q": q}) for i, (a, b, q) in enumerate(values)]


def kept_plans(monkeypatch) -> list:
    """The plans the benchmarks make from now on, kept."""
    plans = []
    real = bench_module.plan_bench

    def keep(*args, **kwargs):
        plan, start = real(*args, **kwargs)
        plans.append(plan)
        return plan, start

    monkeypatch.setattr(bench_module, "plan_bench", keep)
    return plans


def mismatches(plan) -> list:
    """The steps whose planned passes (kind, positions) differ from those they ran."""
    def key(passes):
        return sorted((p.kind, p.start, p.end) for p in passes or [])
    return [(st.label, key(st.passes), key(st.done)) for st in plan.steps
            if key(st.passes) != key(st.done)]


@pytest.mark.parametrize("recompute", [default_recompute(), 0])
def test_the_plan_is_exactly_the_passes_each_call_runs(engine, monkeypatch, recompute):
    """Prefix, chain and compose (at the default recompute share, and none), two repeats, a
    row repeating an earlier one and rows sharing their start (chain reuses part of them):
    each call runs exactly the passes planned for it, positions and all. A second benchmark
    on the same engine finds every cold run kept from the first: it plans none, runs none."""
    plans = kept_plans(monkeypatch)
    for _job in range(2):
        res = bench_module.bench_rows(engine, TPL, rows_with_repeats(), modes=MODES, repeat=2,
                                      gen=GenerationConfig(max_tokens=2), recompute=recompute)
        assert not res.cancelled
        assert mismatches(plans[-1]) == []
    # until the first call ends, the passes are timed at the prime's speed
    prime = next(d for d in plans[0].steps[0].done if d.kind == "prime")
    assert plans[0].prefill_prior == pytest.approx(prime.prefill_s / plans[0].units(prime))
    first, second = (sorted(k for step in p.run_kinds() for k in step) for p in plans)
    assert first.count("cold") >= 4 and first.count("module") >= 2
    assert "cold" not in second and "oneshot" not in second and "prime" not in second
    assert second.count("module") == first.count("module")  # the cache starts from the prefix
    # the composed rows differ from their cold runs: their noise run is planned and made
    assert first.count("oneshot") == 3


@pytest.mark.parametrize("noise", [False, True])
def test_the_plan_counts_every_pass_the_benchmark_runs(engine, monkeypatch, noise):
    plans = kept_plans(monkeypatch)
    seen: list[Progress] = []
    res = bench_module.bench_rows(engine, TPL, rows_with_repeats(), modes=MODES, repeat=2,
                                  gen=GenerationConfig(max_tokens=2), noise=noise,
                                  task=TaskState(on_progress=seen.append))
    plan, = plans
    assert not res.cancelled and res.summary()["failed_rows"] == 3  # the blank row, each mode
    kinds = plan.pass_kinds()
    ran = plan.run_kinds()
    assert all(r is not None for r in ran)
    assert kinds == ran, [(st.label, k, r) for st, k, r in zip(plan.steps, kinds, ran) if k != r]
    flat = [k for step in ran for k in step]
    assert flat.count("prime") == 1 and flat.count("warm") == 4 * 3 * 2
    assert "module" in flat and "cold" in flat
    # the noise run: once per prompt when asked (row 3 repeats row 1), else where compose
    # placed two modules and differs from the cold run
    assert flat.count("oneshot") == 3 if noise else 0 < flat.count("oneshot") <= 3
    # a repeated prompt's cold runs are kept: row 3 evaluates no cold run
    row3 = [k for st, k in zip(plan.steps, ran) if st.label.startswith("row 3 ")]
    assert not any("cold" in k for k in row3)
    assert seen[-1].job.eta_s == pytest.approx(0.0) and seen[-1].fraction == pytest.approx(1.0)


RUNS = {"none": lambda n: [], "all": lambda n: [(0, n)], "halves": lambda n: [(0, n // 2), (n // 2, n)],
        "middle": lambda n: [(2, 5)], "first": lambda n: [(0, 3)],
        "as chosen": None}  # compose's own choice: the first module in place kept


@pytest.mark.parametrize("runs", sorted(RUNS))
def test_a_composed_row_runs_the_history_its_plan_foresees(engine, monkeypatch, runs):
    """One function, module_compose.composed_history, plans a composed row's batch starts;
    compose evaluates its parts by it, and the benchmark's plan asks it: the history the run
    leaves is the one planned, whatever tokens are recomputed (whole modules recomputed are
    evaluated as one run across their ends)."""
    from app.engine.benchmarks import bench_passes
    from app.engine.prompts.prompt_segments import prompt_segments
    from app.engine.runs import module_compose
    from app.engine.runs.recompute_choice import Recompute

    chosen = RUNS[runs]
    if chosen is not None:
        def forced(sizes, _setting, _in_place):
            return [chosen(n) for n in sizes]
        monkeypatch.setattr(module_compose, "row_runs", forced)
        monkeypatch.setattr(bench_passes, "row_runs", forced)
    values = rows_with_repeats()[0].values
    prefix = engine.tokenize(TPL.prefix_prompt())
    engine.prime_node(TPL)
    tokens = engine.tokenize(TPL.fill(values))
    segs = prompt_segments(engine.tokenize, TPL, values, tokens)
    foresight = bench_passes._Foresight(engine, GenerationConfig(max_tokens=2), Recompute(share=0.1),
                                        prefix, bench_passes._prefix_cuts(engine, prefix,
                                                                          len(prefix), None))
    planned = foresight.compose_history(segs, len(tokens))
    rep = run_prompt(engine, TPL, values, reuse="compose", recompute="10%",
                     gen=GenerationConfig(max_tokens=2), cold=False)
    assert rep.warm.starts == planned
    modules = segs[1:-1]
    head = [c for c in engine.cache.lookup(prefix).node.all_cuts() if c < segs[0].end]
    assert planned == module_compose.composed_history(
        engine.batching, head, modules, foresight.module_runs(segs), segs[-1].start,
        len(tokens))
    if runs == "all":  # the modules' runs meet: one evaluation, no cut where the second starts
        assert modules[1].start not in planned


class NicedSuite:
    """A fake /proc/stat on 2 cores: the job at normal priority, a busy process at normal
    priority during the spell, and a test suite at nice 19 that takes whatever the job leaves
    (it never slows the job: the scheduler gives it only the idle CPU)."""

    def __init__(self, clock):
        self.clock, self.own, self.user, self.nice = clock, 0.0, 0.0, 0.0

    def run(self, seconds: float, own_cores: float, busy_cores: float) -> None:
        self.clock.now += seconds
        self.own += own_cores * seconds
        self.user += (own_cores + busy_cores) * seconds
        self.nice += max(0.0, 2.0 - own_cores - busy_cores) * seconds

    def stat_line(self) -> str:
        tick = os.sysconf("SC_CLK_TCK")
        return f"cpu  {round(self.user * tick)} {round(self.nice * tick)} 0 0 0 0 0 0 0 0\n"

    def meter(self) -> LoadMeter:
        return LoadMeter(own_s=lambda: self.own, clock=lambda: self.clock.now, n_cores=2)


@pytest.mark.parametrize("seed", range(3))
def test_time_left_recovers_after_a_spell_beside_a_niced_suite(clock, monkeypatch, seed):
    """The job read through its LoadMeters as bench_rows reads it. During the spell the
    job's thread fit gave it one thread, and after it the niced suite, taking the core that
    left free between batches, kept it there: the job generates on one core, the suite fills
    the other. Counted as others' load, that read as half the machine busy at the end of
    every call, and the steps after the spell were timed at half their speed."""
    from app.engine.llama import machine_load

    suite = NicedSuite(clock)
    monkeypatch.setattr(machine_load, "_stat_line", suite.stat_line)
    monkeypatch.setattr(machine_load, "runs_niced", lambda: False)
    plan, truth = scripted_job(seed)
    rng = np.random.default_rng(seed + 100)
    seen: list[tuple[float, float | None]] = []
    task = TaskState(on_progress=lambda p: seen.append((clock.now, p.job.eta_s if p.job else None)))
    watch = LoadWatch(plan)
    task.on_report = watch.report
    t0 = clock.now
    task.begin_job("bench", len(truth), plan=plan)
    for i, passes in enumerate(truth):
        task.begin_item(i // 3 + 1, 10, part=plan.steps[i].label.split(" · ")[1])
        meter = watch.meter = suite.meter()
        done = []
        with meter:
            for d in passes:
                f = 1 + rng.uniform(-0.08, 0.08)
                pre = 0.0
                for a in range(d.start, d.end, 256):
                    b = min(a + 256, d.end)
                    share = spell(clock.now - t0)
                    dt = TRUE_RATE[d.kind] * work_units(a, b, K) * f / share
                    suite.run(dt, 2.0 * share, 2.0 * (1 - share))
                    pre += dt
                    task.report(d.kind, b - d.start, d.end - d.start)
                share = spell(clock.now - t0)
                g = d.generate * TRUE_GEN * f / share
                one_core = clock.now - t0 >= 60  # one generation thread since the spell began
                suite.run(g, (1.0 if one_core else 2.0) * share, 2.0 * (1 - share))
                done.append(DonePass(d.kind, d.start, d.end, d.generate, pre, g))
                if d.kind == "prime":
                    plan.prefill_prior = pre / plan.units(d)
            suite.run(TRUE_OVERHEAD * (1 + rng.uniform(-0.2, 0.2)), 2.0, 0.0)
        watch.call_ends(meter.result())
        watch.step_ends()
        task.end_item(done)
    total = clock.now - t0
    after = [t for t, _eta in seen if t - t0 >= SPELL_END]
    marks = [m for m in (0.25, 0.5, 0.75) if m * total >= SPELL_END] + [
        (after[0] - t0 + d) / total for d in (1, 20, 40)]
    for err in errors_at(seen, total, t0, marks):
        assert abs(err) <= 0.20, errors_at(seen, total, t0, marks)
