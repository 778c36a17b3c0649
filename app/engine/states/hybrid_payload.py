"""A hybrid or recurrent model's sequence state taken apart: where its attention cells lie, and
the same state with its recurrent record emptied (seq_state_layout.py has the layout).

llama.cpp's position range of a hybrid sequence also counts its recurrent record (the later
start of its two memories), so the cells' own positions are read from the state. And a state of
some cells copied out of a sequence carries that sequence's recurrent record, which stands at
the sequence's end, not at the cells': the radix cache keeps the right one apart, so the copied
state gets an empty record instead (llama.cpp's own layout for a sequence without one).
"""
from __future__ import annotations

from .seq_payload import live_state


def attention_span(data: bytes) -> tuple[int, int] | None:
    """The lowest and highest position of a hybrid state's attention cells ((-1, -1): none);
    None when ``data`` does not start with an attention block we know. (llama.cpp's range of
    a hybrid sequence also counts its recurrent record, which sits at the last position.)"""
    state = live_state(data)
    if state is None or not state.kv or len(state.kv[0].streams) != 1:
        return None
    pos = state.kv[0].streams[0].positions
    return (int(pos.min()), int(pos.max())) if len(pos) else (-1, -1)


def without_recurrent(data: bytes, empty: bytes, family: str) -> bytes:
    """A hybrid or recurrent state with its recurrent record replaced by ``empty``'s
    (llama.cpp's partial state of a sequence without one: the record's layout, no rows), so
    that it carries attention cells only; ``data`` itself when its layout is not one we know."""
    state, none = live_state(data, family), live_state(empty, "recurrent")
    if state is None or none is None:
        return data
    return state.with_recurrent(none.recurrent).to_bytes()
