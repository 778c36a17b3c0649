"""Feeding a sequence's tokens to llama_decode in planned batches: the one loop every
evaluation uses.

The engine's cache context, the work context, the cold reference, the kernel measurement and
the bench's fastest limit all evaluate the same way: tokens at consecutive positions of one
sequence, in batches starting where the batch plan says (batch_plan.py), the logits of the last
token wanted or not, cancellation checked between batches. Where a bit-identical comparison
depends on two evaluations cutting the same batches, they had better share the loop that cuts
them. What each caller keeps besides (the tokens a sequence holds, the batch starts of its
history, recurrent snapshots) it does in ``after``; ``decode`` is the caller's one-decode call
(``NativeContext.decode``, or a wrapper that records what was decoded).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..task_state import TaskState
from .batch_plan import batches

# (token id, position, sequence ids, wants logits): one token of a llama_batch
Entry = tuple[int, int, tuple[int, ...], bool]
Decode = Callable[[list[Entry]], None]


def feed_batches(decode: Decode, tokens: Sequence[int], start: int, starts: Sequence[int],
                 seq: int = 0, *, want_logits: bool = True, task: TaskState | None = None,
                 stage: str = "eval", before: Callable[[int], None] | None = None,
                 after: Callable[[int, int], None] | None = None) -> None:
    """Decode ``tokens`` (positions ``start``.. of ``seq``) in batches starting at the absolute
    positions ``starts``; only the last token's logits are asked for (if ``want_logits``).

    ``task`` gets progress per batch and may cancel between batches (``Cancelled`` says how
    many tokens the sequence then holds: every batch before it). ``before(a)`` runs before the
    batch starting at ``a``, ``after(a, b)`` once positions a..b-1 are in."""
    if not tokens:
        return
    end = start + len(tokens)
    if not starts or starts[0] != start:
        raise ValueError("the batch plan must start where the sequence ends")
    if any(b <= a for a, b in batches(list(starts), end)):
        raise ValueError("the batch plan's starts must rise and stay before the end")
    task = task or TaskState()
    task.report(stage, 0, len(tokens))
    for a, b in batches(list(starts), end):
        task.check(kept_tokens=a)
        if before is not None:
            before(a)
        decode([(tokens[i - start], i, (seq,), want_logits and i == end - 1)
                for i in range(a, b)])
        if after is not None:
            after(a, b)
        task.report(stage, b - start, len(tokens))


def feed_token(decode: Decode, token: int, pos: int, seq: int = 0) -> None:
    """One generated token at ``pos``, its logits wanted (a generation step)."""
    decode([(token, pos, (seq,), True)])
