"""The size of a sequence's state on a hybrid or recurrent model, as llama.cpp saves it.

A hybrid's sequence state has two parts: attention cells, one per token, and the recurrent
layers' state, one fixed-size record per sequence whatever its length (a recurrent model has the
second only). ``llama_state_seq_get_size_ext`` with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY counts the
recurrent part alone; llama.cpp counts without copying, so the KV view asks on every refresh.
"""
from __future__ import annotations

from dataclasses import replace

import llama_cpp as L

PARTIAL_ONLY = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def recurrent_bytes(ctx, seq: int) -> int:
    """Bytes of the recurrent part of ``seq``'s state in a NativeContext (an attention-only
    model's is its whole state)."""
    return int(L.llama_state_seq_get_size_ext(ctx.ptr, seq, PARTIAL_ONLY))


def measure_recurrent_bytes(model, params) -> int:
    """One sequence's recurrent state in bytes, measured: one token evaluated in a small
    context of its own (the engine's stays untouched) with ``params``' types and kernel."""
    from .batch_feed import feed_token
    from .native import NativeContext

    ctx = NativeContext(model, replace(params, n_ctx=256, n_batch=1, n_ubatch=0, n_seq_max=1))
    try:
        token = model.bos()
        feed_token(ctx.decode, 0 if token is None or token < 0 else token, 0)
        return recurrent_bytes(ctx, 0)
    finally:
        ctx.close()
