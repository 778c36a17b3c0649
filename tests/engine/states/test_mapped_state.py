"""A .kvstate in the page cache goes straight from its pages into the work context's cells
(app/engine/states/mapped_state.py, state_flows.placed_state); anything else is read as before."""
import mmap
import threading

import pytest

from app.engine import (Engine, EngineConfig, GenerationConfig, StateFileError, Template,
                        kv_flows, run_prompt, state_flows)
from app.engine.states.mapped_state import mapped_state_file
from app.engine.states.prefix_state import PrefixState
from bench.scale_ours import drop_from_page_cache

TPL = Template.parse("hello world of the answer and question. " * 8 + "<q>")
VALUES = {"q": "why is the sky"}


def _engine(model):
    return Engine(EngineConfig(model_path=str(model), n_ctx=512, n_batch=32, n_threads=1))


@pytest.fixture
def saved(tiny_model, tmp_path):
    with _engine(tiny_model) as eng:
        state = eng.prime(TPL)
    path = tmp_path / "p.kvstate"
    state.save(path)
    path.read_bytes()
    with mapped_state_file(path) as mapped:
        if mapped is None:  # the fallback itself is what every other test runs here
            pytest.skip("no read leases or no local file system for the tests' files here")
    return state, path


def test_a_cached_state_goes_into_the_work_context_and_the_run_copies_nothing(
        tiny_model, saved):
    state, path = saved
    path.read_bytes()  # in the page cache, as after `prime -o` or a recent load
    with mapped_state_file(path) as mapped:
        assert mapped is not None
    with _engine(tiny_model) as eng:
        got = state_flows.load_state(eng, path, TPL)
        assert eng.work.tokens == list(state.tokens)  # placed on the way
        assert type(got.data) is bytes and got.data == state.data  # its own copy, whole
        assert got.tokens == state.tokens and got.model_sha256 == state.model_sha256
        assert [n.label for n in kv_flows.cached_sequences(eng).values()] == ["saved state"]
        rep = run_prompt(eng, TPL, VALUES, reuse="prefix", state=got,
                         gen=GenerationConfig(max_tokens=4))
        assert rep.reused_tokens == state.n_tokens and rep.copied_tokens == 0
        assert rep.verdict.equivalence == "bit-identical"


def test_a_corrupt_cached_state_is_refused_and_its_placed_cells_are_dropped(tiny_model, saved):
    state, path = saved
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x40  # a KV byte; the checksum is not made again
    path.write_bytes(bytes(raw))
    with mapped_state_file(path) as mapped:
        assert mapped is not None  # the mapped path is the one that meets it
    with _engine(tiny_model) as eng:
        with pytest.raises(StateFileError, match="checksum mismatch"):
            state_flows.load_state(eng, path, TPL)
        assert eng.work.tokens == []
        assert eng.work.ctx.pos_range(0)[1] < 0  # no cell left in the run's sequence
        assert kv_flows.cached_sequences(eng) == {}


def test_a_file_open_for_writing_elsewhere_is_read_not_mapped(tiny_model, saved):
    state, path = saved
    with open(path, "r+b"):  # someone writing it: no lease
        with mapped_state_file(path) as mapped:
            assert mapped is None
        with _engine(tiny_model) as eng:
            got = state_flows.load_state(eng, path, TPL)
            assert got.data == state.data
            assert eng.work.tokens == []  # read and adopted, not placed


def test_a_writer_waits_until_the_mapping_is_given_back(saved):
    state, path = saved
    path.read_bytes()
    opened = threading.Event()

    def writer():
        with open(path, "r+b") as f:  # blocks on the lease
            opened.set()
            f.truncate(0)

    t = threading.Thread(target=writer, daemon=True)
    with mapped_state_file(path) as mapped:
        assert mapped is not None
        t.start()
        assert not opened.wait(0.5)  # still waiting while the pages are in use
        assert bytes(mapped.body[-64:]) == state.data[-64:]
    t.join(30)
    assert opened.is_set() and path.stat().st_size == 0  # then it went ahead


def test_a_state_not_in_the_page_cache_is_read_not_mapped(tiny_model, saved):
    state, path = saved  # mapped while cached (the fixture): dropping is the only change
    drop_from_page_cache(path)
    with mapped_state_file(path) as mapped:
        if mapped is not None:
            pytest.skip("this file system keeps the file's pages (tmpfs): nothing to drop")
    with _engine(tiny_model) as eng:
        got = state_flows.load_state(eng, path, TPL)
        assert got.data == state.data and eng.work.tokens == []


def test_a_mapped_state_and_a_read_one_are_the_same_state(saved):
    state, path = saved
    path.read_bytes()
    undone = []
    with mapped_state_file(path) as mapped:
        view = mapped.view_state()
        kept = mapped.copy_checked(view, lambda: True, lambda: undone.append(1))
        # llama.cpp would not take the cells: nothing kept, nothing to undo (the file is read)
        assert mapped.copy_checked(view, lambda: False, lambda: undone.append(1)) is None
    assert kept == PrefixState.load(path) and type(kept.data) is bytes and not undone


def test_a_failed_copy_is_raised_in_the_callers_thread_and_undoes_the_placement(saved,
                                                                              monkeypatch):
    from app.engine.states import mapped_state

    def no_memory(n):
        raise MemoryError

    monkeypatch.setattr(mapped_state, "new_body", no_memory)
    undone = []
    with mapped_state_file(saved[1]) as mapped:
        with pytest.raises(MemoryError):
            mapped.copy_checked(mapped.view_state(), lambda: True, lambda: undone.append(1))
    assert undone == [1]


def test_a_timing_in_the_metadata_that_is_not_sound_is_ignored(saved, tmp_path):
    """Older files have none, and a file whose checksum was made again after an edit may hold
    anything: neither may stop the load or the estimate."""
    from dataclasses import replace

    from app.engine.states.prefix_state import PrimeTiming

    state, _path = saved
    n = state.n_tokens
    good = {"start": 0, "end": n, "ms": 120.5, "machine": "a CPU"}
    assert PrimeTiming.from_meta(good, n) == PrimeTiming(0, n, 120.5, "a CPU")
    for bad in (None, {}, {**good, "start": "x"}, {**good, "end": n + 1}, {**good, "ms": 0},
                {**good, "ms": float("inf")}, {**good, "end": float("inf")},
                {**good, "end": 10 ** 400}, {**good, "start": n}):
        assert PrimeTiming.from_meta(bad, n) is None, bad
    p = tmp_path / "t.kvstate"
    replace(state, prime_timing=PrimeTiming(0, n, 99.0, "a CPU")).save(p)
    assert PrefixState.load(p).prime_timing == PrimeTiming(0, n, 99.0, "a CPU")


def test_a_prefetched_state_is_in_the_page_cache_before_it_is_loaded(saved):
    """`run --state` asks for the file before the model loads: the kernel reads it into the
    page cache in the background, so the load finds it there and maps it."""
    import time

    from app.engine.states.mapped_state import _all_cached

    def cached() -> bool:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            try:
                return _all_cached(m, len(m))
            finally:
                m.close()

    _state, path = saved
    drop_from_page_cache(path)
    if cached():
        pytest.skip("this file system keeps the file's pages (tmpfs): nothing to drop")
    state_flows.prefetch_state(path)
    deadline = time.monotonic() + 10
    while not cached() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cached()
    with mapped_state_file(path) as mapped:
        assert mapped is not None
    state_flows.prefetch_state(path.with_name("missing.kvstate"))  # the load will say why
