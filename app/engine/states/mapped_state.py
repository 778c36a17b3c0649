"""A .kvstate read through a mapping of its pages, so llama.cpp copies its KV bytes straight from
the page cache into a context's cells.

Read into memory first, a state's bytes cross memory twice before a run can start: the read
into new memory (whose pages the kernel must first fault in and zero), then llama.cpp's copy
into the cells. Through a mapping, the page cache's own pages are the source of llama.cpp's
copy; a thread beside it copies the same pages into the state's own bytes (which the radix
cache keeps) and checksums them. On a 2-core Xeon a 189 MB state took 100 ms that way against
116 ms read then restored (medians of 11 interleaved pairs: bench/results-state-placed.json).
Not the half one copy fewer suggests: the state's own copy still crosses memory (new pages
zeroed, then written), and both ways are bound by memory traffic on such a machine.

A mapped page that cannot be read is SIGBUS, which no code can catch, where ``read`` returns
an error; so the mapping is kept narrow. Only a file on a local file system (``fstatfs``),
wholly in the page cache when it is opened (``mincore``: a page evicted during the copy is read
again from a disk that just gave it), and held under a read lease (``F_SETLEASE``): a program
that opens the file to write or truncate it waits until the lease is given back, the copy's
fraction of a second (the kernel gives up waiting after ``lease-break-time``, 45 s). The lease
break's signal is SIGURG, ignored by default (SIGIO, the default, would end the process).
Anywhere this cannot be had (another OS, a network or FUSE file system, a file someone is
writing, a file not wholly cached) ``mapped_state_file`` gives None and the caller reads the
file as usual; the result is the same state either way.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import StateFileError
from ..user_files import open_user_file
from .body_buffer import CHUNK, libc_fn, new_body
from .prefix_state import MAGIC, FileHead, PrefixState, read_head

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no leases, the file is read
    fcntl = None


_MINCORE = libc_fn("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_FSTATFS = libc_fn("fstatfs", ctypes.c_int, ctypes.c_void_p)
# file systems whose pages only this machine's kernel can take away (statfs f_type): ext2-4,
# xfs, btrfs, tmpfs, f2fs, zfs, overlayfs. Not NFS, SMB or FUSE (virtiofs): a truncate on
# another machine passes no local lease
_LOCAL_FS = {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010, 0x2FC12FC1, 0x794C7630}
_LEASES = (fcntl is not None and hasattr(fcntl, "F_SETLEASE") and hasattr(fcntl, "F_SETSIG")
           and hasattr(signal, "SIGURG"))


class MappedStateFile:
    """An open .kvstate under a read lease, mapped whole; its KV data is ``body``."""

    def __init__(self, head: FileHead, tok_bytes: bytes, mapping: mmap.mmap):
        self.head, self.tok_bytes, self._mapping = head, tok_bytes, mapping
        start = head.body_offset
        self.body = memoryview(mapping)[start:start + head.meta["data_bytes"]]

    def view_state(self) -> PrefixState:
        """The state with ``body`` as its data, for checks and llama.cpp's copy only: it must
        not outlive this file (``copy_checked`` gives the one to keep)."""
        return PrefixState.from_file_parts(self.head, self.tok_bytes, self.body)

    def copy_checked(self, view: PrefixState, place: Callable[[], bool],
                     undo: Callable[[], None]) -> PrefixState | None:
        """Call ``place()`` (llama.cpp copying ``view``'s data out of the mapping; False: it
        would not) while a thread copies the data into new bytes and checksums the file; then
        ``view`` with those bytes, or None when ``place()`` gave False. A checksum mismatch (the
        file was corrupt: its cells are already placed) calls ``undo()`` and raises
        StateFileError; an error in ``place`` is raised after the thread ends."""
        h = self.head.hasher()
        h.update(self.tok_bytes)
        copy = _Copy(self.body, h)
        thread = threading.Thread(target=copy.run, name="state-body-copy", daemon=True)
        thread.start()
        try:
            placed = place()
        finally:
            thread.join()
        if not placed:
            return None
        try:
            if copy.error is not None:  # MemoryError, as the read path would raise it
                raise copy.error
            self.head.check_digest(h)
        except BaseException:
            undo()  # the cells placed are not a state this engine holds
            raise
        return replace(view, data=copy.data)

    def close(self) -> None:
        try:
            self.body.release()
            self._mapping.close()
        except BufferError:
            # a view of it is still alive (a traceback's frame): the mapping closes with that
            # view; nothing reads through it after this, so the lease need not wait for it
            pass


class _Copy:
    """The copy thread's work: ``src`` copied into new bytes (body_buffer.new_body) a chunk at
    a time, each chunk hashed into ``h`` while it is still in the CPU's cache; its error is
    kept for the caller's thread to raise (not printed by the thread)."""

    def __init__(self, src: memoryview, h):
        self.src, self.h = src, h
        self.data: bytes = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            data, view = new_body(len(self.src))
            with view:
                for at in range(0, len(self.src), CHUNK):
                    chunk = view[at:at + CHUNK]
                    chunk[:] = self.src[at:at + CHUNK]
                    self.h.update(chunk)
            self.data = data
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            self.error = e


@contextmanager
def mapped_state_file(path: str | os.PathLike) -> Iterator[MappedStateFile | None]:
    """The .kvstate at ``path`` mapped under a read lease, or None where that cannot be had
    (module docstring) or the file is not one whose header and sizes are sound (the read path
    then says what is wrong). The lease is given back and the mapping closed on leaving."""
    if not _LEASES or _MINCORE is None or _FSTATFS is None:
        yield None
        return
    path = Path(path)
    with open_user_file(path, StateFileError, "state file") as f:
        fd = f.fileno()
        if not _local_fs(fd) or not _take_lease(fd):
            yield None
            return
        mapped = None
        try:
            mapped = _map(f, path.name)
            yield mapped
        finally:
            if mapped is not None:
                mapped.close()
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:  # broken already: closing the file gives it back anyway
                pass


def prefetch(path: str | os.PathLike) -> None:
    """Start reading the file at ``path`` into the page cache in a thread of its own and return
    at once: `run --state` asks before it opens the model, so a state on disk arrives while the
    engine starts, and is then placed from the cache (above). Read, not advised: Linux caps
    ``POSIX_FADV_WILLNEED`` at the readahead window (8 MB of a 269 MB state, measured). A file
    that cannot be read is left to the load, which says why."""

    def read() -> None:
        buf = bytearray(CHUNK)
        try:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        except OSError:
            pass

    threading.Thread(target=read, name="kvstate-prefetch", daemon=True).start()


def _local_fs(fd: int) -> bool:
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type first, 120 bytes on Linux
    if _FSTATFS(fd, buf) != 0:
        return False
    return (ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF) in _LOCAL_FS


def _take_lease(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:  # someone has it open to write, not the owner, no leases on this FS
        return False
    return True


def _map(f, name: str) -> MappedStateFile | None:
    size = os.fstat(f.fileno()).st_size
    if f.read(len(MAGIC)) != MAGIC:  # a llama.cpp file, or not a state: read as usual
        return None
    f.seek(0)
    head = read_head(f, size, name)
    if not head.sizes_ok or head.meta["data_bytes"] == 0:
        return None
    tok_bytes = f.read(head.token_bytes)
    try:
        mapping = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    if not _all_cached(mapping, size):
        mapping.close()
        return None
    return MappedStateFile(head, tok_bytes, mapping)


def _all_cached(mapping: mmap.mmap, size: int) -> bool:
    """Is every page of the mapping in the page cache?"""
    page = mmap.PAGESIZE
    vec = np.zeros(-(-size // page), np.uint8)
    addr = np.frombuffer(mapping, np.uint8)
    try:
        if _MINCORE(addr.ctypes.data, size, vec.ctypes.data) != 0:
            return False
    finally:
        del addr
    return bool(np.all(vec & 1))
