"""Checks and rewrites of llama.cpp's per-sequence state bytes before they reach
``llama_state_seq_set_data`` (the layout and its version gate are in seq_state_layout.py).

llama.cpp checks the layer count, KV types and row sizes of a sequence state itself and refuses
a mismatch cleanly. It does not check the cell positions: a state with a negative or huge
position (or positions not 0..n-1) is accepted, and its cells then stay in the cache for good
(``seq_rm`` only removes positions 0..INT_MAX-1), so the tokens we think are resident no longer
match what llama.cpp holds. It also clears the target sequence before it finds a mismatch.
So we read the whole layout here (bounded reads only, no allocation from declared lengths) and
refuse anything but cells at positions 0..n-1 (each once, in any order) of one sequence, with
sizes adding up exactly.
"""
from __future__ import annotations

from functools import cache

import numpy as np

from ..errors import StateFileError
from .seq_state_layout import READS, LayoutError, SeqState, Stream, library_problem, parse

FAMILIES = ("attention", "hybrid", "recurrent")  # what a model's layers keep per sequence
_FAMILY_WORDS = {"attention": "a model with attention layers only",
                 "hybrid": "a hybrid model (attention and recurrent layers)",
                 "recurrent": "a recurrent model"}


def live_state(data: bytes, family: str | None = None) -> SeqState | None:
    """The description of bytes the running llama.cpp wrote; None when this reader does not
    know that llama.cpp's format, or the bytes are not a state of it."""
    if _library_problem():
        return None
    try:
        return parse(data, READS.seq_state_version, family)
    except LayoutError:
        return None


@cache
def _library_problem() -> str:
    return library_problem()


def check_seq_payload(data: bytes, n_tokens: int, type_ids: tuple[int, int] | None = None,
                      family: str = "attention", recurrent_bytes: int = 0,
                      version: int | None = None) -> None:
    """Raise StateFileError unless ``data``, a state of seq-state ``version`` (None: the running
    llama.cpp's), is a well-formed state of exactly ``n_tokens`` cells (and, for a hybrid or
    recurrent ``family``, one recurrent record at position n_tokens - 1, of ``recurrent_bytes``
    when known: a record's size is fixed per model).

    ``type_ids``: the ggml type ids of K and V the state claims (its metadata); every layer's
    rows must be of those types.
    """
    if problem := _library_problem():  # what this reader would check is not what llama.cpp reads
        raise StateFileError(problem)
    version = READS.seq_state_version if version is None else version  # (the running one's)
    try:
        found = parse(data, version).family
    except LayoutError:
        found = None  # the walk below, for the given family, says what is wrong
    if found is not None and found != family:
        raise StateFileError(f"this state was saved from {_FAMILY_WORDS[found]}, and the loaded "
                             f"model is {_FAMILY_WORDS[family]}; load the model it was saved "
                             "with or prime the prefix again")
    try:
        _check(parse(data, version, family), n_tokens, type_ids, recurrent_bytes)
    except LayoutError as e:
        raise StateFileError(f"this state's KV data is malformed ({e}); it was rejected before "
                             "reaching llama.cpp; prime the prefix again") from None


def _check(state: SeqState, n_tokens: int, type_ids, recurrent_bytes: int) -> None:
    for i, block in enumerate(state.kv):
        if len(block.streams) != 1:
            raise LayoutError("not one KV stream")
        _check_stream(block.streams[0], n_tokens, type_ids, first=i == 0)
    rec = state.recurrent
    if rec is not None:
        if recurrent_bytes and rec.nbytes != recurrent_bytes:
            raise LayoutError(f"a recurrent state of {rec.nbytes:,} bytes where this model's has "
                              f"{recurrent_bytes:,}")
        if rec.position != n_tokens - 1:
            raise LayoutError(f"no recurrent state at position {n_tokens - 1}")


def _check_stream(s: Stream, n_tokens: int, type_ids, first: bool) -> None:
    n = s.n_cells
    if first and n != n_tokens:
        raise LayoutError(f"{n} KV cells for {n_tokens} tokens")
    if n > n_tokens:
        raise LayoutError(f"{n} KV cells in a second cache for {n_tokens} tokens")
    if n == 0:  # an empty sliding-window cache
        return
    # cells come in cache order, which after trims and forks need not be position order
    spos = np.sort(s.positions)
    if first:
        if not np.array_equal(spos, np.arange(n, dtype=spos.dtype)):
            raise LayoutError("cell positions are not 0 to n-1, once each")
    elif spos[0] < 0 or spos[-1] >= n_tokens or np.any(np.diff(spos) <= 0):
        raise LayoutError("sliding-window cell positions out of range or repeated")
    if type_ids is not None:
        k_type, v_type = type_ids
        if any(r.type_id != k_type for r in s.k):
            raise LayoutError("K rows of another type or size")
        if any(r.type_id != v_type for r in s.v):
            raise LayoutError("V rows of another type")


def row_layout(data: bytes, version: int | None = None) -> list[list[tuple[int, int, int, int]]] | None:
    """Per KV cache, per layer: (K type, K bytes per cell, V type, V bytes per cell); None
    when ``data`` is not a layout we know. ``version``: the state's (None: the running one's)."""
    state = _state(data, version)
    if state is None or not state.kv:
        return None
    blocks = []
    for block in state.kv:
        s = next((s for s in block.streams if s.n_cells), None)
        blocks.append([] if s is None else [(k.type_id, k.cell_bytes, v.type_id, v.cell_bytes)
                                            for k, v in zip(s.k, s.v)])
    return blocks


def _state(data: bytes, version: int | None) -> SeqState | None:
    if version is None:
        return live_state(data)
    try:
        return parse(data, version)
    except (LayoutError, StateFileError):
        return None


def v_transposed(data: bytes, version: int | None = None) -> bool | None:
    """Whether a state's V rows are stored transposed (llama.cpp does that without flash
    attention); None when the layout is not one we know or holds no cells."""
    state = _state(data, version)
    s = state.first_stream if state is not None else None
    return None if s is None else s.v_trans


def stream_count(data: bytes, version: int | None = None) -> int | None:
    """How many KV streams the writer's cache had (llama.cpp refuses a restore into another
    count: one stream is a unified cache or one slot); None when the layout is not one we know
    or has no KV cache (a recurrent model's)."""
    state = _state(data, version)
    return len(state.kv[0].streams) if state is not None and state.kv else None


def in_position_order(data: bytes) -> bytes:
    """The same state with its cells sorted by position (``data`` itself when they already are,
    or when the running llama.cpp's format or the bytes are not ones we know).

    llama.cpp writes a sequence's cells in cache order. After trims, forks and other sequences
    coming and going, that is not position order, and a restore lays the cells out in the
    order written. Attention then sums over the same cells in another order, so a warm run
    differs from a cold one in the last bits (seen: max |Δlogit| 0.02 on the tiny model).
    Sorting here gives every restore the layout a cold run of the prefix has.
    """
    state = live_state(data)
    if state is None:  # not a layout we know: leave it for check_seq_payload to judge
        return data
    ordered = state.in_position_order()
    return data if ordered is state else ordered.to_bytes()
