"""Checks on llama.cpp's per-sequence state bytes before they reach ``llama_state_seq_set_data``.

llama.cpp checks the layer count, KV types and row sizes of a sequence state itself and refuses
a mismatch cleanly. It does not check the cell positions: a state with a negative or huge
position (or positions not 0..n-1) is accepted, and its cells then stay in the cache for good
(``seq_rm`` only removes positions 0..INT_MAX-1), so the tokens we think are resident no longer
match what llama.cpp holds. It also clears the target sequence before it finds a mismatch.
So we walk the whole layout here (bounded reads only, no allocation from declared lengths) and
refuse anything but cells at positions 0..n-1 (each once, in any order) of one sequence, with
sizes adding up exactly.

Layout of this llama.cpp build (unified KV cache; an iSWA model writes a second cache block)::

    u32 magic 0xAF143CD8, u32 source seq id
    per cache block: u32 n_stream (1), u32 cell_count,
        cell_count x (i32 pos, u32 n_seq_id (1), [12 bytes: M-RoPE's x, y, token], i32 seq_id),
        u32 v_trans, u32 n_layer,
        n_layer x (i32 k_type, u64 k_row_bytes, cell_count * k_row_bytes),
        n_layer x (i32 v_type, u64 v_row_bytes, data)                      if not v_trans
        n_layer x (i32 v_type, u32 v_el_bytes, u32 n_embd_v, data)         if v_trans

A hybrid model (attention and recurrent layers) writes its attention block, then its recurrent
block; a recurrent model writes the recurrent block only. A recurrent block is one record per
sequence, not one cell per token::

    u32 cell_count (1), i32 pos (the sequence's last position), u32 n_seq_id (0),
    u32 s_trans, u32 n_layer, then the recurrent layers' R and S rows

``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` writes the header and the recurrent block only.
"""
from __future__ import annotations

import struct

import numpy as np

from ..errors import StateFileError

IO_MAGIC = 0xAF143CD8
MAX_LAYERS = 4096
MAX_ROW_BYTES = 1 << 24  # one token's K or V row in one layer; real models use a few KiB

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.off = 0

    def take(self, n: int, what: str) -> int:
        """Skip n bytes; returns where they start."""
        if n < 0 or n > len(self.data) - self.off:
            raise _Bad(f"{what} runs past the end")
        at = self.off
        self.off += n
        return at

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.data, self.take(4, what))[0]

    def i32(self, what: str) -> int:
        return _I32.unpack_from(self.data, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.data, self.take(8, what))[0]


class _Bad(Exception):
    pass


CELL_BYTES = (12, 24)  # one cell's record; models with multi-axis RoPE add x, y and a token


def _cells(r: _Reader, n: int) -> np.ndarray:
    """Read ``n`` cell records (one sequence id each) as an (n, words) int32 array: column 0
    the position, 1 the sequence-id count. Their size is the one after which the block goes on
    as a block does (a V layout flag and a layer count); 12 bytes is tried first."""
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
    raise _Bad("cells of a layout this version does not know")


FAMILIES = ("attention", "hybrid", "recurrent")  # what a model's layers keep per sequence
_FAMILY_WORDS = {"attention": "a model with attention layers only",
                 "hybrid": "a hybrid model (attention and recurrent layers)",
                 "recurrent": "a recurrent model"}


def check_seq_payload(data: bytes, n_tokens: int, type_ids: tuple[int, int] | None = None,
                      family: str = "attention", recurrent_bytes: int = 0) -> None:
    """Raise StateFileError unless ``data`` is a well-formed state of exactly ``n_tokens`` cells
    (and, for a hybrid or recurrent ``family``, one recurrent record at position n_tokens - 1,
    of ``recurrent_bytes`` when known: a record's size is fixed per model).

    ``type_ids``: the ggml type ids of K and V the state claims (its metadata); every layer's
    rows must be of those types.
    """
    found = payload_family(data, n_tokens)
    if found is not None and found != family:
        raise StateFileError(f"this state was saved from {_FAMILY_WORDS[found]}, and the loaded "
                             f"model is {_FAMILY_WORDS[family]}; load the model it was saved "
                             "with or prime the prefix again")
    try:
        _walk(data, n_tokens, type_ids, family, recurrent_bytes)
    except _Bad as e:
        raise StateFileError(f"this state's KV data is malformed ({e}); it was rejected before "
                             "reaching llama.cpp; prime the prefix again") from None


def payload_family(data: bytes, n_tokens: int) -> str | None:
    """Which family of model wrote a state of ``n_tokens`` tokens, by its layout; None when it
    is not a layout we know."""
    r = _Reader(data)
    try:
        if r.u32("magic") != IO_MAGIC:
            return None
        r.u32("source sequence")
        at = r.off
        if _looks_recurrent(r, n_tokens):
            return "recurrent"
        r.off = at
        _block(r, n_tokens, None, first=True)
        if r.off == len(data):
            return "attention"
        if _looks_recurrent(r, n_tokens):
            return "hybrid"
        return "attention"  # a sliding-window model's second attention block
    except _Bad:
        return None


def _looks_recurrent(r: _Reader, n_tokens: int) -> bool:
    """Does a recurrent record start here: one cell at the last position, no sequence ids?"""
    if len(r.data) - r.off < 20:
        return False
    at = r.off
    head = (r.u32("cell count"), r.i32("position"), r.u32("sequence ids"))
    r.off = at
    return head == (1, n_tokens - 1, 0)


def _walk(data: bytes, n_tokens: int, type_ids, family: str = "attention",
          recurrent_bytes: int = 0) -> None:
    r = _Reader(data)
    if r.u32("magic") != IO_MAGIC:
        raise _Bad("wrong magic")
    r.u32("source sequence")
    if family != "attention":
        if family == "hybrid":
            _block(r, n_tokens, type_ids, first=True)
        if recurrent_bytes and len(data) - r.off != recurrent_bytes:
            raise _Bad(f"a recurrent state of {len(data) - r.off:,} bytes where this model's has "
                       f"{recurrent_bytes:,}")
        _recurrent_block(r, n_tokens)
        return
    block = 0
    while r.off < len(data):
        _block(r, n_tokens, type_ids, first=block == 0)
        block += 1
        if block > 2:
            raise _Bad("more cache blocks than a model has")
    if block == 0:
        raise _Bad("no KV cells")


def _recurrent_block(r: _Reader, n_tokens: int) -> None:
    """One recurrent record at position n_tokens - 1; its rows are llama.cpp's to check (it
    refuses other layer counts, types and row sizes before changing anything)."""
    if not _looks_recurrent(r, n_tokens):
        raise _Bad(f"no recurrent state at position {n_tokens - 1}")
    r.take(12, "recurrent cell")
    s_trans, n_layer = r.u32("recurrent layout"), r.u32("recurrent layer count")
    if s_trans > 1 or not 0 < n_layer <= MAX_LAYERS or r.off >= len(r.data):
        raise _Bad("bad recurrent layout, layer count or no recurrent rows")


def _block(r: _Reader, n_tokens: int, type_ids, first: bool) -> None:
    if r.u32("stream count") != 1:
        raise _Bad("not one KV stream")
    n = r.u32("cell count")
    if first and n != n_tokens:
        raise _Bad(f"{n} KV cells for {n_tokens} tokens")
    if n > n_tokens:
        raise _Bad(f"{n} KV cells in a second cache for {n_tokens} tokens")
    if n == 0:  # an empty sliding-window cache writes its count only
        return
    cells = _cells(r, n)
    pos = cells[:, 0]
    if np.any(cells[:, 1] != 1):
        raise _Bad("a cell belongs to several sequences")
    # cells come in cache order, which after trims and forks need not be position order
    spos = np.sort(pos)
    if first:
        if not np.array_equal(spos, np.arange(n, dtype=pos.dtype)):
            raise _Bad("cell positions are not 0 to n-1, once each")
    elif spos[0] < 0 or spos[-1] >= n_tokens or np.any(np.diff(spos) <= 0):
        raise _Bad("sliding-window cell positions out of range or repeated")
    v_trans = r.u32("V layout")
    n_layer = r.u32("layer count")
    if v_trans > 1 or not 0 < n_layer <= MAX_LAYERS:
        raise _Bad("bad V layout or layer count")
    k_type = v_type = None
    if type_ids is not None:
        k_type, v_type = type_ids
    for _ in range(n_layer):
        t = r.i32("K type")
        row = r.u64("K row size")
        if (k_type is not None and t != k_type) or not 0 < row <= MAX_ROW_BYTES:
            raise _Bad("K rows of another type or size")
        r.take(n * row, "K data")
    for _ in range(n_layer):
        t = r.i32("V type")
        if v_type is not None and t != v_type:
            raise _Bad("V rows of another type")
        if v_trans:
            el, n_embd = r.u32("V element size"), r.u32("V width")
            if not 0 < el <= 8 or not 0 < n_embd <= MAX_ROW_BYTES:
                raise _Bad("bad V element size or width")
            r.take(n * el * n_embd, "V data")
        else:
            row = r.u64("V row size")
            if not 0 < row <= MAX_ROW_BYTES:
                raise _Bad("bad V row size")
            r.take(n * row, "V data")


def row_layout(data: bytes) -> list[list[tuple[int, int, int, int]]] | None:
    """Per cache block, per layer: (K type, K bytes per cell, V type, V bytes per cell); None
    when ``data`` is not a layout we know. For reading a state's KV types and row sizes."""
    try:
        r = _Reader(data)
        if r.u32("magic") != IO_MAGIC:
            return None
        r.u32("source sequence")
        blocks = []
        while r.off < len(data) and len(blocks) < 2:
            if blocks and _recurrent_follows(r):
                return blocks  # a hybrid's recurrent block: no K/V rows
            r.u32("stream count")
            n = r.u32("cell count")
            if n == 0:
                blocks.append([])
                continue
            _cells(r, n)
            v_trans, n_layer = r.u32("V layout"), r.u32("layer count")
            if not 0 < n_layer <= MAX_LAYERS:
                return None
            ks = []
            for _ in range(n_layer):
                t, row = r.i32("K type"), r.u64("K row size")
                ks.append((t, row))
                r.take(n * row, "K data")
            layers = []
            for kt, krow in ks:
                t = r.i32("V type")
                per_cell = r.u32("V element size") * r.u32("V width") if v_trans else r.u64("V row size")
                r.take(n * per_cell, "V data")
                layers.append((kt, krow, t, per_cell))
            blocks.append(layers)
        return blocks if r.off == len(data) and blocks else None
    except _Bad:
        return None


def _recurrent_follows(r: _Reader) -> bool:
    """Does a recurrent record start here (one cell, no sequence ids, s_trans 0), rather than
    a second attention block (one stream, cells whose first has one sequence id)?"""
    if len(r.data) - r.off < 16:
        return False
    head = struct.unpack_from("<IiII", r.data, r.off)
    return head[0] == 1 and head[2] == 0 and head[3] == 0


def v_transposed(data: bytes) -> bool | None:
    """Whether a state's V rows are stored transposed (llama.cpp does that without flash
    attention); None when the layout is not one we know or holds no cells."""
    try:
        r = _Reader(data)
        if r.u32("magic") != IO_MAGIC:
            return None
        r.u32("source sequence")
        if _recurrent_follows(r):
            return None  # a recurrent model's state has no V rows
        r.u32("stream count")
        n = r.u32("cell count")
        if n == 0:
            return None
        _cells(r, n)
        return bool(r.u32("V layout"))
    except _Bad:
        return None


def stream_count(data: bytes) -> int | None:
    """How many KV streams the writer's cache had (llama.cpp refuses a restore into another
    count: one stream is a unified cache or one slot); None when the header is not one we know."""
    try:
        r = _Reader(data)
        if r.u32("magic") != IO_MAGIC:
            return None
        r.u32("source sequence")
        return r.u32("stream count")
    except _Bad:
        return None


def in_position_order(data: bytes) -> bytes:
    """The same state with its cells sorted by position (``data`` itself when they already are).

    llama.cpp writes a sequence's cells in cache order. After trims, forks and other sequences
    coming and going, that is not position order, and a restore lays the cells out in the
    order written. Attention then sums over the same cells in another order, so a warm run
    differs from a cold one in the last bits (seen: max |Δlogit| 0.02 on the tiny model).
    Sorting here gives every restore the layout a cold run of the prefix has.
    """
    try:
        return _sorted_cells(data)
    except _Bad:  # not a layout we know: leave it for check_seq_payload to judge
        return data


def _sorted_cells(data: bytes) -> bytes:
    r = _Reader(data)
    if r.u32("magic") != IO_MAGIC:
        return data
    r.u32("source sequence")
    if _recurrent_follows(r):  # a recurrent model's state: no cells to sort
        return data
    if r.u32("stream count") != 1:
        return data
    n = r.u32("cell count")
    cells_at = r.off
    cells = _cells(r, n)
    order = np.argsort(cells[:, 0], kind="stable")
    if np.array_equal(order, np.arange(n)):
        return data
    src = np.frombuffer(data, dtype=np.uint8)
    out = src.copy()
    out[cells_at:r.off] = np.frombuffer(cells[order].tobytes(), dtype=np.uint8)
    v_trans, n_layer = r.u32("V layout"), r.u32("layer count")

    def gather(at: int, rows: int, cols: int, dt, axis: int) -> None:
        """Reorder one block in place in ``out``: rows (axis 0) or columns (axis 1) by order."""
        size = rows * cols * np.dtype(dt).itemsize
        a = src[at:at + size].view(dt).reshape(rows, cols)
        np.take(a, order, axis=axis, out=out[at:at + size].view(dt).reshape(rows, cols))

    for _ in range(n_layer):
        r.i32("K type")
        row = r.u64("K row size")
        gather(r.take(n * row, "K data"), n, row, np.uint8, 0)  # one row per cell
    for _ in range(n_layer):
        r.i32("V type")
        if v_trans:  # n_embd rows, each holding one element per cell
            el, n_embd = r.u32("V element size"), r.u32("V width")
            dt = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(el)
            if dt is None:
                return data
            gather(r.take(n * el * n_embd, "V data"), n_embd, n, dt, 1)
        else:
            row = r.u64("V row size")
            gather(r.take(n * row, "V data"), n, row, np.uint8, 0)
    if r.off != len(data) and not _recurrent_follows(r):
        return data  # a second (sliding-window) cache: leave such states as they are
    return out.tobytes()  # (a hybrid's recurrent block follows unchanged)

