"""A hybrid or recurrent model's sequence state taken apart: where its attention cells lie, and
the same state with its recurrent record emptied (seq_payload.py has the layout).

llama.cpp's position range of a hybrid sequence also counts its recurrent record (the later
start of its two memories), so the cells' own positions are read from the state. And a state of
some cells copied out of a sequence carries that sequence's recurrent record, which stands at
the sequence's end, not at the cells': the radix cache keeps the right one apart, so the copied
state gets an empty record instead (llama.cpp's own layout for a sequence without one).
"""
from __future__ import annotations

from .seq_payload import IO_MAGIC, MAX_LAYERS, _Bad, _cells, _Reader, _recurrent_follows


def attention_span(data: bytes) -> tuple[int, int] | None:
    """The lowest and highest position of a hybrid state's attention cells ((-1, -1): none);
    None when ``data`` does not start with an attention block we know. (llama.cpp's range of
    a hybrid sequence also counts its recurrent record, which sits at the last position.)"""
    try:
        r = _Reader(data)
        if r.u32("magic") != IO_MAGIC:
            return None
        r.u32("source sequence")
        if r.u32("stream count") != 1:
            return None
        n = r.u32("cell count")
        if n == 0:
            return (-1, -1)
        pos = _cells(r, n)[:, 0]
        return int(pos.min()), int(pos.max())
    except _Bad:
        return None


def without_recurrent(data: bytes, empty: bytes, family: str) -> bytes:
    """A hybrid or recurrent state with its recurrent record replaced by ``empty`` (llama.cpp's
    partial state of a sequence without one: the record's layout, no rows), so that it carries
    attention cells only; ``data`` itself when its layout is not one we know."""
    end = 8
    if family == "hybrid":
        try:
            r = _Reader(data)
            if r.u32("magic") != IO_MAGIC:
                return data
            r.u32("source sequence")
            if _recurrent_follows(r):  # no attention block at all
                return data
            _skip_attention_block(r)
            end = r.off
        except _Bad:
            return data
        if not _recurrent_follows(r):
            return data
    return data[:end] + empty[8:]


def _skip_attention_block(r: _Reader) -> None:
    if r.u32("stream count") != 1:
        raise _Bad("not one KV stream")
    n = r.u32("cell count")
    if n == 0:
        return
    _cells(r, n)
    v_trans, n_layer = r.u32("V layout"), r.u32("layer count")
    if not 0 < n_layer <= MAX_LAYERS:
        raise _Bad("bad layer count")
    for _ in range(n_layer):
        r.i32("K type")
        r.take(n * r.u64("K row size"), "K data")
    for _ in range(n_layer):
        r.i32("V type")
        if v_trans:
            r.take(n * r.u32("V element size") * r.u32("V width"), "V data")
        else:
            r.take(n * r.u64("V row size"), "V data")
