"""bench/restore_probe.py's paired file load: both ways read the same state, interleaved, and
the loader is left as it was."""
from __future__ import annotations

from app.engine.states import body_buffer
from app.engine.states.body_buffer import new_body
from bench.restore_probe import main, paired_file_load, paired_overlap_load
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


def test_the_file_path_breakdown_times_each_step_of_a_run_from_a_state(engine, tmp_path):
    """Every step of `run --state` is timed inside the real path, nested steps within their
    callers, and the path is left unwrapped."""
    from app.engine import PrefixState, Template
    from app.engine.llama.native import NativeContext
    from bench.restore_probe import _STEPS, file_path_breakdown

    tpl = Template.parse("hello world of the answer and question. " * 4 + "<q>")
    p = tmp_path / "s.kvstate"
    engine.prime(tpl).save(p)
    from app.engine import state_flows

    raw_read, raw_set = PrefixState.__dict__["_read"], NativeContext.__dict__["state_set"]
    placed = state_flows.placed_state
    out = file_path_breakdown(engine, tpl, {"q": "why?"}, p, n=2)
    assert state_flows.placed_state is placed
    assert out["repeats"] == 2 and out["bytes"] == p.stat().st_size
    ms = {k: v["median"] for k, v in out["ms"].items()}
    assert all(ms[label] > 0 for label, _, _ in _STEPS)
    assert ms["read + checksum"] <= ms["load_state (read, check, V layout)"] <= ms["whole load_state"]
    assert ms["load + warm run"] >= ms["whole load_state"] + ms["warm run: suffix"]
    assert ms["sequential read (dropped)"] > 0 and ms["checksum alone (in memory)"] > 0
    assert PrefixState.__dict__["_read"] is raw_read and NativeContext.__dict__["state_set"] is raw_set


def test_paired_overlap_load_times_both_ways_and_restores_the_loader(tmp_path, capsys):
    p = tmp_path / "s.kvstate"
    make(data=bytes(range(256)) * 64).save(p)
    before = body_buffer.OVERLAP_MIN
    out = paired_overlap_load(p, n=2)
    assert body_buffer.OVERLAP_MIN == before
    for cache in ("dropped", "cached"):
        f = out[cache]
        assert f["serial_ms"] > 0 and f["overlapped_ms"] > 0
        assert f["range"][0] <= f["overlapped_vs_serial"] <= f["range"][1]
    assert main([str(p), "-n", "1", "--overlap"]) == 0
    assert '"overlapped_vs_serial"' in capsys.readouterr().out


def test_paired_placed_load_times_both_ways_and_puts_the_real_path_back(engine, tmp_path):
    from app.engine import Template, state_flows
    from bench.restore_probe import paired_placed_load

    tpl = Template.parse("hello world of the answer and question. " * 4 + "<q>")
    p = tmp_path / "s.kvstate"
    state = engine.prime(tpl)
    state.save(p)
    real = state_flows.placed_state
    out = paired_placed_load(engine, p, n=2)
    assert state_flows.placed_state is real
    # the cached file went straight into the work context, where this file system allows it
    # (mapped_state.py: leases, a local file system); read and restored otherwise
    from app.engine.states.mapped_state import mapped_state_file
    with mapped_state_file(p) as mapped:
        assert out["placed_every_time"] is (mapped is not None)
    assert out["placed_ms"] > 0 and out["read_ms"] > 0
    assert engine.work.tokens == list(state.tokens)


def test_chunked_memcpy_times_one_call_and_each_piece_size():
    from bench.restore_probe import chunked_memcpy

    out = chunked_memcpy(1 << 20, pieces=(0, 64 << 10, 4 << 10), n=2)
    assert [p["piece_bytes"] for p in out["pieces"]] == [1 << 20, 64 << 10, 4 << 10]
    assert all(p["ms"] > 0 and p["gb_s"] > 0 for p in out["pieces"])
