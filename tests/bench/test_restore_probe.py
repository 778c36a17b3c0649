"""bench/restore_probe.py's paired file load: both ways read the same state, interleaved, and
the loader is left as it was."""
from __future__ import annotations

from app.engine.states import body_buffer
from app.engine.states.body_buffer import new_body
from bench.restore_probe import main, paired_file_load
from tests.engine.states.test_prefix_state_file import make


def test_paired_file_load_times_both_ways_and_restores_the_loader(tmp_path, capsys):
    p = tmp_path / "s.kvstate"
    make(data=bytes(range(256)) * 64).save(p)
    out = paired_file_load(p, n=2)
    assert body_buffer.new_body is new_body
    assert out["bytes"] == p.stat().st_size and out["repeats"] == 2
    for cache in ("dropped", "cached"):
        f = out[cache]
        assert f["plain_ms"] > 0 and f["huge_pages_ms"] > 0 and f["huge_vs_plain"] > 0
    assert main([str(p), "-n", "1"]) == 0
    assert '"huge_vs_plain"' in capsys.readouterr().out
