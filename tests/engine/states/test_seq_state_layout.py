"""llama.cpp's sequence-state bytes through the one reader/writer (states/seq_state_layout.py):
parse then write gives the same bytes on every kind of tiny model, the description says what
the model is, the writer moves rows with their cells, and a state of a format version this
reader does not know is refused in one line before its bytes are read."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.engine import Engine, EngineConfig, StateFileError, Template
from app.engine.states import seq_payload
from app.engine.states.llama_state_file import save_llama_state, state_file_info
from app.engine.states.prefix_state import PrefixState
from app.engine.states.seq_payload import check_seq_payload, in_position_order, v_transposed
from app.engine.states.seq_state_layout import (READS, KvBlock, LayoutError, parse, running_format)
from tests.tiny_model import write_arch_model

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3 + "\n<q>")

# (architecture, flash attention): attention with V transposed (off) and not (on), sliding
# window (two caches; flash attention only, see kernel_choice), hybrids (qwen35's cells carry M-RoPE fields), recurrent
CASES = [("llama", "off"), ("llama", "on"), ("gemma3", "on"), ("lfm2", "off"),
         ("lfm2", "on"), ("granitehybrid", "off"), ("nemotron_h", "off"), ("qwen35", "off"),
         ("mamba2", "off")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layout")
    return {a: write_arch_model(folder / f"{a}.gguf", a) for a in {a for a, _ in CASES}}


def _engine(path, fa: str = "off", **kw) -> Engine:
    return Engine(EngineConfig(model_path=str(path), n_ctx=512, n_batch=32, n_threads=1,
                               flash_attn=fa, **kw))


def _one_line(e) -> str:
    text = str(e.value)
    assert text and "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-fa-{c[1]}")
def primed(request, models):
    arch, fa = request.param
    with _engine(models[arch], fa) as eng:
        state = eng.prime(TPL)
        partial = eng.ctx.state_get(0, partial=True) if eng.stateful else None
        yield arch, fa, eng.family, eng.info, state, partial


def test_parse_then_write_gives_the_same_bytes(primed):
    arch, fa, family, info, state, partial = primed
    desc = parse(state.data, state.seq_state_version)
    assert desc.to_bytes() == state.data
    assert parse(state.data, state.seq_state_version, family).to_bytes() == state.data
    assert desc.family == family  # told from the bytes alone
    if partial is not None:  # the recurrent part alone (what the radix cache keeps per node)
        rec = parse(partial, state.seq_state_version, "recurrent")
        assert rec.to_bytes() == partial and not rec.kv
    assert in_position_order(state.data) is state.data  # a snapshot is already in order


def test_the_description_says_what_the_model_keeps(primed):
    arch, fa, family, info, state, _ = primed
    desc = parse(state.data, state.seq_state_version)
    n = state.n_tokens
    if family == "recurrent":
        assert not desc.kv and v_transposed(state.data) is None
    else:
        s = desc.first_stream
        assert np.array_equal(s.positions, np.arange(n)) and set(s.seq_id_counts) == {1}
        assert s.cells.shape[1] == (6 if arch == "qwen35" else 3)  # M-RoPE's x, y, token
        # llama.cpp stores V transposed without flash attention
        assert s.v_trans == (fa == "off") == v_transposed(state.data)
        assert len(desc.kv) == (2 if arch == "gemma3" else 1)  # full cache, then the window
        if arch == "llama":
            per_token = sum(k.cell_bytes + v.cell_bytes for k, v in zip(s.k, s.v))
            assert len(s.k) == info.n_layer and per_token == info.kv_bytes_per_token
    if family == "attention":
        assert desc.recurrent is None
    else:  # one record, at the sequence's last position, of the model's fixed size
        assert desc.recurrent.position == n - 1
        assert desc.recurrent.nbytes == info.traits.recurrent_state_bytes - 8


@pytest.mark.parametrize("fa", ["off", "on"])
def test_the_writer_moves_every_row_with_its_cell(models, fa):
    with _engine(models["llama"], fa) as eng:
        state = eng.prime(TPL)
        desc = parse(state.data, state.seq_state_version)
        s = desc.first_stream
        order = np.random.default_rng(1).permutation(s.n_cells)
        shuffled = replace(desc, kv=(KvBlock((s.reordered(order),)),)).to_bytes()
        assert shuffled != state.data and len(shuffled) == len(state.data)
        back = parse(shuffled, state.seq_state_version).first_stream
        assert np.array_equal(back.positions, order)
        assert np.array_equal(back.k[1].data[0], s.k[1].data[order[0]])
        got, was = back.v[1].data, s.v[1].data  # transposed V: one column per cell
        if s.v_trans:
            assert np.array_equal(got[:, 0], was[:, order[0]])
        else:
            assert np.array_equal(got[0], was[order[0]])
        check_seq_payload(shuffled, state.n_tokens)  # any order of 0..n-1 is a valid state
        assert in_position_order(shuffled) == state.data  # sorting undoes it, byte for byte


def test_a_state_of_another_version_is_refused_in_one_line(models, tmp_path):
    with _engine(models["llama"]) as eng:
        state = eng.prime(TPL)
        other = replace(state, seq_state_version=READS.seq_state_version + 1)
        v = other.seq_state_version
        before = {q: list(t) for q, t in eng.seq_tokens.items()}
        for call in (lambda: eng.check_state(other), lambda: eng.restore(other, 5),
                     lambda: parse(state.data, v), lambda: other.check_payload(eng.info.n_vocab)):
            with pytest.raises(StateFileError) as e:
                call()
            line = _one_line(e)
            assert f"seq-state version {v}" in line and f"reads version {READS.seq_state_version}" \
                in line and READS.written_for in line, line
        assert {q: list(t) for q, t in eng.seq_tokens.items()} == before  # nothing restored
        # our file records the version: refused before its KV bytes are read (they are junk)
        path = tmp_path / "other.kvstate"
        replace(other, data=b"\x00junk" * 40).save(path)
        with pytest.raises(StateFileError, match=f"seq-state version {v}") as e:
            PrefixState.load(path)
        _one_line(e)
        assert state_file_info(path).seq_state_version == v  # still listed, with its version
        # llama.cpp's own file: refused at its header
        save_llama_state(replace(other, data=b"\x00junk" * 40), tmp_path / "other.bin")
        with pytest.raises(StateFileError, match=f"seq-state version {v}") as e:
            eng.load_state(tmp_path / "other.bin")
        _one_line(e)


@pytest.mark.parametrize("arch", ["llama", "lfm2", "mamba2"])
def test_truncated_or_garbage_payloads_get_one_clear_line(models, arch):
    with _engine(models[arch]) as eng:
        state = eng.prime(TPL)
        bad = {"truncated": state.data[:len(state.data) // 2], "cut at the end": state.data[:-1],
               "garbage": b"\x00junk" * 100, "empty": b"",
               "padded": state.data + b"\x00" * 8}
        for name, data in bad.items():
            with pytest.raises(StateFileError, match="malformed") as e:
                eng.check_state(replace(state, data=data))
            _one_line(e)
            assert in_position_order(data) == data, name  # rewrites leave what they cannot read
        with pytest.raises(LayoutError):
            parse(b"\x00junk" * 100, READS.seq_state_version)


def test_the_reader_is_for_the_llama_cpp_installed(models, monkeypatch):
    from app.engine.llama.native import SEQ_STATE_VERSION

    running = running_format()
    assert (running.seq_state_version, running.session_version) == \
        (READS.seq_state_version, READS.session_version) == (SEQ_STATE_VERSION, 10)
    with _engine(models["llama"]) as eng:
        state = eng.prime(TPL)
        s = parse(state.data, state.seq_state_version)
        shuffled = replace(s, kv=(KvBlock((s.first_stream.reordered(
            np.arange(state.n_tokens)[::-1]),)),)).to_bytes()
        # under a llama.cpp whose format this reader does not know, nothing rewrites its bytes,
        # and no state is restored unchecked
        line = "KV Primer runs llama-cpp-python 9.9 (llama.cpp seq-state version 3, session 11)"
        monkeypatch.setattr(seq_payload, "_library_problem", lambda: line)
        assert in_position_order(shuffled) is shuffled
        assert v_transposed(state.data) is None
        with pytest.raises(StateFileError, match="llama-cpp-python 9.9") as e:
            eng.restore(state, 2)
        _one_line(e)
        assert not eng.seq_tokens[2]


def test_the_line_for_another_llama_cpp_names_both(monkeypatch):
    from app.engine.states import seq_state_layout as layout

    monkeypatch.setattr(layout, "running_format", lambda: layout.StateFormat(
        3, 11, "llama-cpp-python 0.3.40"))
    line = layout.library_problem()
    assert "llama-cpp-python 0.3.40" in line and "session version 11" in line
    assert READS.written_for in line and "\n" not in line
