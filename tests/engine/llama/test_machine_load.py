"""Other programs' CPU use read in parts: a busy spell over a short part of a long measurement
shows in its busiest half second and in the part around the pass it covered, though the whole
measurement's average hides it."""
from __future__ import annotations

import os

import pytest

from app.engine.llama.machine_load import WINDOW_S, LoadMeter, MachineLoad


class FakeMachine:
    def __init__(self):
        self.clock, self.busy = 0.0, 0.0

    def run(self, seconds: float, other_cores: float) -> None:
        self.clock += seconds
        self.busy += seconds * other_cores

    def meter(self) -> LoadMeter:
        return LoadMeter(busy_s=lambda: self.busy, own_s=lambda: 0.0, clock=lambda: self.clock,
                         n_cores=2)


def test_a_spell_over_the_warm_run_alone_is_not_averaged_away():
    m = FakeMachine()
    meter = m.meter()
    with meter:
        m.run(0.7, 1.5)  # the warm run, beside 1.5 busy cores
        meter.mark("warm")
        m.run(10.0, 0.0)  # the cold run, quiet
        meter.mark("cold")
    whole = meter.result()
    assert whole.share == pytest.approx(0.7 * 1.5 / 10.7 / 2, abs=1e-3)  # 0.05: not busy
    assert not whole.busy
    assert whole.peak_share == pytest.approx(0.75) and whole.busy_at_times
    assert meter.result("warm").share == pytest.approx(0.75)
    assert whole.recent_cores == pytest.approx(0.0)  # the last half second was quiet
    assert whole.free_share(recent=True) == 1.0 and whole.free_share() < 1.0


def test_short_parts_are_read_together_for_half_a_second():
    m = FakeMachine()
    meter = m.meter()
    with meter:
        for i in range(20):  # 1/16 s parts: a few ticks of /proc/stat each
            m.run(0.0625, 2.0 if i == 3 else 0.0)
            meter.mark("warm" if i < 2 else "cold")
    load = meter.result()
    # no half second is above a quarter though one part alone read every core
    assert load.peak_share < 0.25 and not load.busy_at_times
    around = meter.result("warm")  # the warm parts widened to half a second by those after
    assert around.wall_s >= WINDOW_S and around.share == pytest.approx(0.125 / 0.5 / 2)
    assert meter.recent_free() == 1.0


def test_an_unknown_load_leaves_every_core_free():
    unknown = MachineLoad(None, 2, "unknown")
    assert unknown.free_share() == 1.0 and not unknown.busy_at_times
    assert MachineLoad(1.9, 2, "x").free_share() == pytest.approx(0.2)  # at least a fifth
    assert LoadMeter(busy_s=lambda: 0.0, own_s=lambda: 0.0).result("warm").other_cores is None


def test_processes_niced_below_ours_are_not_others_load(monkeypatch):
    # a test suite at nice 19 fills the cores a job at normal priority leaves between its
    # batches: /proc/stat counts it apart ("nice"), and it is no load on that job; a job
    # niced itself competes with it
    from app.engine.llama import machine_load

    tick = os.sysconf("SC_CLK_TCK")
    stat = {"user": 0, "nice": 0}
    monkeypatch.setattr(machine_load, "_stat_line", lambda: (
        f"cpu  {stat['user']} {stat['nice']} 0 1000 0 0 0 0 0 0\n"))
    t = {"clock": 0.0}

    def run(seconds: float, user_cores: float, nice_cores: float) -> None:
        t["clock"] += seconds
        stat["user"] += round(seconds * user_cores * tick)
        stat["nice"] += round(seconds * nice_cores * tick)

    for niced, expected in ((False, 0.5), (True, 1.5)):
        monkeypatch.setattr(machine_load, "runs_niced", lambda niced=niced: niced)
        meter = LoadMeter(own_s=lambda: 0.0, clock=lambda: t["clock"], n_cores=2)
        assert meter.source == "/proc/stat"
        with meter:
            run(2.0, 0.5, 1.0)  # a busy process at normal priority, and a niced one
        assert meter.result().other_cores == pytest.approx(expected)
    line = "cpu  100 500 50 1000 20 0 0 0 0 0"
    assert machine_load.stat_busy_s(line, niced=True) == pytest.approx(650 / tick)
    assert machine_load.stat_busy_s(line, niced=False) == pytest.approx(150 / tick)
