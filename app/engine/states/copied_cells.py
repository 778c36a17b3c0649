"""A state of some of a sequence's cells, copied out through a scratch sequence: the bytes the
radix cache keeps for a node, in position order.

On a hybrid or recurrent model the copy carries an empty recurrent record: the sequence's own
stands at its end, not at the copied cells' end, and would only take room (the cache keeps the
record of the right depth apart).
"""
from __future__ import annotations

from .hybrid_payload import without_recurrent
from .seq_payload import in_position_order


def cells_state(ctx, seq: int, p0: int, p1: int, scratch: int) -> bytes:
    """A state of only the cells of ``seq`` at positions p0..p1-1 in ``ctx`` (a NativeContext),
    in position order (copied through sequence ``scratch``, which is left empty)."""
    ctx.seq_rm(scratch)
    family = ctx.model.family
    empty = ctx.empty_recurrent_state(scratch) if family != "attention" else None
    ctx.seq_cp(seq, scratch, p0, p1)
    try:
        data = in_position_order(ctx.state_get(scratch))
    finally:
        ctx.seq_rm(scratch)
    return data if empty is None else without_recurrent(data, empty, family)
