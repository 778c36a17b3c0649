"""A new bytes object for a state file's KV body, filled by a reader through its view, in
memory the kernel may back with 2 MiB pages.

A state's body is read straight into the bytes the state keeps (no second copy), but fresh
memory costs a page fault on each 4 KiB page at its first write: reading a 47 MB state that was
in the page cache into new memory took about 50 ms on a 2-core Xeon, into memory already
touched about 9 ms. Asking for transparent huge pages for the buffer's whole 2 MiB pages
(``madvise(MADV_HUGEPAGE)``, Linux) before the first write makes those faults 512 times fewer:
the same read then took 7-13 ms. Where the kernel has them off, or the call is missing, the
buffer is an ordinary one: nothing depends on the advice being taken.
"""
from __future__ import annotations

import ctypes
import mmap
import queue
import sys
import threading
from collections.abc import Callable

from ..llama.native import new_bytes

HUGE_PAGE = 2 << 20
CHUNK = 4 << 20  # read at a time: a chunk is still in the CPU's cache for ``on_chunk``
# below this a second thread costs more than the overlap it buys
OVERLAP_MIN = 2 * CHUNK
# below this a buffer holds no whole huge page worth asking for
MIN_ADVISED = 2 * HUGE_PAGE
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def libc_fn(name: str, *argtypes):
    """The C library's function ``name`` returning an int, with ``argtypes``; None where there
    is no such function (not a Unix C library)."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no CDLL(None)
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = (libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            if _MADV_HUGEPAGE is not None and sys.platform.startswith("linux") else None)


def huge_page_span(addr: int, n: int) -> tuple[int, int]:
    """The whole 2 MiB pages inside ``n`` bytes at ``addr``: (start, length), length 0 when
    there are none."""
    start = -(-addr // HUGE_PAGE) * HUGE_PAGE
    end = (addr + n) // HUGE_PAGE * HUGE_PAGE
    return start, max(end - start, 0)


def new_body(n: int) -> tuple[bytes, memoryview]:
    """``new_bytes(n)`` (a bytes object not yet filled, and a writable view of it for the
    reader, to release before anyone else sees the object), advised to huge pages first."""
    data, view = new_bytes(n)
    if _MADVISE is not None and n >= MIN_ADVISED:
        addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        start, length = huge_page_span(addr, n)
        if length:
            _MADVISE(start, length, _MADV_HUGEPAGE)  # advice: a refusal changes nothing
    return data, view


def read_body(f, n: int, head: bytes = b"",
              on_chunk: Callable[[memoryview], None] | None = None) -> tuple[bytes, int]:
    """``head`` then the next ``n`` bytes of ``f``, read straight into one new bytes object
    (``new_body``) CHUNK at a time, each chunk handed to ``on_chunk`` in order as it arrives;
    and how many of the ``n`` bytes the file had (fewer: it ended early, the rest is not
    filled). With ``on_chunk`` and at least OVERLAP_MIN bytes, a thread reads ahead while this
    one hands chunks over (``_read_overlapped``)."""
    data, view = new_body(len(head) + n)
    at = len(head)
    with view:
        view[:at] = head
        if on_chunk is not None and n >= OVERLAP_MIN:
            end = _read_overlapped(f, view, at, on_chunk)
        else:
            end = _read_serial(f, view, at, on_chunk)
    return data, end - len(head)


def _read_serial(f, view: memoryview, at: int, on_chunk) -> int:
    end = len(view)
    while at < end:
        k = f.readinto(view[at:min(at + CHUNK, end)])
        if not k:
            break
        if on_chunk is not None:
            on_chunk(view[at:at + k])
        at += k
    return at


def _read_overlapped(f, view: memoryview, at: int, on_chunk) -> int:
    """The serial loop split over two threads: a reader fills chunk after chunk while this
    thread hands the ones already read to ``on_chunk``. A read and a checksum both release
    the GIL, so with a core free the checksum hides behind the disk (a 189 MB state's
    XXH3 pass is tens of ms). Returns where the data read ends; the reader's error, if any, is
    raised here; an error in ``on_chunk`` stops the reader before the next chunk."""
    end = len(view)
    ready: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def reader():
        pos = at
        try:
            while pos < end and not stop.is_set():
                k = f.readinto(view[pos:min(pos + CHUNK, end)])
                if not k:
                    break
                ready.put((pos, k))
                pos += k
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            ready.put(e)
        ready.put(None)

    t = threading.Thread(target=reader, name="state-body-read", daemon=True)
    t.start()
    got = at
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            pos, k = item
            on_chunk(view[pos:pos + k])
            got = pos + k
    finally:
        stop.set()
        t.join()
    return got
