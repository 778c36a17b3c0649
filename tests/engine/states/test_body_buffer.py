"""A state file's body is read into new bytes whose whole 2 MiB pages are advised to huge
pages (fewer page faults on the first write); the bytes are ordinary bytes either way."""
from __future__ import annotations

import ctypes
import io
from pathlib import Path

import pytest

from app.engine.states import body_buffer
from app.engine.states.body_buffer import HUGE_PAGE, huge_page_span, new_body
from app.engine.states.prefix_state import PrefixState
from tests.engine.states.test_prefix_state_file import make


def test_the_span_is_the_whole_huge_pages_inside():
    assert huge_page_span(0, 3 * HUGE_PAGE) == (0, 3 * HUGE_PAGE)
    assert huge_page_span(16, 3 * HUGE_PAGE) == (HUGE_PAGE, 2 * HUGE_PAGE)
    assert huge_page_span(16, HUGE_PAGE + 100)[1] == 0  # no whole page inside
    assert huge_page_span(HUGE_PAGE - 8, 2 * HUGE_PAGE + 8) == (HUGE_PAGE, 2 * HUGE_PAGE)


@pytest.mark.parametrize("n", [0, 5, body_buffer.MIN_ADVISED + 12345])
def test_a_body_is_plain_bytes_filled_through_its_view(n):
    data, view = new_body(n)
    view[:] = bytes(i % 251 for i in range(n))
    view.release()
    assert type(data) is bytes and len(data) == n
    assert data == bytes(i % 251 for i in range(n))


def _vm_flags(addr: int) -> set[str]:
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    return set()


@pytest.mark.skipif(body_buffer._MADVISE is None
                    or not Path("/sys/kernel/mm/transparent_hugepage").exists(),
                    reason="no transparent huge pages here")
def test_a_large_body_is_advised_to_huge_pages():
    n = 3 * HUGE_PAGE
    data, view = new_body(n)
    view.release()
    addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    start, length = huge_page_span(addr, n)
    assert length >= HUGE_PAGE
    assert "hg" in _vm_flags(start)  # VM_HUGEPAGE: the advice reached the kernel


def test_a_large_state_file_round_trips(tmp_path):
    s = make(data=bytes(range(256)) * (body_buffer.MIN_ADVISED // 256 + 7))
    p = tmp_path / "big.kvstate"
    s.save(p)
    back = PrefixState.load(p)
    assert back == s and type(back.data) is bytes


def test_a_llama_cpp_file_cut_short_while_reading_says_truncated():
    from array import array

    from app.engine.errors import StateFileError
    from app.engine.states.llama_state_file import read_llama_state
    from app.engine.states.seq_state_layout import buffer_head, file_head

    raw = file_head(3, 2) + array("i", [5, 6]).tobytes() + b"kv" * 50
    with pytest.raises(StateFileError, match="truncated") as e:
        read_llama_state(io.BytesIO(raw), len(raw) + 100, "s.bin")  # the file shrank
    assert "\n" not in str(e.value)
    # read whole, the body comes back behind the in-memory head, as bytes
    with pytest.raises(StateFileError, match="malformed|KV"):
        read_llama_state(io.BytesIO(raw), len(raw), "s.bin").check_payload(100)
    from app.engine.states import llama_state_file

    assert llama_state_file._read_body(io.BytesIO(b"xyz"), 3, "s") == buffer_head() + b"xyz"


def test_read_body_puts_the_head_first_and_hands_every_chunk_over(monkeypatch):
    monkeypatch.setattr(body_buffer, "CHUNK", 7)  # several chunks from a small file
    raw = bytes(range(40))
    seen = []
    data, got = body_buffer.read_body(io.BytesIO(raw), 40, head=b"HD",
                                      on_chunk=lambda v: seen.append(bytes(v)))
    assert (data, got) == (b"HD" + raw, 40)
    assert b"".join(seen) == raw and max(len(c) for c in seen) == 7
    # a file shorter than asked: how much of it there was, the rest left unfilled
    data, got = body_buffer.read_body(io.BytesIO(raw[:10]), 40, head=b"HD")
    assert got == 10 and len(data) == 42 and data[:12] == b"HD" + raw[:10]


class _Recording(io.BytesIO):
    """A file that notes which thread made each read."""

    def __init__(self, raw: bytes):
        super().__init__(raw)
        self.threads: list[int] = []

    def readinto(self, b):
        import threading

        self.threads.append(threading.get_ident())
        return super().readinto(b)


def test_a_large_body_is_read_in_another_thread_while_chunks_are_handed_over(monkeypatch):
    """From OVERLAP_MIN bytes a reader thread reads ahead while the caller's thread hashes:
    every chunk still reaches ``on_chunk`` once, in order, in the caller's thread."""
    import threading

    monkeypatch.setattr(body_buffer, "CHUNK", 7)
    monkeypatch.setattr(body_buffer, "OVERLAP_MIN", 14)
    raw = bytes(range(200))
    f = _Recording(raw)
    seen, where = [], set()

    def on_chunk(v):
        seen.append(bytes(v))
        where.add(threading.get_ident())

    data, got = body_buffer.read_body(f, 200, head=b"HD", on_chunk=on_chunk)
    assert (data, got) == (b"HD" + raw, 200)
    assert b"".join(seen) == raw and max(len(c) for c in seen) == 7
    assert where == {threading.get_ident()}
    assert threading.get_ident() not in f.threads  # the reads were the reader thread's
    # a file shorter than asked: how much of it there was
    data, got = body_buffer.read_body(_Recording(raw[:30]), 200, on_chunk=lambda v: None)
    assert got == 30 and data[:30] == raw[:30]
    # below OVERLAP_MIN, or with nothing to hand over, the caller's thread reads
    small = _Recording(raw[:10])
    assert body_buffer.read_body(small, 10, on_chunk=lambda v: None)[1] == 10
    assert set(small.threads) == {threading.get_ident()}


def test_a_read_error_in_the_reader_thread_reaches_the_caller(monkeypatch):
    monkeypatch.setattr(body_buffer, "CHUNK", 7)
    monkeypatch.setattr(body_buffer, "OVERLAP_MIN", 14)

    class Failing(io.BytesIO):
        def readinto(self, b):
            if self.tell() >= 21:
                raise OSError("disk gone")
            return super().readinto(b)

    seen = []
    with pytest.raises(OSError, match="disk gone"):
        body_buffer.read_body(Failing(bytes(100)), 100, on_chunk=lambda v: seen.append(len(v)))
    assert seen == [7, 7, 7]  # what was read before the error was handed over


def test_an_error_while_handing_over_stops_the_reader(monkeypatch):
    monkeypatch.setattr(body_buffer, "CHUNK", 7)
    monkeypatch.setattr(body_buffer, "OVERLAP_MIN", 14)

    class Slow(_Recording):  # a disk: each read waits, and lets the other thread run
        def readinto(self, b):
            import time

            time.sleep(0.001)
            return super().readinto(b)

    f = Slow(bytes(7000))

    def on_chunk(v):
        raise KeyError("stop")

    with pytest.raises(KeyError):
        body_buffer.read_body(f, 7000, on_chunk=on_chunk)
    assert len(f.threads) < 100  # not the file's 1,000 chunks
