"""A short soak: 100 warm runs back to back keep resident memory flat (the 1,000-run version is
`python -m bench.soak`). A leaked context, batch, sampler or state copy per run would add from
tens of KiB to megabytes per run here."""
from __future__ import annotations

from bench.soak import soak


def test_warm_runs_do_not_grow_resident_memory(tiny_model):
    lines = []
    res = soak(runs=100, warmup=20, every=25, model_path=str(tiny_model), echo=lines.append)
    assert res.runs == 100 and len(res.samples) == 5
    assert lines[0].startswith("soak: RSS at start") and "growth" in lines[-1]
    assert res.growth < 4 << 20, res.line()
    # and no steady climb: the last quarter grew less than 1 MiB
    assert res.samples[-1] - res.samples[-2] < 1 << 20, res.samples
