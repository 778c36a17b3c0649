"""The KV map is llama.cpp's own report (kv/cell_report.py, kv/kv_debug_log.py), on the tiny
model: asked for with a probe that changes nothing, read with sequence ids of two digits, and
marked where llama.cpp's map cannot say who owns a cell."""
import numpy as np
import pytest

from app.engine import CacheLimits, Engine, EngineConfig, GenerationConfig, run_prompt
from app.engine.kv.cell_report import SHARED, UNREPORTED, last_report, parse_cell_map
from tests.engine.cache.test_radix_cache import TPL, value


def toks(n, k=7):
    return [(k * i) % 250 + 5 for i in range(n)]


def make(tiny_model, n_seq_max=8, **kw) -> Engine:
    return Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=32, n_threads=1,
                               n_seq_max=n_seq_max, **kw))


def cells(v) -> list:
    """(position, owners) of every used cell, in cell order ("?" where not reported)."""
    return [(int(v.cell_pos[i]), "?" if v.cell_unreported is not None and v.cell_unreported[i]
             else v.owners(i)) for i in np.flatnonzero(v.cell_pos >= 0)]


def next_decode_record(eng, seq, tokens):
    """The map llama.cpp logs when the next decode starts: the cache as it is before it."""
    with eng.ctx.log.capture():
        eng.evaluate(tokens, seq)
    lines = list(eng.ctx.log.lines)
    first = next(i for i, t in enumerate(lines) if t.startswith("find_slot: stream"))
    return last_report(lines[:first + 3 + 64]), lines


def test_the_map_after_a_prime_shows_the_newest_cells_where_llama_cpp_has_them(engine):
    engine.evaluate(toks(70), 0)  # batches of 32, 32, 6: the last 6 are in no decode's record
    v = engine.kv_view()
    assert v.source == "debug-log" and v.used_cells == 70 and not v.note
    assert cells(v) == [(p, [0]) for p in range(70)]
    rep, _ = next_decode_record(engine, 1, toks(3))
    assert np.array_equal(rep.pos, v.cell_pos) and rep.used == 70
    assert [int(o) for o in rep.owner[:71]] == [0] * 70 + [-1]


OPS = [  # frees cells in the middle and refills them, so the head decides where cells land
    lambda e: e.evaluate(toks(60), 0), lambda e: e.evaluate(toks(20, 3), 1),
    lambda e: e.seqs.clear(0), lambda e: e.evaluate(toks(10, 5), 2),
    lambda e: e.evaluate(toks(5, 9), 3), lambda e: e.seqs.clear(2),
    lambda e: e.evaluate(toks(3, 11), 4), lambda e: e.seqs.fork(1, 5),
    lambda e: e.seqs.trim(1, 10), lambda e: e.evaluate(toks(40, 13), 6),
    lambda e: e.seqs.clear(3), lambda e: e.evaluate(toks(2, 17), 2),
]


def test_probing_changes_no_placement(tiny_model):
    with make(tiny_model) as probed, make(tiny_model) as plain:
        holes = 0
        for op in OPS:
            op(probed)
            op(plain)
            v = probed.kv_view()
            assert v.source == "debug-log" and not v.note, v.note
            holes += probed.seqs.has_holes()
        assert holes >= 3  # free cells between used ones, where the head decides
        assert probed.ctx.probes >= len(OPS) - 1 and plain.ctx.probes == 0
        for s in range(8):
            assert probed.ctx.pos_range(s) == plain.ctx.pos_range(s)
        # the same decode logs the same map, head and used count with and without probes, and
        # its tokens land in the same cells
        rep_a, lines_a = next_decode_record(probed, 7, toks(50, 19))
        rep_b, lines_b = next_decode_record(plain, 7, toks(50, 19))
        assert rep_a.head == rep_b.head and lines_a == lines_b
        a, b = probed.kv_view(), plain.kv_view()
        assert cells(a) == cells(b) and np.array_equal(a.cell_pos, b.cell_pos)


def test_sequence_ids_of_two_digits_show_their_owners(tiny_model):
    with make(tiny_model, n_seq_max=64) as eng:
        eng.evaluate(toks(10), 10)
        eng.evaluate(toks(7, 3), 63)
        eng.seqs.fork(10, 62)
        eng.evaluate(toks(3, 5), 1)
        eng.evaluate(toks(4, 9), 62)
        v = eng.kv_view()
        assert v.source == "debug-log" and v.unreported_cells == 0, v.note
        assert cells(v) == ([(p, [10, 62]) for p in range(10)] + [(p, [63]) for p in range(7)]
                            + [(p, [1]) for p in range(3)] + [(p, [62]) for p in range(10, 14)])
        assert [(u.seq, u.cells, u.shared_cells) for u in v.sequences] == [
            (1, 3, 0), (10, 10, 10), (62, 14, 10), (63, 7, 0)]


def test_an_ambiguous_owner_is_marked_not_guessed(tiny_model):
    with make(tiny_model, n_seq_max=16) as eng:
        eng.evaluate(toks(5), 1)
        eng.evaluate(toks(5, 3), 11)  # "11111" + "1111111111": 1s and 11s in any order
        eng.evaluate(toks(2, 5), 15)  # "1515": only 15 holds positions 0..1 beside 1 and 11
        v = eng.kv_view()
        assert v.source == "debug-log" and v.used_cells == 12
        assert cells(v) == [(p, "?") for p in [*range(5), *range(5)]] + [(0, [15]), (1, [15])]
        assert v.unreported_cells == 10 and "owner not reported" in v.note
        # the sequences' counts come from the ledger, which agrees with what llama.cpp reported
        assert [(u.seq, u.cells) for u in v.sequences] == [(1, 5), (11, 5), (15, 2)]


def test_the_owner_map_parser_splits_only_what_the_ranges_allow():
    pos = np.array([0, 1, 0, 1, -1, 5, 0] + [-1] * 249)
    text = "\n" + "1116363" + "." + "M1" + "." * 249 + " *\n\n"  # 4 cells, then 2 more
    # "111" is 1, 11 or 11, 1: both fit, since 1 and 11 hold positions 0 and 1
    got = parse_cell_map(text, pos, {1: (0, 6), 11: (0, 6), 63: (0, 1)})
    assert got[:7].tolist() == [UNREPORTED, UNREPORTED, 63, 63, -1, SHARED, 1]
    # sequence 1 holds position 0 only: 11, 1 does not fit
    got = parse_cell_map(text, pos, {1: (0, 0), 11: (0, 6), 63: (0, 1)})
    assert got[:4].tolist() == [1, 11, 63, 63]
    assert parse_cell_map(text, pos, {63: (0, 1)}) is None  # no reading fits: not a map of it
    assert parse_cell_map(text[:-4], pos, {1: (0, 6), 11: (0, 6), 63: (0, 1)}) is None


def test_cells_held_after_an_eviction_show_the_holding_sequence(tiny_model, tmp_path):
    cfg = EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                       cache=CacheLimits(folder=str(tmp_path / "cache")))
    with Engine(cfg) as eng:
        gen = GenerationConfig(max_tokens=2)
        for i in range(3):
            run_prompt(eng, TPL, {"c1": value(i), "question": "why?"}, reuse="chain", gen=gen,
                       oneshot=False)
        holding = eng.cache.holding
        assert holding == 62
        leaf = max((n for n in eng.cache.tree if n.seq is not None), key=lambda n: n.depth)
        eng.cache.evict(leaf.id)
        v = eng.kv_view()
        assert v.source == "debug-log" and v.used_cells == eng.seqs.used_cells()
        lpos, lmask = eng.ctx.ledger.cells()
        ledger = [(int(p), [s for s in range(64) if int(m) >> s & 1]) for p, m in zip(lpos, lmask)]
        # the evicted leaf's own cells are held by 62 alone: llama.cpp's map names them
        assert [c for c in cells(v) if c[1] == [holding]] == [
            (p, [holding]) for p in range(leaf.start, leaf.depth)]
        # every owner shown is one the operations gave that cell
        shown = [c for c in cells(v) if c[1] != "?"]
        assert all(shown.count(c) <= ledger.count(c) for c in shown)
        # cells left unreported are shared ones at positions where sibling prompts share other
        # cells too (llama.cpp prints "M" for each): which is which, nothing tells
        for p in {c[0] for c in cells(v) if c[1] == "?"}:
            assert len({tuple(o) for q, o in ledger if q == p and len(o) > 1}) > 1, p
        assert 0 < v.unreported_cells < v.used_cells and "owner not reported" in v.note
        assert [(u.seq, u.cells) for u in v.sequences] == sorted(
            (s, sum(s in o for _p, o in ledger)) for s in {s for _p, o in ledger for s in o})


@pytest.mark.parametrize("debug", [False])
def test_without_the_debug_log_holes_are_assumed_after_a_free(tiny_model, debug):
    with make(tiny_model, kv_debug_log=debug) as eng:
        eng.evaluate(toks(10), 0)
        eng.evaluate(toks(10), 1)
        assert not eng.seqs.has_holes()
        eng.seqs.clear(0)
        assert eng.seqs.has_holes() and eng.kv_view().source == "ranges"
        eng.clear_all()
        assert not eng.seqs.has_holes()
