"""V's layout in a sequence state, rewritten for the attention kernel of the context that will
restore it.

llama.cpp stores V one row per cell with flash attention and transposed (one row per embedding
component, one element per cell) without it, and refuses a state of the other layout
("incompatible V transposition"). The values are the same either way, so a state primed with
one kernel is made loadable under the other by moving bytes: no model is needed. Only
unquantized V can be transposed (llama.cpp needs flash attention for a quantized V cache).

llama.cpp's default (``-fa auto`` in llama-server, ``LLAMA_FLASH_ATTN_TYPE_AUTO`` in a default
context) turns flash attention on wherever the backend runs it, which every CPU does: its
states keep V untransposed. ``default_flash_attn`` asks llama.cpp rather than assume it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import StateFileError
from ..llama.ggml_types import GGML_TYPE_NAMES
from .prefix_state import PrefixState
from .seq_state_layout import READS, KvBlock, LayoutError, Rows, SeqState, Stream, parse

# ggml types whose elements llama.cpp can store transposed: f32, f16, bf16 (element bytes)
ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}
FA_CHOICES = ("auto", "on", "off")
_CELL_BLOCK = 256  # cells transposed at a time (_rows)


def _rows(r: Rows, transposed: bool) -> Rows:
    if r.transposed == transposed:
        return r
    el = ELEMENT_BYTES.get(r.type_id)
    if el is None:
        name = GGML_TYPE_NAMES.get(r.type_id, f"ggml type {r.type_id}").lower()
        raise StateFileError(f"this state's V cache is {name}, which llama.cpp keeps only with "
                             "flash attention on; load it with flash attention on, or prime "
                             "with an f16 V cache")
    if transposed:  # (cells, row bytes) -> (n_embd, cells) of elements
        words = np.ascontiguousarray(r.data).view(f"<u{el}")
        out = np.empty(words.shape[::-1], words.dtype)
        # a block of cells at a time: numpy's whole-array transpose this way ran at 0.24 GB/s
        # (8,202 cells of 512 f16), in blocks of 256 cells at 1.1
        for i in range(0, words.shape[0], _CELL_BLOCK):
            out[:, i:i + _CELL_BLOCK] = words[i:i + _CELL_BLOCK].T
        return Rows(r.type_id, out, True)
    # (n_embd, cells) of elements -> (cells, row bytes)
    cells = np.ascontiguousarray(r.data.T)
    return Rows(r.type_id, cells.view(np.uint8).reshape(cells.shape[0], -1), False)


def _stream(s: Stream, transposed: bool) -> Stream:
    if not s.n_cells or s.v_trans == transposed:
        return s
    return replace(s, v_trans=transposed, v=tuple(_rows(r, transposed) for r in s.v))


def with_v_layout(state: SeqState, transposed: bool) -> SeqState:
    """``state`` with every KV cache's V stored transposed or not (itself when it is)."""
    kv = tuple(KvBlock(tuple(_stream(s, transposed) for s in b.streams)) for b in state.kv)
    return state if kv == state.kv else replace(state, kv=kv)


def v_layout_of(state: SeqState) -> bool | None:
    """Whether V is stored transposed (the first stream with cells); None: no cells."""
    s = next((s for b in state.kv for s in b.streams if s.n_cells), None)
    return None if s is None else s.v_trans


def for_flash_attn(state: PrefixState, flash_attn: bool) -> PrefixState:
    """``state`` as a context with ``flash_attn`` on or off restores it (itself when it is
    already so, or holds no V: a recurrent model's). StateFileError when it cannot be."""
    try:
        desc = parse(state.data, state.seq_state_version)
    except LayoutError as e:
        raise StateFileError(f"this state's KV data is malformed ({e}); prime the prefix "
                             "again") from None
    want = not flash_attn  # llama.cpp transposes V without flash attention
    if v_layout_of(desc) in (None, want):
        return state
    return replace(state, data=with_v_layout(desc, want).to_bytes())


def _to_rewrite(state: PrefixState, flash_attn: bool | None):
    """The layout of ``state`` when its V must be rewritten for a context running
    ``flash_attn`` (None: not known yet); None when it is already so, holds no V, or cannot be
    read (the engine's checks refuse that)."""
    if flash_attn is None:
        return None
    try:
        desc = parse(state.data, state.seq_state_version)
    except LayoutError:
        return None
    return None if v_layout_of(desc) in (None, not flash_attn) else desc


def needs_rewrite(state: PrefixState, flash_attn: bool | None) -> bool:
    """Would ``for_context`` rewrite ``state``'s V (primed with the other kernel)?"""
    return _to_rewrite(state, flash_attn) is not None


def for_context(state: PrefixState, flash_attn: bool | None) -> PrefixState:
    """``state`` as a context running ``flash_attn`` (None: not known yet) restores it: V
    rewritten when it was primed with the other kernel, and ``note`` saying so. A state whose
    layout cannot be read is left for the engine's checks to refuse; a quantized V that would
    need rewriting is refused (StateFileError, one line)."""
    desc = _to_rewrite(state, flash_attn)
    if desc is None:
        return state
    return replace(state, data=with_v_layout(desc, not flash_attn).to_bytes(),
                   note=f"rewritten for flash attention {'on' if flash_attn else 'off'}")


def default_flash_attn(model) -> bool:
    """What llama.cpp's default (auto) flash-attention setting resolves to for ``model`` (a
    NativeModel) on this machine: a small context with llama.cpp's default evaluates one
    token, and the layout of its V says."""
    from ..llama.batch_feed import feed_token
    from ..llama.native import ContextParams, NativeContext

    ctx = NativeContext(model, ContextParams(n_ctx=256, n_batch=32, n_threads=1, n_seq_max=1,
                                             flash_attn=None))
    try:
        feed_token(ctx.decode, 0, 0)  # any token: only the layout is read
        data = ctx.state_get(0)
    finally:
        ctx.close()
    trans = v_layout_of(parse(data, READS.seq_state_version))
    return True if trans is None else not trans


def resolve_for_fa(choice: str, model) -> bool:
    """``--for-fa``: on, off, or auto (what llama.cpp's default context picks)."""
    if choice not in FA_CHOICES:
        raise StateFileError(f"unknown flash attention setting '{choice}'; use one of "
                             f"{', '.join(FA_CHOICES)}")
    return default_flash_attn(model) if choice == "auto" else choice == "on"


__all__ = ["ELEMENT_BYTES", "FA_CHOICES", "default_flash_attn", "for_context", "for_flash_attn",
           "resolve_for_fa", "v_layout_of", "with_v_layout"]
