"""What the radix cache uses of the engine, handed to it once: the engine calls the cache, the
cache never calls the engine back.

The cache's context is the engine's main context. Every change of its sequences (decode, fork,
clear, hold, restore, laying the cells out again) goes through ``seqs``, the one owner
(sequence_ops.py), which keeps their tokens (``seq_tokens``) and cells in step; ``ctx`` and
``seq_tokens`` are for reading (sizes, states, held changes). Runs evaluate in a slot
(slot/run_slot.py), which the cache hands cells to and takes cells back from: it reads nothing
of the slot's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..kv.sequence_ops import SequenceOps
from ..llama.batch_policy import BatchPolicy
from ..kv.sequence_tokens import SequenceTokens
from ..llama.native import NativeContext, NativeModel


@dataclass(frozen=True)
class EngineAccess:
    ctx: NativeContext  # the main context, whose sequences hold the resident nodes (read only)
    seqs: SequenceOps  # every change of its sequences: fork, clear, hold, copy cells in and out
    seq_tokens: SequenceTokens  # the tokens each of its sequences holds (read only)
    model: NativeModel  # token pieces, for the nodes' previews
    kv_bytes_per_token: int
    batching: BatchPolicy  # the batch starts a saved state's cells were computed with
    n_seq_max: int
    windowed: bool  # a sliding-window model: nothing restored is exact, nothing compacted
    # "attention", or "hybrid"/"recurrent": nodes then carry the recurrent state at their depth
    family: str = "attention"
    # cells are alike however tokens were batched (kernel_measure.py): asked each time, since
    # the engine's kernel choice owns it
    grouping_exact: Callable[[], bool] = lambda: False
