"""The KV cache view and the sequence operations, on the tiny model (real llama.cpp calls)."""
import numpy as np
import pytest

from app.engine import Engine, EngineConfig, KvPrimerError, Template
from app.engine.kv.cell_report import parse_pos_map

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 4
                     + "\n<c1>\n<|im_end|>\n")


def toks(n, k=7):
    return [(k * i) % 250 + 5 for i in range(n)]  # byte tokens: valid in the tiny vocabulary


def test_fork_shares_every_prefix_cell_and_trim_keeps_shared_cells(engine):
    prefix = engine.tokenize(TPL.prefix_prompt())
    engine.evaluate(prefix, 0, want_logits=False)
    P = len(prefix)
    engine.seqs.fork(0, 1)
    v = engine.kv_view()
    assert v.source == "debug-log" and v.has_cells
    assert v.used_cells == P
    for s in (0, 1):
        u = v.seq(s)
        assert (u.cells, u.pos_min, u.pos_max, u.shared_cells) == (P, 0, P - 1, P)
    Q = P // 3
    engine.seqs.trim(1, Q)
    v = engine.kv_view()
    assert (v.seq(1).cells, v.seq(1).shared_cells, v.seq(1).pos_max) == (Q, Q, Q - 1)
    assert (v.seq(0).cells, v.seq(0).shared_cells) == (P, Q)
    assert v.used_cells == P  # trimming a fork frees nothing: sequence 0 still holds them
    engine.seqs.clear(0)
    v = engine.kv_view()
    assert v.used_cells == Q and v.seq(1).shared_cells == 0
    engine.seqs.clear(1)
    v = engine.kv_view()
    assert v.used_cells == 0 and v.sequences == ()


def test_cell_map_matches_llama_cpp_after_operations(engine):
    engine.evaluate(toks(50), 0)
    engine.seqs.fork(0, 1)
    engine.seqs.trim(1, 20)
    engine.evaluate(toks(10, 3), 1)
    state = engine.sequence_state(1)
    engine.restore(state, 2)
    engine.seqs.clear(0)
    engine.evaluate(toks(33, 5), 3)  # the newest cells: in no record until the view asks
    v = engine.kv_view()
    assert v.source == "debug-log" and not v.note, v.note
    assert v.seq(1).cells == 30 and v.seq(1).shared_cells == 0
    assert v.seq(2).cells == 30 and v.seq(3).cells == 33
    assert v.used_cells == 30 + 30 + 33
    # each used cell has a position and each position of a sequence appears once
    for s in (1, 2, 3):
        mine = (v.cell_owners & np.uint64(1 << s)) != 0
        assert sorted(v.cell_pos[mine].tolist()) == list(range(v.seq(s).cells))


def test_shared_cells_take_their_owners_from_the_ledger_only_while_it_agrees(engine):
    engine.evaluate(toks(40), 0)
    engine.seqs.fork(0, 1)
    engine.seqs.fork(0, 2)
    engine.seqs.trim(2, 5)
    for i in range(3):
        engine.evaluate([9 + i], 1)
        v = engine.kv_view()
        assert v.source == "debug-log" and not v.unreported_cells, v.note
    assert v.owners(0) == [0, 1, 2] and v.owners(5) == [0, 1] and v.owners(40) == [1]
    # a wrong ledger is not believed: a shared cell's owners then come from llama.cpp's ranges
    # where only two sequences hold its position (5..39: 0 and 1), else are not reported
    engine.ctx.ledger.pos[int(np.flatnonzero(engine.ctx.ledger.owners)[0])] = 999
    v = engine.kv_view()
    assert v.source == "debug-log" and v.used_cells == 43
    assert v.owners(5) == [0, 1] and v.unreported_cells == 5 and v.cell_unreported[:5].all()
    assert "owner not reported" in v.note
    engine.clear_all()  # an empty cache is known exactly again
    assert engine.kv_view().source == "debug-log"


def test_keep_only_frees_the_other_sequences(engine):
    engine.evaluate(toks(40), 0)
    engine.seqs.fork(0, 1)
    engine.evaluate(toks(8), 2)
    engine.keep_only(1)
    v = engine.kv_view()
    assert [u.seq for u in v.sequences] == [1]
    assert (v.seq(1).cells, v.seq(1).shared_cells, v.used_cells) == (40, 0, 40)
    assert engine.seq_tokens[0] == [] and engine.seq_tokens[2] == [] and len(engine.seq_tokens[1]) == 40


def test_shift_and_divide_move_positions_and_keep_resident_honest(engine):
    engine.evaluate(toks(40), 2)
    engine.seqs.shift(2, 10, 100)
    v = engine.kv_view()
    assert (v.seq(2).cells, v.seq(2).pos_min, v.seq(2).pos_max) == (40, 0, 139)
    assert engine.ctx.pos_range(2) == (0, 139)
    assert len(engine.seq_tokens[2]) == 10 and 2 in engine.seq_tokens.moved
    with pytest.raises(KvPrimerError, match="shifted or divided"):
        engine.evaluate([5], 2)
    with pytest.raises(KvPrimerError, match="shifted or divided"):
        engine.sequence_state(2)
    engine.seqs.trim(2, 10)  # back to the exact part
    assert 2 not in engine.seq_tokens.moved and engine.kv_view().seq(2).cells == 10
    engine.evaluate(toks(40)[10:], 2)
    engine.seqs.divide(2, 20, 2)  # positions 20..39 become 10..19
    v = engine.kv_view()
    assert (v.seq(2).cells, v.seq(2).pos_max) == (40, 19) and engine.ctx.pos_range(2) == (0, 19)
    assert len(engine.seq_tokens[2]) == 10 and 2 in engine.seq_tokens.moved
    engine.seqs.shift(2, 0, -15)  # shifted below 0: those cells are freed
    assert engine.kv_view().seq(2).cells == 40 - 15 - 10  # 0..14 and the divided 10..14
    assert engine.seq_tokens[2] == []


def test_the_token_account_changes_only_through_its_owner(engine):
    # reads are copies: the account of what each sequence holds cannot be changed behind the
    # engine's back, only by the operations that change the cells (sequence_tokens.py)
    engine.evaluate(toks(12), 2)
    engine.seq_tokens[2].append(7)
    assert len(engine.seq_tokens[2]) == engine.seq_tokens.count(2) == 12
    with pytest.raises(TypeError):
        engine.seq_tokens[2] = []
    with pytest.raises(AttributeError):
        engine.seq_tokens.moved.add(2)
    engine.evaluate(toks(12), 3)
    engine.seqs.shift(3, 6, 4)  # cells of 3 alone, from position 6
    assert engine.seq_tokens[3] == toks(12)[:6] and engine.seq_tokens.moved == {3}
    engine.seqs.fork(3, 4)  # a whole copy of a moved sequence holds its moved cells too
    assert engine.seq_tokens.moved == {3, 4} and engine.seq_tokens[4] == toks(12)[:6]
    engine.seqs.fork(3, 5, upto=4)
    assert 5 not in engine.seq_tokens.moved and engine.seq_tokens[5] == toks(12)[:4]


def test_shift_of_shared_cells_is_refused(engine):
    engine.evaluate(toks(20), 0)
    engine.seqs.fork(0, 1)
    with pytest.raises(KvPrimerError, match="share cells with sequence 0"):
        engine.seqs.shift(1, 5, 3)
    assert engine.ctx.pos_range(0) == (0, 19)


def test_without_the_debug_log_the_view_is_ranges(tiny_model):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_batch=32, n_threads=1,
                             kv_debug_log=False)) as eng:
        eng.evaluate(toks(30), 0)
        eng.seqs.fork(0, 1)
        v = eng.kv_view()
        assert v.source == "ranges" and not v.has_cells and v.used_cells is None
        assert [(u.seq, u.pos_min, u.pos_max, u.shared_cells) for u in v.sequences] == [
            (0, 0, 29, None), (1, 0, 29, None)]
        assert v.as_dict()["source"] == "ranges"


def test_pos_map_parser():
    line = "".join(f"{p:<5}" if p >= 0 else ".    " for p in [0, 1, 12345, -1] * 16) + "\n"
    pos = parse_pos_map("\n" + line * 4 + "\n", 256)
    assert pos[:4].tolist() == [0, 1, 12345, -1]
    assert parse_pos_map("\n" + line * 3 + "\n", 256) is None


def test_view_json_and_bytes(engine):
    engine.evaluate(toks(12), 0)
    v = engine.kv_view()
    d = v.as_dict()
    assert list(d) == ["n_cells", "used_cells", "source", "sequences"]
    assert d["sequences"] == [{"seq": 0, "cells": 12, "pos_min": 0, "pos_max": 11, "shared_cells": 0}]
    assert d["n_cells"] == engine.ctx.n_ctx
    assert v.used_bytes == 12 * engine.info.kv_bytes_per_token


def test_listeners_receive_views_as_the_cache_changes(engine):
    seen = []
    engine.add_kv_listener(seen.append, min_interval_s=0.0)
    engine.evaluate(toks(70), 0)  # 32 + 32 + 6: three decodes
    engine.seqs.fork(0, 1)
    assert [v.used_cells for v in seen[:3]] == [32, 64, 70]
    assert seen[-1].seq(1).shared_cells == 70
    engine.remove_kv_listener(seen.append)
    n = len(seen)
    engine.clear_all()
    assert len(seen) == n
