"""Other programs' CPU use read in parts: a busy spell over a short part of a long measurement
shows in its busiest half second and in the part around the pass it covered, though the whole
measurement's average hides it."""
from __future__ import annotations

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
