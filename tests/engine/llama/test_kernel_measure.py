"""The kernel measurement's logic with injected timings and load: it repeats and alternates
until the figures are stable (bounded), marks a busy or unsettled measurement provisional, weighs
the batch plans by the reuse mode, and the watch asks for a new measurement when runs depart."""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import replace

import pytest

from app.engine.llama import kernel_choice as kc
from app.engine.llama import kernel_measure as km
from app.engine.llama.kernel_measure import (MAX_ROUNDS, MIN_ROUNDS, KernelMeasurement,
                                             KernelTiming, relative_spread)
from app.engine.llama.kernel_watch import STRIKES, KernelWatch
from app.engine.llama.machine_load import LoadMeter, MachineLoad
from app.engine.llama.native import ContextParams


class FakeModel:
    n_vocab = 100


class Scripted(KernelMeasurement):
    """No llama.cpp: each timed suffix takes what ``times[(kernel, plan)]`` says next."""

    def __init__(self, times, load=MachineLoad(0.0, 2, "injected"), grouping=None, **kw):
        kw.setdefault("ms_per_token", 0.01)  # a fast model: the full plan, no pilot
        super().__init__(FakeModel(), ContextParams(n_ctx=4096, n_batch=256), **kw)
        self.times = {k: itertools.cycle(v) for k, v in times.items()}
        self.grouping = grouping or {}  # the probe's verdict per kernel (default: not exact)
        self.probed: list[tuple[bool, int]] = []  # (kernel, rounds done) of each probe
        self.load = load
        self.order: list[tuple[bool, str]] = []

    def _prefix_batch(self, kernel):
        self._prefix_done[kernel] = self.n_prefix
        self._prefix_t[kernel] = 0.001 * self.n_prefix
        self._prefix_ms[kernel] = 1.0
        self._prefix_state[kernel] = b"state"

    def _time_suffix(self, kernel, plan):
        self.order.append((kernel, plan))
        ms = next(self.times[(kernel, plan)])
        self.samples[(kernel, plan)].append(ms)
        self._sample_s.append(ms / 1000)

    def _probe_grouping(self, kernel):
        self.probed.append((kernel, self.round))
        self.grouping_exact[kernel] = self.grouping.get(kernel, False)

    def _finish(self):
        super()._finish()
        self.result = km.Measured(self.result.timings, self.load, self.result.settled,
                                  self.result.rounds, self.result.cost_ms, self.result.at)


def steady(off_one, off_split, on_one, on_split, wobble=0.0):
    w = [1.0, 1 + wobble, 1 - wobble]
    return {(False, "one"): [off_one * x for x in w], (False, "split"): [off_split * x for x in w],
            (True, "one"): [on_one * x for x in w], (True, "split"): [on_split * x for x in w]}


def test_steady_figures_stop_after_the_minimum_rounds_and_are_trusted():
    m = Scripted(steady(100, 110, 90, 160, wobble=0.02))
    assert m.run()
    r = m.result
    assert r.rounds == MIN_ROUNDS and r.settled and not r.provisional
    assert all(t.repeats == MIN_ROUNDS and t.spread < km.SPREAD_OK for t in r.timings)
    off = next(t for t in r.timings if not t.flash_attn)
    assert off.suffix_ms == pytest.approx(100) and off.split_suffix_ms == pytest.approx(110)


def test_kernels_and_plans_alternate_round_by_round():
    m = Scripted(steady(100, 110, 90, 160))
    m.run()
    firsts = [m.order[i * 4] for i in range(MIN_ROUNDS)]
    # the kernel that goes first turns every round, so a load that comes and goes hits both
    assert [k for k, _p in firsts] == [False, True, False]
    assert {p for _k, p in m.order} == {"one", "split"}


def test_noisy_figures_with_a_clear_winner_stop_early():
    times = {(False, "one"): [100, 140, 70], (False, "split"): [100, 150, 70],
             (True, "one"): [400, 520, 300], (True, "split"): [500, 650, 380]}
    m = Scripted(times)
    assert m.run()
    assert m.result.rounds == MIN_ROUNDS and m.result.settled
    assert max(t.spread for t in m.result.timings) > km.SPREAD_OK  # noisy, yet no doubt


def test_noisy_overlapping_figures_take_more_rounds_bounded_and_stay_provisional():
    times = {(False, "one"): [100, 160, 70, 130], (False, "split"): [110, 170, 60, 140],
             (True, "one"): [105, 60, 150, 120], (True, "split"): [120, 70, 180, 100]}
    m = Scripted(times)
    assert m.run()
    r = m.result
    assert r.rounds == MAX_ROUNDS and not r.settled and r.provisional
    assert "still spread" in r.why_provisional() and f"after {MAX_ROUNDS} rounds" in r.why_provisional()


class BusyMeter(LoadMeter):
    def result(self):
        return MachineLoad(1.5, 2, "injected", 3.0)


def test_a_busy_machine_makes_it_provisional_and_cached_as_such(tiny_model):
    m = Scripted(steady(100, 110, 90, 160), load=MachineLoad(1.5, 2, "injected", 3.0))
    m.run()
    assert m.result.settled and m.result.provisional
    assert "busy" in m.result.why_provisional() and "1.50 of 2 cores" in m.result.why_provisional()
    params = ContextParams(n_ctx=2048, n_batch=77)
    choice = kc.finish_choice(m.result, params, "sha-busy")
    assert choice.provisional and "provisional" in choice.describe()
    assert any("1.50 of 2 cores" in line for line in choice.figure_lines())
    assert any(line.startswith("provisional") for line in choice.figure_lines())
    again = kc.start_choice(params, "sha-busy", "auto", False, False)
    # used meanwhile, and measured again once it is old enough: not trusted forever, but not
    # measured again at every start either
    assert again.how == "measured earlier" and again.provisional and not again.measuring_wanted
    assert again.flash_attn == choice.flash_attn and again.load == choice.load
    assert replace(again, measured_at=time.time() - kc.RETRY_S - 1).measuring_wanted
    quiet = Scripted(steady(100, 110, 90, 160))
    quiet.run()
    trusted = kc.finish_choice(quiet.result, params, "sha-busy")
    assert not trusted.provisional
    assert not kc.start_choice(params, "sha-busy", "auto", False, False).measuring_wanted


def test_a_busy_machine_ends_it_at_the_minimum_rounds():
    noisy = {(False, "one"): [100, 160, 70, 130], (False, "split"): [110, 170, 60, 140],
             (True, "one"): [105, 60, 150, 120], (True, "split"): [120, 70, 180, 100]}
    m = Scripted(noisy, load=MachineLoad(1.5, 2, "injected", 3.0), load_meter=BusyMeter())
    assert m.run()
    assert m.result.rounds == MIN_ROUNDS and m.result.provisional  # not MAX_ROUNDS


def test_no_measurement_yet_starts_on_the_safe_default():
    c = kc.start_choice(ContextParams(n_batch=99), "sha-none", "auto", False, False)
    assert (c.flash_attn, c.how, c.measuring_wanted) == (kc.SAFE_DEFAULT, "until measured", True)
    assert "safe default until the attention kernels are measured" in c.reason


def test_stopping_between_steps_keeps_what_was_measured():
    m = Scripted(steady(100, 110, 90, 160))
    calls = itertools.count()
    assert not m.run(check=lambda: next(calls) >= 5)  # stopped after 5 steps
    done = m.progress().done
    assert 0 < done < m.progress().total and not m.finished
    taken = sum(len(v) for v in m.samples.values())
    assert m.run()
    assert sum(len(v) for v in m.samples.values()) == MIN_ROUNDS * 4 and taken > 0
    assert m.progress().done == m.progress().total and m.progress().eta_s == 0


def test_the_eta_follows_the_speed_seen():
    m = Scripted(steady(1000, 1000, 1000, 1000))
    m.step()
    m.step()  # both prefixes
    m.step()  # one suffix timing of 1 s
    p = m.progress()
    left = p.total - p.done
    assert p.eta_s == pytest.approx(left * 1.0 * 1.2)


def test_the_reuse_mode_weighs_the_batch_plans():
    # flash attention faster in one batch, much slower in a chain run's small batches (seen)
    on = KernelTiming(True, 8.0, 600.0, 1074.0)
    off = KernelTiming(False, 9.0, 645.0, 689.0)
    assert kc._decide((on, off), "measured", 1.0, "chain").flash_attn is False
    assert kc._decide((on, off), "measured", 1.0, "prefix").flash_attn is True
    assert "chain mode" in kc._decide((on, off), "measured", 1.0).reason


def test_relative_spread_ignores_one_outlier():
    assert relative_spread([100, 101, 99, 100, 300]) < 0.05
    assert relative_spread([100]) == 0.0
    assert relative_spread([50, 100, 150]) == pytest.approx(0.5)


def test_load_meter_counts_other_processes_only_over_watched_spans():
    clock, busy, own = [0.0], [0.0], [0.0]
    meter = LoadMeter(busy_s=lambda: busy[0], own_s=lambda: own[0], clock=lambda: clock[0],
                      n_cores=2)
    with meter:  # 2 s: the machine used 3 CPU-seconds, 1 of them ours
        clock[0] += 2
        busy[0] += 3
        own[0] += 1
    clock[0] += 100  # unwatched: whatever ran then is not charged
    busy[0] += 200
    with meter:  # 2 s: only ours
        clock[0] += 2
        busy[0] += 2
        own[0] += 2
    load = meter.result()
    assert load.other_cores == pytest.approx(0.5) and load.wall_s == pytest.approx(4)
    assert load.share == pytest.approx(0.25) and not load.busy
    with meter:
        clock[0] += 4
        busy[0] += 8
        own[0] += 2
    assert meter.result().busy  # 8 CPU-seconds of others' work in 8 s on 2 cores


def test_load_meter_falls_back_to_the_load_average_then_to_unknown(monkeypatch):
    from app.engine.llama import machine_load

    monkeypatch.setattr(machine_load, "_proc_busy_s", lambda: None)
    monkeypatch.setattr(machine_load, "_windows_busy_s", lambda: None)
    meter = LoadMeter(loadavg=lambda: (2.5, 0, 0), n_cores=2)
    with meter:
        pass
    load = meter.result()
    assert load.source == "load average" and load.other_cores == pytest.approx(1.5) and load.busy
    meter = LoadMeter(loadavg=False, n_cores=2)
    meter._loadavg = None
    with meter:
        pass
    unknown = meter.result()
    assert unknown.other_cores is None and not unknown.busy
    assert unknown.describe() == "machine load unknown"


def test_proc_stat_is_read_where_it_exists():
    from app.engine.llama import machine_load

    if machine_load._proc_busy_s() is None:
        pytest.skip("no /proc/stat here")
    meter = LoadMeter()
    assert meter.source == "/proc/stat"
    with meter:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:  # our own work is not load
            pass
    assert meter.result().other_cores is not None


def test_the_watch_fires_after_runs_depart_several_times_in_a_row():
    t = KernelTiming(False, 3.0, 64.0, 128.0, 64)  # 1 ms/token in one batch, 2 in four
    w = KernelWatch(kc.KernelChoice(False, "measured", "", (t, KernelTiming(True, 3, 90, 300))))
    assert w.expected_ms_per_token(64, 1) == pytest.approx(1.0)
    assert w.expected_ms_per_token(64, 4) == pytest.approx(2.0)
    assert w.expected_ms_per_token(2000, 8) is None  # unlike the measured suffix
    assert w.observe(64, 1, 300.0) is None  # 4.7x: one strike
    assert w.observe(64, 1, 70.0) is None  # within the margin: strikes start again
    for _ in range(STRIKES - 1):
        assert w.observe(64, 4, 600.0) is None
    msg = w.observe(64, 4, 600.0)
    assert msg and "4.7x" in msg and "measuring them again" in msg
    assert w.observe(64, 4, 600.0) is None  # once


def test_runs_that_depart_make_the_cached_measurement_provisional():
    from app.engine.engine_kernels import EngineKernels

    params = ContextParams(n_ctx=2048, n_batch=55)
    m = Scripted(steady(64, 128, 90, 300))
    m.run()
    kc.finish_choice(m.result, params, "sha-watch")
    k = EngineKernels(FakeModel(), params, "sha-watch", "auto", False, False, False, False)
    assert not k.wanted and k.status().state == "done"
    msgs = [k.observe_run(64, 1, 64.0 * 5) for _ in range(STRIKES)]
    assert msgs[-1] and not any(msgs[:-1])
    assert k.wanted and k.status().state == "wanted" and k.status().note == msgs[-1]
    entry = json.loads(kc._cache_path().read_text())[kc._key(params, "sha-watch")]
    assert entry["provisional"] and "measuring them again" in entry["why"]
    # the next start uses it meanwhile and measures again
    assert EngineKernels(FakeModel(), params, "sha-watch", "auto", False, False, False, False).wanted


def test_a_provisional_measurement_is_taken_again_when_idle_a_few_times_at_most():
    from dataclasses import replace

    from app.engine import engine_kernels as ek

    params = ContextParams(n_ctx=2048, n_batch=66)
    m = Scripted(steady(100, 110, 90, 160), load=MachineLoad(1.5, 2, "injected", 3.0))
    m.run()
    kc.finish_choice(m.result, params, "sha-retry")
    k = ek.EngineKernels(FakeModel(), params, "sha-retry", "auto", False, False, False, False)
    assert not k.wanted and not k.urgent  # provisional but recent: used, not measured again
    assert k.status().state == "done"  # recent: not yet
    for _ in range(ek.MAX_RETRIES):
        k.choice = replace(k.choice, measured_at=time.time() - ek.RETRY_S - 1)
        k.wanted = False
        st = k.status()
        assert st.state == "wanted" and "provisional and over 15 minutes old" in st.note
    k.wanted = False
    assert k.status().state == "done"  # bounded: a machine that stays busy gets no better answer


def test_each_provisional_measurement_in_a_row_waits_twice_as_long_before_the_next():
    """A machine that stays busy does not pay a measurement at every start of the window or
    every `kvprimer info`: the wait doubles (up to a day), and a trusted one ends it."""
    params = ContextParams(n_ctx=2048, n_batch=67)
    busy = MachineLoad(1.5, 2, "injected", 3.0)
    waits = []
    for _ in range(3):
        m = Scripted(steady(100, 110, 90, 160), load=busy)
        m.run()
        kc.finish_choice(m.result, params, "sha-backoff")
        c = kc.start_choice(params, "sha-backoff", "auto", False, False)
        assert c.provisional and not c.measuring_wanted  # just measured: not again yet
        assert replace(c, measured_at=time.time() - c.retry_wait_s - 1).measuring_wanted
        waits.append(c.retry_wait_s)
    assert waits == [kc.RETRY_S, 2 * kc.RETRY_S, 4 * kc.RETRY_S]
    assert replace(c, tries=30).retry_wait_s == kc.RETRY_MAX_S
    quiet = Scripted(steady(100, 110, 90, 160))
    quiet.run()
    trusted = kc.finish_choice(quiet.result, params, "sha-backoff")
    assert not trusted.provisional and trusted.tries == 0
    # runs that depart from a trusted one make it wanted at once (no wait)
    distrusted = kc.distrust(params, "sha-backoff", trusted, "runs departed")
    assert distrusted.retry_wait_s == 0
    assert kc.start_choice(params, "sha-backoff", "auto", False, False).measuring_wanted
