"""Feeding tokens to llama_decode in planned batches: the one loop every evaluation uses.

The engine's cache context, the work context, the cold reference, forked rows, the kernel
measurement and the bench's fastest limit all evaluate the same way: batches of entries in the
order planned (batch_policy.py), progress reported and cancellation checked between batches.
Where a bit-identical comparison depends on two evaluations cutting the same batches, they had
better share the loop that cuts them. ``feed_batches`` is its one-sequence form (tokens at
consecutive positions, the last token's logits wanted or not), ``feed_groups`` the form for
batches already holding several sequences' tokens (a forked batch's suffixes), ``feed_step``
and ``feed_token`` a generation step. What each caller keeps besides (the tokens a sequence
holds, the batch starts of its history, recurrent snapshots) it does in ``after``; ``decode``
is the caller's one-decode call (``NativeContext.decode``, or a wrapper that records what was
decoded).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..task_state import TaskState
from .batch_policy import batches

# (token id, position, sequence ids, wants logits): one token of a llama_batch
Entry = tuple[int, int, tuple[int, ...], bool]
Decode = Callable[[list[Entry]], None]


def feed_groups(decode: Decode, groups: Sequence[list[Entry]], *, task: TaskState | None = None,
                stage: str = "eval", kept: Callable[[int], int] = lambda _i: 0,
                before: Callable[[int], None] | None = None,
                after: Callable[[int], None] | None = None) -> None:
    """Decode each group of entries in one llama_decode, in order.

    ``task`` gets progress per group (in tokens) and may cancel before each one
    (``kept(i)``: the tokens ``Cancelled`` says the sequence holds before group i, when one
    sequence is fed). ``before(i)`` and ``after(i)`` run around group i's decode."""
    task = task or TaskState()
    total, done = sum(len(g) for g in groups), 0
    task.report(stage, 0, total)
    for i, group in enumerate(groups):
        task.check(kept_tokens=kept(i))
        if before is not None:
            before(i)
        decode(group)
        if after is not None:
            after(i)
        done += len(group)
        task.report(stage, done, total)


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
    spans = batches(list(starts), end)
    if any(b <= a for a, b in spans):
        raise ValueError("the batch plan's starts must rise and stay before the end")
    groups = [[(tokens[i - start], i, (seq,), want_logits and i == end - 1) for i in range(a, b)]
              for a, b in spans]
    feed_groups(decode, groups, task=task, stage=stage, kept=lambda i: spans[i][0],
                before=None if before is None else (lambda i: before(spans[i][0])),
                after=None if after is None else (lambda i: after(*spans[i])))


def feed_step(decode: Decode, steps: Sequence[tuple[int, int, int]]) -> None:
    """One generation step: a (token, position, sequence) for each sequence generating, each
    token's logits wanted, in one decode."""
    decode([(token, pos, (seq,), True) for token, pos, seq in steps])


def feed_token(decode: Decode, token: int, pos: int, seq: int = 0) -> None:
    """One generated token at ``pos``, its logits wanted (a generation step)."""
    feed_step(decode, [(token, pos, seq)])
