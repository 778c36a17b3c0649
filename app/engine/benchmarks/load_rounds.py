"""A benchmark's calls measured with the machine's load, and rounds made again when the load
changed between their runs (bench_rows.py runs the job).

Each call gets a LoadMeter (machine_load.py), marked at every report of the task: the part
since the last report is the reported pass's, so the load is known pass by pass, and the
job's plan (progress_plan.JobPlan) is told the cores free lately and over each step. A round
(one row, every mode side by side) whose warm runs saw different loads, one busy and one not
or shares more than STRADDLE_SHARE apart, runs again, RETRIES times at most; the steadiest try
is kept. The cold runs are kept from the first try, so a try is warm runs only: the plan is
told of them ("remeasure" passes) before they run.

A row's calls generate on one thread count, taken as its first call starts (ThreadFit.pinned):
the count is part of what decides a cold run's bits (cold_reference.ColdKey), so with auto
threads a load that changed within a row would give its later calls and its tries other
counts, and with them cold and noise runs of their own that the plan does not count (it shares
a row's cold runs between its modes, repeats and tries).
"""
from __future__ import annotations

from dataclasses import replace

from ..llama.machine_load import WINDOW_S, LoadMeter, MachineLoad
from ..llama.thread_fit import shared_fit
from ..progress_plan import PlannedPass
from .bench_passes import done_passes

# a round is measured again when its warm runs' loads differ by more than this share of the
# cores: a reading over half a second (machine_load.WINDOW_S) is good to about ±0.04 of the
# cores, so two readings differ by up to ~0.08 by chance; past 0.1 the load changed, and a run
# given a tenth of the cores less takes ~10% longer (the pairs' goal is ±5%)
STRADDLE_SHARE = 0.1
RETRIES = 2  # tries of a round at most, beyond the first


class LoadWatch:
    """The machine's load as the job runs: each call's LoadMeter marked at every report of
    the task (a batch of a pass: the part since the last one is that pass's), and the plan
    told the cores free lately and over each step."""

    def __init__(self, plan):
        self.plan = plan
        self.meter: LoadMeter | None = None
        self.loads: list[MachineLoad] = []  # the running step's calls'

    def report(self, stage: str, done: int) -> None:
        m = self.meter
        if m is None:
            return
        m.mark(stage if done > 0 else "")
        free = m.recent_free()
        if free is not None:
            self.plan.note_load(now=free)

    def call_ends(self, load: MachineLoad) -> None:
        self.meter = None
        self.loads.append(load)
        if load.wall_s >= WINDOW_S:
            self.plan.note_load(now=load.free_share(recent=True))

    def step_ends(self) -> None:
        got = [x for x in self.loads if x.other_cores is not None and x.wall_s > 0]
        wall = sum(x.wall_s for x in got)
        if wall >= WINDOW_S:
            others = sum(x.other_cores * x.wall_s for x in got) / wall
            self.plan.note_load(step=MachineLoad(others, got[0].n_cores, "").free_share())
        self.loads = []


class LoadedCalls:
    """A benchmark's calls: each run measured (its load, pass by pass), and a round run
    again while its runs straddle a change of the machine's load."""

    def __init__(self, engine, template, state, recompute, gen, task, noise, reusable,
                 load_meter, watch: LoadWatch):
        self.engine, self.template, self.state = engine, template, state
        self.recompute, self.gen, self.task, self.noise = recompute, gen, task, noise
        self.reusable, self.load_meter, self.watch = reusable, load_meter, watch
        self.colds: dict[int, dict] = {}  # per row: cold runs by batch starts, shared by modes
        self.before: dict[int, int] = {}  # per row: the cache generation its calls reuse before
        self.row_at: int | None = None  # the row running
        self.gen_threads = 0  # ... and the thread count its calls generate on

    def run(self, step, row, got) -> list:
        """One call; the passes it ran, for the plan."""
        engine = self.engine
        if step.row not in self.before:
            self.before[step.row] = engine.cache.generation + 1
        rows_colds = self.colds.setdefault(step.row, {})
        keys, made, ran = set(rows_colds), engine.cold.evaluations, len(got.reports)
        generation = engine.cache.generation
        fit = shared_fit()
        if self.row_at != step.row:
            self.row_at, self.gen_threads = step.row, fit.generation_threads()
        meter = self.watch.meter = self.load_meter()
        try:
            with fit.pinned(self.gen_threads), meter:
                got.run(engine, self.template, row, step.mode, self.state, self.recompute,
                        self.gen, self.task, rows_colds, self.before[step.row],
                        True if self.noise else None, self.reusable[step.row])
        finally:
            self.watch.call_ends(meter.result())
        got.loads.append(meter.result())
        got.pair_loads.append(meter.result("warm"))
        if len(got.reports) > ran:
            return done_passes(engine, got.reports[-1], keys, rows_colds, made, generation)
        return []

    def steady_round(self, calls: list, row) -> list:
        """``calls`` (plan index, Step, _RowRuns): a round just run. While its warm runs saw
        different loads, run it again (RETRIES times at most); keep the steadiest try. The
        passes the tries ran, their warm runs as "remeasure"."""
        n = len(calls)
        if n < 2 or any(g.error is not None or len(g.reports) != st.round + 1
                        for _i, st, g in calls):
            return []
        tries = [[(g.reports[-1], g.loads[-1], g.pair_loads[-1]) for _i, _st, g in calls]]
        passes: list = []
        plan = self.watch.plan
        while _straddles([t[2] for t in tries[-1]]) and len(tries) <= RETRIES:
            plan.extend([PlannedPass("remeasure", p.start, p.end, p.generate)
                         for i, _st, _g in calls for p in plan.steps[i].passes
                         if p.kind == "warm"])
            for _i, st, g in calls:
                ran = self.run(st, row, g)
                passes += [replace(d, kind="remeasure") if d.kind == "warm" else d for d in ran]
                if g.error is not None:
                    return passes
            tries.append([(g.reports[-1], g.loads[-1], g.pair_loads[-1])
                          for _i, _st, g in calls])
        if len(tries) == 1:
            return passes
        best = min(tries, key=lambda t: (_straddles([x[2] for x in t]),
                                         max(x[2].share or 0.0 for x in t)))
        for k, (_i, _st, g) in enumerate(calls):
            for got_list, at in ((g.reports, 0), (g.loads, 1), (g.pair_loads, 2)):
                del got_list[len(got_list) - len(tries):]
                got_list.append(best[k][at])
            g.remeasured += len(tries) - 1
            g.load_changed = g.load_changed or _straddles([x[2] for x in best])
        return passes


def _straddles(loads: list[MachineLoad]) -> bool:
    """Warm runs of a round that saw different loads: one busy and one not, or shares more
    than STRADDLE_SHARE apart (readings over less than WINDOW_S are too coarse to tell)."""
    read = [x for x in loads if x.share is not None and x.wall_s >= WINDOW_S]
    if len(read) < 2:
        return False
    shares = [x.share for x in read]
    return len({x.busy for x in read}) > 1 or max(shares) - min(shares) > STRADDLE_SHARE
