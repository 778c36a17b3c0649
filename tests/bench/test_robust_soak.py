"""A short soak: 100 warm runs back to back keep resident memory flat (the 1,000-run version is
`python -m bench.soak`). A leaked context, batch, sampler or state copy per run would add from
tens of KiB to megabytes per run here.

The bound is a leak rate (bench/soak.py): the median RSS growth per run over stretches of
runs, against a share of one run's state. No number of MiB: how far RSS moves once (arenas,
caches, pages) depends on the machine and its allocator, a leak's steady climb does not."""
from __future__ import annotations

import pytest

import app.engine
from bench.soak import LARGEST_PAGE, leak_bound, leak_rate, soak, stretch_for

MIB = 1 << 20


def test_warm_runs_do_not_grow_resident_memory(tiny_model):
    lines = []
    res = soak(runs=100, warmup=20, model_path=str(tiny_model), echo=lines.append)
    assert res.runs == 100 and len(res.samples) == 100 // res.every + 1 >= 10
    assert lines[0].startswith("soak: RSS at start") and "leak rate" in lines[-1]
    assert not res.leaks, res.line()


def test_a_leak_of_part_of_a_state_per_run_fails_the_soak(tiny_model, monkeypatch):
    """The check can fail: each run keeps a third of its state's bytes, written (so resident),
    in pages of its own: memory the heap freed earlier in the process (other tests) would
    otherwise take the leak in without RSS growing."""
    import mmap

    real, kept = app.engine.run_prompt, []

    def leaking_run(engine, template, values, *, state, **kw):
        page = mmap.mmap(-1, max(state.nbytes // 3, 1))
        page.write(b"\x01" * len(page))
        kept.append(page)
        return real(engine, template, values, state=state, **kw)

    monkeypatch.setattr(app.engine, "run_prompt", leaking_run)
    res = soak(runs=40, warmup=4, model_path=str(tiny_model), echo=lambda _line: None)
    assert len(kept) == 44 and res.leaks, res.line()


@pytest.mark.parametrize("step_mib", [1, 15, 100])
def test_growth_once_is_not_a_leak_however_large(step_mib):
    """An arena or a cache that grows once (by as much as another machine's allocator may
    take) passes; the same growth spread over every stretch does not."""
    every, n = 5, 21
    once = [(i * every, (500 + step_mib * (i >= 8)) * MIB) for i in range(n)]
    assert leak_rate(once) == 0
    steady = [(i * every, 500 * MIB + i * step_mib * MIB // (n - 1)) for i in range(n)]
    assert leak_rate(steady) * every == pytest.approx(step_mib * MIB / (n - 1), rel=0.01)
    assert leak_rate(steady) > leak_bound(16 << 10)  # 1 MiB in 100 runs: 10 KiB a run


def test_pages_of_any_size_stay_under_the_bound():
    """A stretch's bound covers a whole 64 KiB page, so RSS counted in big pages (a small
    allocation rounded up to a page in every stretch) is no leak."""
    for state in (4 << 10, 100 << 10, 4 * MIB):
        every = stretch_for(leak_bound(state))
        assert leak_bound(state) * every >= LARGEST_PAGE
        pages = [(i * every, i * LARGEST_PAGE) for i in range(20)]  # a page every stretch
        assert leak_rate(pages) <= leak_bound(state)
