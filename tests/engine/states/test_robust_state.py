"""State files that are damaged, hostile or foreign: always a StateFileError, never a crash, and
the context exactly as it was (resident tokens and llama.cpp's position range of every sequence).

The file-level fuzz runs without llama.cpp and can afford many cases; the payload fuzz rebuilds
a file with a valid checksum around damaged KV bytes (what a tampered or mis-written file looks
like) and goes all the way to llama_state_seq_set_data on the tiny model.
"""
from __future__ import annotations

import hashlib
import io
import json
import struct
import tracemalloc
from dataclasses import replace

import llama_cpp as L
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.engine import Engine, EngineConfig, StateFileError
from app.engine.errors import ContextError
from app.engine.llama.ggml_types import KV_TYPES
from app.engine.states.prefix_state import _HEADER, PrefixState
from app.engine.states.seq_payload import check_seq_payload
from tests.tiny_model import write_tiny_model

PREFIX = "hello world of the answer and question. " * 3
OTHER = "the assistant is helpful to you"
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                      HealthCheck.too_slow])


@pytest.fixture(scope="module")
def eng(tiny_model):
    e = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=32, n_threads=1,
                            n_seq_max=6))
    yield e
    e.close()


@pytest.fixture(scope="module")
def good(eng):
    """A real state of seq 0, and the contents seqs 1 and 2 hold during the tests."""
    eng.clear_all()
    eng.evaluate(eng.model.tokenize(PREFIX), 0, want_logits=False)
    state = eng.sequence_state(0)
    eng.seqs.clear(0)
    eng.evaluate(eng.model.tokenize(OTHER), 1, want_logits=False)
    eng.evaluate(eng.model.tokenize(OTHER + " and"), 2, want_logits=False)
    return state


@pytest.fixture(scope="module")
def good_file(good, tmp_path_factory):
    p = tmp_path_factory.mktemp("state") / "good.kvstate"
    good.save(p)
    return p.read_bytes()


def context_view(eng):
    return ({s: list(t) for s, t in eng.seq_tokens.items()},
            [eng.ctx.pos_range(s) for s in eng.seq_tokens])


def layout(state: PrefixState) -> dict[str, int]:
    """Offsets of the structural fields of the llama.cpp payload (see seq_payload)."""
    n = state.n_tokens
    d = state.data
    off = {"magic": 0, "src_seq": 4, "n_stream": 8, "cells": 12}
    for name, i in (("first", 0), ("mid", n // 2), ("last", n - 1)):
        off[f"pos_{name}"] = 16 + 12 * i
        off[f"nseq_{name}"] = 20 + 12 * i
        off[f"seq_{name}"] = 24 + 12 * i
    o = 16 + 12 * n
    v_trans, n_layer = struct.unpack_from("<II", d, o)
    off["v_trans"], off["n_layer"] = o, o + 4
    o += 8
    for il in range(n_layer):
        off[f"k_type{il}"], off[f"k_row{il}"] = o, o + 4
        o += 12 + struct.unpack_from("<Q", d, o + 4)[0] * n
    for il in range(n_layer):
        off[f"v_type{il}"] = o
        if v_trans:
            off[f"v_el{il}"], off[f"v_width{il}"] = o + 4, o + 8
            el, width = struct.unpack_from("<II", d, o + 4)
            o += 12 + el * width * n
        else:
            off[f"v_row{il}"] = o + 4
            o += 12 + struct.unpack_from("<Q", d, o + 4)[0] * n
    assert o == len(d)  # the walk above covers the payload exactly: our model of the layout holds
    return off


def with_data(state: PrefixState, data: bytes) -> PrefixState:
    return replace(state, data=data)


def try_restore(eng, state: PrefixState, seq: int = 1) -> bool:
    """Restore through the same calls the CLI and window use; True if accepted."""
    before = context_view(eng)
    try:
        eng.check_state(state)
        eng.restore(state, seq)
    except StateFileError as e:
        assert "\n" not in str(e)
        assert context_view(eng) == before
        return False
    # accepted: what we think is resident is what llama.cpp holds
    assert eng.seq_tokens[seq] == list(state.tokens)
    assert eng.ctx.pos_range(seq) == (0, state.n_tokens - 1)
    return True


def put_back(eng, seq: int = 1) -> None:
    eng.seqs.clear(seq)
    eng.evaluate(eng.model.tokenize(OTHER), seq, want_logits=False)


# ---- the file layer, no llama.cpp ---------------------------------------------------------


def load_bytes(tmp_path, raw: bytes):
    p = tmp_path / "x.kvstate"
    p.write_bytes(raw)
    return PrefixState.load(p)


_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 1 << 30)),
    st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(0, 7)),
    st.tuples(st.just("overwrite"), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
)


def read_bytes(raw: bytes):
    """PrefixState.load without the file system, for the exhaustive loops below."""
    return PrefixState._read(io.BytesIO(raw), len(raw), "x.kvstate")


def test_every_single_bit_flip_and_every_cut_is_refused(good_file, good):
    # Exhaustive over the header and metadata (where lengths and types live), sampled over the
    # body: a few thousand cases in about a second.
    meta_end = _HEADER.size + _HEADER.unpack_from(good_file)[2]
    offsets = [*range(meta_end), *range(meta_end, len(good_file), 97)]
    cases = 0
    for i in offsets:
        for bit in (0, 3, 7):
            raw = bytearray(good_file)
            raw[i] ^= 1 << bit
            with pytest.raises(StateFileError):
                read_bytes(bytes(raw))
            cases += 1
    for cut in [*range(0, meta_end + 64), *range(meta_end + 64, len(good_file), 61)]:
        with pytest.raises(StateFileError):
            read_bytes(good_file[:cut])
        cases += 1
    assert cases > 2000
    assert read_bytes(good_file) == good


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(muts=st.lists(_mutation, min_size=1, max_size=3))
def test_damaged_files_are_refused_with_one_line(good_file, good, tmp_path, muts):
    raw = bytearray(good_file)
    for m in muts:
        if m[0] == "truncate":
            del raw[m[1] % (len(raw) + 1):]
        elif m[0] == "flip" and raw:
            raw[m[1] % len(raw)] ^= 1 << m[2]
        elif m[0] == "overwrite" and raw:
            i = m[1] % len(raw)
            raw[i:i + len(m[2])] = m[2]
        elif m[0] == "append":
            raw += m[1]
    if bytes(raw) == good_file:
        assert load_bytes(tmp_path, bytes(raw)) == good
        return
    with pytest.raises(StateFileError) as e:
        load_bytes(tmp_path, bytes(raw))
    assert "\n" not in str(e.value) and str(e.value)


@pytest.mark.parametrize("meta_len, body_len, match", [
    (0xFFFFFFFF, 10, "metadata"),  # 4 GiB of metadata
    (100, 1 << 63, "truncated"),
    (100, (1 << 64) - 1, "truncated"),
    (0, 0, "longer than"),
])
def test_absurd_declared_lengths_allocate_nothing(good_file, tmp_path, meta_len, body_len, match):
    magic, version, _, _, digest = _HEADER.unpack_from(good_file)
    raw = _HEADER.pack(magic, version, meta_len, body_len, digest) + good_file[_HEADER.size:]
    tracemalloc.start()
    try:
        with pytest.raises(StateFileError, match=match):
            load_bytes(tmp_path, raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024


def test_metadata_of_the_wrong_kind_is_refused(good, tmp_path):
    for bad in ({"n_tokens": 1.5}, {"n_tokens": True}, {"type_k": 3}, {"created": "x"}):
        meta = good.meta()
        meta.update(bad)
        m = json.dumps(meta).encode()
        toks = np.asarray(good.tokens, dtype="<i4").tobytes()
        body = toks + good.data
        raw = _HEADER.pack(b"KVPSTATE", 1, len(m), len(body), hashlib.sha256(m + body).digest())
        with pytest.raises(StateFileError, match="corrupt"):
            load_bytes(tmp_path, raw + m + body)


def test_kv_type_ids_agree_with_llama_cpp():
    for t in KV_TYPES.values():
        if t.name != "bf16":  # llama-cpp-python has no GGML_TYPE_BF16
            assert getattr(L, f"GGML_TYPE_{t.name.upper()}") == t.id, t.name
    assert KV_TYPES["bf16"].id == L.GGML_TYPE_IQ1_M + 1  # ggml.h: IQ1_M = 29, BF16 = 30


# ---- the payload: valid checksum, bad KV bytes, all the way to llama.cpp -------------------

_VALUES = [0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 1023, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def test_layout_model_matches_this_build(good):
    off = layout(good)  # asserts the walk ends exactly at the end of the payload
    assert struct.unpack_from("<I", good.data, off["cells"])[0] == good.n_tokens


@FAST
@given(field=st.integers(0, 10_000), value=st.sampled_from(_VALUES),
       width=st.sampled_from([4, 8]))
def test_crafted_payload_fields_never_reach_llama_unchecked(eng, good, field, value, width):
    off = layout(good)
    name = sorted(off)[field % len(off)]
    data = bytearray(good.data)
    at = off[name]
    struct.pack_into("<Q" if width == 8 and at + 8 <= len(data) else "<I", data, at, value)
    state = with_data(good, bytes(data))
    accepted = try_restore(eng, state)
    if accepted:
        assert bytes(data) == good.data or name.startswith(("src_seq", "seq_"))
        assert eng.evaluate(eng.model.tokenize(" x"), 1) is not None  # and it computes
    put_back(eng)


@FAST
@given(at=st.integers(0, 1 << 30), junk=st.binary(min_size=1, max_size=24))
def test_random_payload_bytes_are_refused_or_consistent(eng, good, at, junk):
    data = bytearray(good.data)
    i = at % len(data)
    data[i:i + len(junk)] = junk
    try_restore(eng, with_data(good, bytes(data[:len(good.data)])))
    put_back(eng)


@FAST
@given(cut=st.integers(0, 1 << 30), extra=st.binary(max_size=8))
def test_truncated_or_padded_payload_is_refused(eng, good, cut, extra):
    data = good.data[:cut % len(good.data)] + extra
    if data == good.data:
        return
    assert not try_restore(eng, with_data(good, data))
    put_back(eng)


@pytest.mark.parametrize("field, value", [
    ("pos_first", -1), ("pos_first", 1), ("pos_last", 0x7FFFFFFF), ("pos_mid", -0x80000000),
    ("pos_last", 0), ("nseq_mid", 2), ("cells", 0xFFFFFFFF), ("cells", 0), ("n_stream", 2),
    ("n_layer", 0xFFFFFFFF), ("k_row0", 0), ("v_type1", 9),
])
def test_payloads_llama_cpp_would_accept_wrongly_are_refused(eng, good, field, value):
    # Found by this suite: llama.cpp takes any cell position; a negative or INT_MAX one leaves a
    # cell that seq_rm can never remove, so the sequence's range stays wrong for good.
    data = bytearray(good.data)
    struct.pack_into("<i" if value < 0 else "<I", data, layout(good)[field], value)
    before = context_view(eng)
    with pytest.raises(StateFileError, match="malformed"):
        eng.restore(with_data(good, bytes(data)), 1)
    assert context_view(eng) == before


def test_state_refused_by_llama_cpp_puts_the_sequence_back(eng, good, tmp_path):
    # A three-layer model's state with this model's fingerprint (a forged file): our checks
    # pass, llama.cpp refuses the layer count after it has cleared the target sequence.
    wide = write_tiny_model(tmp_path / "three.gguf", n_layer=3)
    with Engine(EngineConfig(model_path=str(wide), n_ctx=256, n_batch=32, n_threads=1)) as other:
        other.evaluate(other.model.tokenize(PREFIX), 0, want_logits=False)
        foreign = replace(other.sequence_state(0), model_sha256=good.model_sha256)
    before = context_view(eng)
    assert before[0][1]  # seq 1 holds something to lose
    with pytest.raises(StateFileError, match="rejected"):
        eng.restore(foreign, 1)
    assert context_view(eng) == before
    assert eng.evaluate(eng.model.tokenize(" and"), 1) is not None
    put_back(eng)


def test_token_ids_outside_the_vocabulary(eng, good):
    bad = replace(good, tokens=(*good.tokens[:-1], eng.info.n_vocab))
    before = context_view(eng)
    with pytest.raises(StateFileError, match="vocabulary"):
        eng.restore(bad, 1)
    assert context_view(eng) == before
    # llama.cpp aborts the process on an unknown id in token_to_piece; we refuse first
    with pytest.raises(ContextError, match="vocabulary"):
        eng.model.piece(eng.info.n_vocab)
    with pytest.raises(ContextError, match="vocabulary"):
        eng.model.is_eog(-1)


def test_garbage_floats_in_a_well_formed_state_do_not_crash(eng, good):
    # NaN/inf K and V (0xFF bytes) pass every structural check: the checksum guards files
    # against accidents, not against a forger. The run must still end normally.
    off = layout(good)
    data = bytearray(good.data)
    ends = sorted(v for k, v in off.items() if k.startswith(("k_row", "v_row", "v_width")))
    start = ends[0] + 8 if ends else len(data)
    data[start:start + 64] = b"\xff" * 64
    assert try_restore(eng, with_data(good, bytes(data)))
    logits = eng.evaluate(eng.model.tokenize(" the"), 1)
    assert logits.shape == (eng.info.n_vocab,)
    put_back(eng)


def test_file_with_recomputed_checksum_is_refused_by_load_state(eng, good, tmp_path):
    data = bytearray(good.data)
    struct.pack_into("<i", data, layout(good)["pos_last"], -5)
    p = tmp_path / "forged.kvstate"
    with_data(good, bytes(data)).save(p)  # save computes a fresh, valid checksum
    assert PrefixState.load(p).data == bytes(data)
    with pytest.raises(StateFileError, match="malformed"):
        eng.load_state(p)


def fragmented(e):
    """Seq 0 holding 15 tokens whose cells are out of position order in the cache."""
    toks = e.model.tokenize("hello world of the answer and question " * 3)
    e.evaluate(toks[:40], 1, want_logits=False)
    e.evaluate(toks[:10], 0, want_logits=False)
    e.seqs.clear(1)
    e.evaluate(toks[10:15], 0, want_logits=False)
    return toks[:15]


def cell_positions(data: bytes, n: int) -> list[int]:
    return list(np.frombuffer(data, dtype="<i4", count=3 * n, offset=16).reshape(n, 3)[:, 0])


@pytest.mark.parametrize("kv", ["f16", "q8_0"])  # V transposed (no flash attention) and not
def test_a_fragmented_sequence_saves_in_position_order_and_restores(tiny_model, kv):
    # llama.cpp writes cells in cache order; the check accepts any order of 0..n-1, and the
    # snapshot sorts them so a restore lays them out as a cold run would
    from app.engine.states.seq_payload import in_position_order

    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=64, n_threads=1,
                             n_seq_max=6, type_k=kv, type_v=kv)) as e:
        toks = fragmented(e)
        raw = e.ctx.state_get(0)
        assert cell_positions(raw, 15) != list(range(15))  # really out of order
        check_seq_payload(raw, 15)  # accepted as it is
        state = e.sequence_state(0)
        assert cell_positions(state.data, 15) == list(range(15))
        assert len(state.data) == len(raw) and in_position_order(state.data) is state.data
        e.seqs.clear(0)
        e.restore(state, 2)
        assert e.ctx.pos_range(2) == (0, 14) and e.seq_tokens[2] == toks
        # each K/V row moved with its position: trimming to 8 keeps the first 8 tokens' rows,
        # and the next token's logits equal a cold run's bit for bit (a position-only sort
        # gave |Δlogit| 20 here)
        e.seqs.trim(2, 8)
        warm = e.evaluate(toks[8:9], 2)
        e.evaluate(toks[:8], 1, want_logits=False)
        cold = e.evaluate(toks[8:9], 1)
        assert np.array_equal(warm, cold)


def test_warm_equals_cold_after_the_cache_was_fragmented(tiny_model):
    # The user's sequence comes and goes while a second template reuses the first one's
    # resident prefix: its freed cells would take the second template's extra prefix tokens
    # out of order; the cache lays its cells out again first, so the warm run stays exact.
    from app.engine import GenerationConfig, Template, run_prompt

    base = "<|im_start|>system\nyou are a helpful assistant. " + "hello world of the answer. " * 8
    a = Template.parse(base + "the context is A\n<c>\n<q>")
    b = Template.parse(base + "the context is the other one\n<c>\n<q>")
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             n_seq_max=8, type_k="q8_0", type_v="q8_0")) as e:
        e.evaluate(e.model.tokenize("hello world " * 30), 0, want_logits=False)
        e.prime(a)
        e.seqs.clear(0)
        rep = run_prompt(e, b, {"c": "the world", "q": "hello?"}, gen=GenerationConfig(max_tokens=4))
        assert rep.reused_tokens > 200 and rep.verdict.exact


def test_sorting_cells_never_raises_on_bad_bytes(good):
    from app.engine.states.seq_payload import in_position_order

    off = layout(good)
    for name, at in off.items():
        for value in (0, 1, 0xFFFFFFFF):
            data = bytearray(good.data)
            struct.pack_into("<I", data, at, value)
            out = in_position_order(bytes(data))
            assert len(out) == len(data)
    for cut in range(0, len(good.data), 97):
        assert in_position_order(good.data[:cut]) == good.data[:cut]
