"""llama.cpp's per-sequence state bytes, read once into a typed description and written back.

The layout is llama.cpp's private format: it changes between llama.cpp versions, mostly without
a new version number in the bytes themselves. So this reader states the one version it was
written for (``READS``, from the vendored source of llama-cpp-python 0.3.36), and a state tagged
with any other version is refused in one line before a byte of it is interpreted. This is the
only module that unpacks the layout; seq_payload.py, hybrid_payload.py, llama_state_file.py and
prefix_state.py work on ``SeqState``.

``llama_state_seq_get_data`` of one sequence (little endian; llama-context.cpp, llama-kv-cache.cpp
state_write, llama-memory-recurrent.cpp state_write)::

    u32 magic 0xAF143CD8, i32 source seq id
    per KV cache (two on a sliding-window model: full, then window):
      u32 n_stream; per stream: u32 cell_count, and when it is not 0:
        cell_count x (i32 pos, u32 n_seq_id (1), [12 bytes: M-RoPE's x, y, token], i32 seq_id)
        u32 v_trans, u32 n_layer
        n_layer x (i32 k_type, u64 k_row_bytes, cell_count * k_row_bytes)
        n_layer x (i32 v_type, u64 v_row_bytes, cell_count * v_row_bytes)     if not v_trans
        n_layer x (i32 v_type, u32 v_el_bytes, u32 n_embd_v, n_embd_v * cell_count * v_el_bytes)
    a hybrid's or recurrent model's recurrent record, last (one per sequence, not per token):
      u32 cell_count (0 or 1), cell_count x (i32 pos, u32 n_seq_id (0)), u32 s_trans (0),
      u32 n_layer, then the R and S rows of its recurrent layers (llama.cpp checks those)

``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` writes the header and the recurrent record only.
llama.cpp's own file (``llama_state_seq_save_file``) is u32 'ggsq', u32 LLAMA_STATE_SEQ_VERSION,
u32 token count, the token ids, then the above without its first 8 bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import numpy as np

from ..errors import StateFileError

IO_MAGIC = 0xAF143CD8
FILE_MAGIC = 0x67677371  # 'ggsq'
MAX_LAYERS = 4096
MAX_ROW_BYTES = 1 << 24  # one token's K or V row in one layer; real models use a few KiB
CELL_BYTES = (12, 24)  # one cell's record; models with multi-axis RoPE add x, y and a token


@dataclass(frozen=True)
class StateFormat:
    """The llama.cpp state format a reader knows: what llama.h calls LLAMA_STATE_SEQ_VERSION
    (the number states carry) and LLAMA_SESSION_VERSION (bumped on other layout changes)."""
    seq_state_version: int
    session_version: int
    written_for: str


READS = StateFormat(3, 10, "llama-cpp-python 0.3.36, llama.cpp b11312")


def running_format() -> StateFormat:
    """The format of the llama.cpp the engine runs (the bindings' constants, as native.py's)."""
    import llama_cpp

    return StateFormat(int(llama_cpp.LLAMA_STATE_SEQ_VERSION),
                       int(llama_cpp.LLAMA_SESSION_VERSION), f"llama-cpp-python {llama_cpp.__version__}")


def library_problem() -> str:
    """'' when the running llama.cpp writes the format this reader knows; else the one line
    (its states are then neither checked nor rewritten: nothing reads bytes it cannot)."""
    f = running_format()
    if (f.seq_state_version, f.session_version) == (READS.seq_state_version, READS.session_version):
        return ""
    return (f"KV Primer runs {f.written_for} (llama.cpp seq-state version {f.seq_state_version}, "
            f"session version {f.session_version}), and its state reader was written for "
            f"{READS.written_for} (versions {READS.seq_state_version} and "
            f"{READS.session_version}); install that llama-cpp-python to save and load states")


def check_version(version: int) -> None:
    """Refuse, in one line, a state of another format version than the one this reads."""
    if version != READS.seq_state_version:
        raise StateFileError(
            f"this state is in llama.cpp's seq-state version {version}, and this KV Primer reads "
            f"version {READS.seq_state_version} ({READS.written_for}); save it with a llama.cpp of "
            "that version (llama-server or KV Primer), or prime the prefix again")


class LayoutError(ValueError):
    """Bytes that are not a state of the known format; says which part (for a one-line error)."""


# ---- the description ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """One layer's K or V data as stored: one row per cell, or for transposed V one row per
    embedding component holding one element per cell."""
    type_id: int
    data: np.ndarray  # uint8 (cells, row bytes), or transposed (n_embd, cells) of element words
    transposed: bool = False

    @property
    def cell_bytes(self) -> int:
        """Bytes one cell takes in this layer."""
        return self.data.shape[1] if not self.transposed else self.data.shape[0] * self.data.itemsize

    def _taken(self, order: np.ndarray) -> "Rows":
        return replace(self, data=np.take(self.data, order, axis=1 if self.transposed else 0))


@dataclass(frozen=True)
class Stream:
    """One KV stream's cells of the sequence: their records (columns: position, sequence-id
    count, M-RoPE's x, y, token when the model has them, sequence id) and rows per layer."""
    cells: np.ndarray  # (n, 3 or 6) int32
    v_trans: bool = False
    k: tuple[Rows, ...] = ()
    v: tuple[Rows, ...] = ()

    @property
    def n_cells(self) -> int:
        return len(self.cells)

    @property
    def positions(self) -> np.ndarray:
        return self.cells[:, 0]

    @property
    def seq_id_counts(self) -> np.ndarray:
        return self.cells[:, 1]

    def reordered(self, order: np.ndarray) -> "Stream":
        """The cells in ``order`` (indices), each with its K and V rows."""
        return replace(self, cells=self.cells[order], k=tuple(r._taken(order) for r in self.k),
                       v=tuple(r._taken(order) for r in self.v))

    def in_position_order(self) -> "Stream":
        order = np.argsort(self.positions, kind="stable")
        return self if np.array_equal(order, np.arange(self.n_cells)) else self.reordered(order)


@dataclass(frozen=True)
class KvBlock:
    """One KV cache's part of the state (a sliding-window model has two)."""
    streams: tuple[Stream, ...]


@dataclass(frozen=True)
class RecurrentRecord:
    """A sequence's recurrent state (none yet: ``position`` None); its rows stay opaque bytes:
    which layers have them and their sizes are the model's, and llama.cpp checks them itself."""
    position: int | None
    n_layer: int
    rows: memoryview

    @property
    def nbytes(self) -> int:
        """Its size in a state: cell count, the cell, layout and layer count, the rows."""
        return 4 + (8 if self.position is not None else 0) + 8 + len(self.rows)


@dataclass(frozen=True)
class SeqState:
    version: int
    source_seq: int
    kv: tuple[KvBlock, ...]  # none on a recurrent model
    recurrent: RecurrentRecord | None  # hybrid and recurrent models

    @property
    def family(self) -> str:
        if self.recurrent is None:
            return "attention"
        return "hybrid" if self.kv else "recurrent"

    @property
    def first_stream(self) -> Stream | None:
        """The one stream that holds cells in the first KV cache; None: no cells or no cache."""
        streams = [s for s in self.kv[0].streams if s.n_cells] if self.kv else []
        return streams[0] if streams else None

    def in_position_order(self) -> "SeqState":
        """The state with the first cache's cells sorted by position (itself when they are).
        A sliding-window model's state is left alone: its window cache is a ring."""
        if len(self.kv) != 1 or len(self.kv[0].streams) != 1:
            return self
        s = self.kv[0].streams[0]
        ordered = s.in_position_order()
        return self if ordered is s else replace(self, kv=(KvBlock((ordered,)),))

    def with_recurrent(self, record: RecurrentRecord | None) -> "SeqState":
        return replace(self, recurrent=record)

    def to_bytes(self) -> bytes:
        out: list = [struct.pack("<Ii", IO_MAGIC, self.source_seq)]
        for block in self.kv:
            out.append(struct.pack("<I", len(block.streams)))
            for s in block.streams:
                _write_stream(out, s)
        if self.recurrent is not None:
            rec = self.recurrent
            cells = struct.pack("<iI", rec.position, 0) if rec.position is not None else b""
            out += [struct.pack("<I", 1 if cells else 0), cells, struct.pack("<II", 0, rec.n_layer),
                    rec.rows]
        return _joined(out)


def _joined(pieces: list) -> bytes:
    """``b"".join(pieces)`` into memory advised to huge pages: most of joining a state of
    hundreds of MB is the new memory's page faults (a 269 MB state: 160 ms joined, 99 here)."""
    from .body_buffer import new_body  # not at the top: it loads llama.cpp, reading needs not

    views = [memoryview(x).cast("B") for x in pieces]
    data, view = new_body(sum(len(v) for v in views))
    at = 0
    for v in views:
        view[at:at + len(v)] = v
        at += len(v)
    view.release()
    return data


def _write_stream(out: list, s: Stream) -> None:
    out.append(struct.pack("<I", s.n_cells))
    if not s.n_cells:
        return
    out += [np.ascontiguousarray(s.cells, dtype="<i4"), struct.pack("<II", int(s.v_trans), len(s.k))]
    for r in s.k:
        out += [struct.pack("<iQ", r.type_id, r.cell_bytes), np.ascontiguousarray(r.data)]
    for r in s.v:
        head = (struct.pack("<iII", r.type_id, r.data.itemsize, r.data.shape[0]) if r.transposed
                else struct.pack("<iQ", r.type_id, r.cell_bytes))
        out += [head, np.ascontiguousarray(r.data)]


# ---- the reader --------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data).cast("B")
        self.off = 0

    def left(self) -> int:
        return len(self.data) - self.off

    def take(self, n: int, what: str) -> int:
        """Skip n bytes; returns where they start."""
        if n < 0 or n > self.left():
            raise LayoutError(f"{what} runs past the end")
        at = self.off
        self.off += n
        return at

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.data, self.take(4, what))[0]

    def i32(self, what: str) -> int:
        return struct.unpack_from("<i", self.data, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.data, self.take(8, what))[0]

    def words(self, n: int) -> tuple[int, ...]:
        """The next n u32 words without moving (as many as there are)."""
        n = min(n, self.left() // 4)
        return struct.unpack_from(f"<{n}I", self.data, self.off)

    def array(self, n: int, dtype, what: str) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self.data, dtype=dt, count=n, offset=self.take(n * dt.itemsize, what))


def parse(data: bytes, version: int, family: str | None = None) -> SeqState:
    """Describe ``data``, a state of seq-state ``version``; ``family`` ("attention", "hybrid",
    "recurrent") settles what the bytes alone leave open, None reads it from them.

    Raises StateFileError (the one line) for another version, LayoutError for bytes that are
    not this format. Reads are bounded: nothing is allocated from a declared length.
    """
    check_version(version)
    r = _Reader(data)
    if len(r.data) < 8 or r.u32("magic") != IO_MAGIC:
        raise LayoutError("wrong magic")
    source = r.i32("source sequence")
    kv: list[KvBlock] = []
    recurrent = None
    while r.left():
        if family == "recurrent" or (family is None and _recurrent_at(r)) or \
                (family == "hybrid" and len(kv) == 1):
            recurrent = _recurrent(r)
            break
        if len(kv) == (1 if family == "hybrid" else 2):
            raise LayoutError("more cache blocks than a model has")
        kv.append(_kv_block(r))
    if not kv and recurrent is None:
        raise LayoutError("no KV cells")
    if family not in (None, "attention") and recurrent is None:
        raise LayoutError("no recurrent state")
    return SeqState(version, source, tuple(kv), recurrent)


def _recurrent_at(r: _Reader) -> bool:
    """Does a recurrent record start here? One cell with no sequence ids and s_trans 0 (which a
    KV stream never looks like: its cells have one sequence id), or none and s_trans 0."""
    w = r.words(5)
    if len(w) >= 5 and w[0] == 1:
        return w[2] == 0 and w[3] == 0 and 0 < w[4] <= MAX_LAYERS
    return len(w) >= 3 and w[0] == 0 and w[1] == 0 and 0 < w[2] <= MAX_LAYERS


def _recurrent(r: _Reader) -> RecurrentRecord:
    count = r.u32("recurrent cell count")
    if count > 1:
        raise LayoutError("a recurrent state of several sequences")
    pos = None
    if count:
        pos = r.i32("recurrent position")
        if r.u32("recurrent sequence ids") != 0:
            raise LayoutError("a recurrent cell of several sequences")
    s_trans, n_layer = r.u32("recurrent layout"), r.u32("recurrent layer count")
    if s_trans != 0 or not 0 < n_layer <= MAX_LAYERS or (count and not r.left()):
        raise LayoutError("bad recurrent layout, layer count or no recurrent rows")
    return RecurrentRecord(pos, n_layer, r.data[r.take(r.left(), "recurrent rows"):])


def _kv_block(r: _Reader) -> KvBlock:
    n_stream = r.u32("stream count")
    if not 0 < n_stream <= 64:
        raise LayoutError("a KV stream count no cache has")
    return KvBlock(tuple(_stream(r) for _ in range(n_stream)))


def _stream(r: _Reader) -> Stream:
    n = r.u32("cell count")
    if n == 0:  # an empty stream writes its count only
        return Stream(np.zeros((0, 3), dtype="<i4"))
    cells = _cells(r, n)
    v_trans, n_layer = r.u32("V layout"), r.u32("layer count")
    if v_trans > 1 or not 0 < n_layer <= MAX_LAYERS:
        raise LayoutError("bad V layout or layer count")
    k = []
    for _ in range(n_layer):
        t, row = r.i32("K type"), r.u64("K row size")
        if not 0 < row <= MAX_ROW_BYTES:
            raise LayoutError("a K row size no model has")
        k.append(Rows(t, r.array(n * row, np.uint8, "K data").reshape(n, row)))
    v = []
    for _ in range(n_layer):
        t = r.i32("V type")
        if v_trans:
            el, n_embd = r.u32("V element size"), r.u32("V width")
            if el not in (1, 2, 4, 8) or not 0 < n_embd <= MAX_ROW_BYTES:
                raise LayoutError("bad V element size or width")
            v.append(Rows(t, r.array(n * n_embd, f"<u{el}", "V data").reshape(n_embd, n), True))
        else:
            row = r.u64("V row size")
            if not 0 < row <= MAX_ROW_BYTES:
                raise LayoutError("a V row size no model has")
            v.append(Rows(t, r.array(n * row, np.uint8, "V data").reshape(n, row)))
    return Stream(cells, bool(v_trans), tuple(k), tuple(v))


def _cells(r: _Reader, n: int) -> np.ndarray:
    """``n`` cell records of one sequence id each: their size is the one after which the stream
    goes on as a stream does (a V layout flag and a layer count); 12 bytes is tried first."""
    for size in CELL_BYTES:
        end = r.off + size * n
        if end + 8 > len(r.data):
            continue
        v_trans, n_layer = struct.unpack_from("<II", r.data, end)
        if v_trans > 1 or not 0 < n_layer <= MAX_LAYERS:
            continue
        cells = np.frombuffer(r.data, dtype="<i4", count=size // 4 * n, offset=r.off)
        cells = cells.reshape(n, size // 4)
        if np.all(cells[:, 1] == 1):
            r.take(size * n, "cells")
            return cells
    raise LayoutError("cells of a layout this version does not know")


# ---- llama.cpp's own file: its head ------------------------------------------------------

FILE_HEAD_BYTES = 12


@dataclass(frozen=True)
class FileHead:
    version: int
    n_tokens: int


def is_file_head(head: bytes) -> bool:
    """True when bytes start with llama.cpp's sequence-state file magic ('ggsq')."""
    return len(head) >= 4 and struct.unpack_from("<I", head)[0] == FILE_MAGIC


def read_file_head(head: bytes) -> FileHead | None:
    """The version and token count of a 'ggsq' file's first 12 bytes; None when they are not."""
    if len(head) < FILE_HEAD_BYTES or not is_file_head(head):
        return None
    _magic, version, n_tokens = struct.unpack_from("<III", head)
    return FileHead(version, n_tokens)


def file_head(version: int, n_tokens: int) -> bytes:
    return struct.pack("<III", FILE_MAGIC, version, n_tokens)


def buffer_head(source_seq: int = 0) -> bytes:
    """What the in-memory form has before the file's KV data: the magic and source sequence."""
    return struct.pack("<Ii", IO_MAGIC, source_seq)


def has_buffer_head(data) -> bool:
    return len(data) >= 8 and struct.unpack_from("<I", data)[0] == IO_MAGIC
