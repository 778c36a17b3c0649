"""A .kvstate body is read straight into the bytes the state keeps and hashed as it arrives,
in chunks: the same state as one read gives, a chunk boundary anywhere, and a file that
shrinks under the reader fails its checksum rather than loading short."""
from __future__ import annotations

import io

import pytest

from app.engine.errors import StateFileError
from app.engine.states import body_buffer
from app.engine.states.prefix_state import PrefixState
from tests.engine.states.test_prefix_state_file import make


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 1024, 4 << 20])
def test_chunked_reads_give_the_state_back(tmp_path, monkeypatch, chunk, overlap):
    monkeypatch.setattr(body_buffer, "CHUNK", chunk)
    # the reader thread (body_buffer._read_overlapped) on a small file, or the caller's thread
    monkeypatch.setattr(body_buffer, "OVERLAP_MIN", 0 if overlap else 1 << 60)
    s = make(data=bytes(range(256)) * 40 + b"end")
    p = tmp_path / "a.kvstate"
    s.save(p)
    back = PrefixState.load(p)
    assert back == s and type(back.data) is bytes and back.data == s.data
    # from memory as well (no file descriptor to advise)
    raw = p.read_bytes()
    assert PrefixState._read(io.BytesIO(raw), len(raw), "a.kvstate") == s


@pytest.mark.parametrize("overlap", [False, True])
def test_a_body_cut_short_while_reading_fails_the_checksum(tmp_path, monkeypatch, overlap):
    monkeypatch.setattr(body_buffer, "OVERLAP_MIN", 0 if overlap else 1 << 60)
    s = make(data=bytes(range(256)) * 40)
    p = tmp_path / "a.kvstate"
    s.save(p)
    raw = p.read_bytes()

    class Shrinking(io.BytesIO):  # the size checked, then the file cut under the reader
        def readinto(self, b):
            n = super().readinto(b)
            return min(n, 100)

    f = Shrinking(raw[:-500])
    with pytest.raises(StateFileError, match="checksum"):
        PrefixState._read(f, len(raw), "a.kvstate")


def test_new_bytes_are_filled_through_their_view():
    from app.engine.llama.native import new_bytes

    data, view = new_bytes(5)
    view[:] = b"hello"
    view.release()
    assert data == b"hello" and type(data) is bytes
    empty, v0 = new_bytes(0)
    assert empty == b"" and len(v0) == 0


def test_a_state_is_checked_once_per_engine_set_up(engine, monkeypatch):
    """Loading a file, adopting it and running from it each ask for the check: the layout walk
    runs once for one state object, again for another or after the kernel changed."""
    from app.engine import Template, run_prompt
    from app.engine.runs.generation import GenerationConfig

    tpl = Template.parse("hello world of the answer and question. " * 4 + "<q>")
    state = engine.prime(tpl)
    walks = []
    real = type(engine)._check_state
    monkeypatch.setattr(type(engine), "_check_state",
                        lambda self, s: (walks.append(s), real(self, s))[1])
    engine.check_state(state)
    engine.adopt(state)
    rep = run_prompt(engine, tpl, {"q": "why?"}, reuse="prefix", state=state,
                     gen=GenerationConfig(max_tokens=2))
    assert rep.verdict.exact and len(walks) == 1
    from dataclasses import replace

    engine.check_state(replace(state))  # an equal state, another object: checked
    assert len(walks) == 2
