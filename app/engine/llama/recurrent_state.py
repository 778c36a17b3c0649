"""The size of a sequence's state on a hybrid or recurrent model, as llama.cpp saves it.

A hybrid's sequence state has two parts: attention cells, one per token, and the recurrent
layers' state, one fixed-size record per sequence whatever its length (a recurrent model has the
second only). ``llama_state_seq_get_size_ext`` with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY counts the
recurrent part alone; llama.cpp counts without copying, so the KV view asks on every refresh.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import llama_cpp as L

PARTIAL_ONLY = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def recurrent_bytes(ctx, seq: int) -> int:
    """Bytes of the recurrent part of ``seq``'s state in a NativeContext (an attention-only
    model's is its whole state)."""
    return int(L.llama_state_seq_get_size_ext(ctx.ptr, seq, PARTIAL_ONLY))


@dataclass(frozen=True)
class StateSizes:
    attention_bytes_per_token: int  # the cells one more token adds to a sequence's state
    recurrent_bytes: int  # one sequence's recurrent state, whatever its length


def measure_state_sizes(model, params) -> StateSizes:
    """Evaluate one token and then a second in a small context of its own (the engine's
    context stays untouched) with ``params``' KV types and kernel, and measure what llama.cpp
    would save of the sequence."""
    from .native import NativeContext

    ctx = NativeContext(model, replace(params, n_ctx=256, n_batch=1, n_ubatch=0, n_seq_max=1))
    try:
        token = model.bos()
        token = 0 if token is None or token < 0 else token
        ctx.decode([(token, 0, (0,), True)])
        one = int(L.llama_state_seq_get_size_ext(ctx.ptr, 0, 0))
        recurrent = recurrent_bytes(ctx, 0)
        ctx.decode([(token, 1, (0,), True)])
        two = int(L.llama_state_seq_get_size_ext(ctx.ptr, 0, 0))
    finally:
        ctx.close()
    return StateSizes(two - one, recurrent)
