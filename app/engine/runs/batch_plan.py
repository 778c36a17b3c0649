"""Where decode batches start: the one rule that makes a warm run comparable bit for bit.

llama.cpp's CPU kernels compute a ubatch of fewer than 64 tokens on another path than one of 64
or more. Below 64 a token's logits depend only on the batch boundaries and on the order of the
sequence's cells in the cache, not on where the cells lie. From 64 on (tiled attention) they
also depend on where the cells lie, modulo 256: measured on SmolLM2, the same 69-token suffix
after a resident prefix differed by 0.54 in the logits once another sequence's cells sat
between them, and by 0 in chunks of 63. Small batches still depend on the order of the cells:
a suffix whose cells sit before its prefix's differs (0.75 on SmolLM2). llama.cpp fills freed
cells first, so the radix cache holds evicted cells and lays the cache out again in order
instead of freeing them in the middle (cell_compaction.py). So where runs evaluate in the
cache's shared context (sliding-window models), everything after the static prefix goes in
chunks of at most ``EXACT_CHUNK`` tokens; other models run in the work context
(work_context.py), whose cells lie as a cold run's, in plain n_batch batches. Either way the cold
run replays the same batch starts in a fresh context.

Where the kernel in use computes every cell alike however the tokens are grouped into batches
of two or more (measured at start, kernel_measure.py: flash attention off, here), a cell is
shared up to almost any position: ``any_boundary`` lifts the batch-end rule, and chain mode
batches plainly. A one-token batch is another computation (llama.cpp's single-token path; seen
on the default model: a prompt cut with a one-token batch at 1,812 gave other cells than the
same prompt in batches of two or more), so sharing never ends one token after a batch start
that the history continued past: the cold run would replay that token alone.
"""
from __future__ import annotations

from typing import Iterable

EXACT_CHUNK = 63


def batch_starts(start: int, end: int, chunk: int, marks: Iterable[int] = ()) -> list[int]:
    """Absolute positions where batches start to evaluate positions ``start``..``end - 1``:
    a batch ends at ``chunk`` tokens or at the next mark, whichever comes first."""
    if chunk < 1:
        raise ValueError("chunk must be positive")
    inside = sorted({m for m in marks if start < m < end})
    out: list[int] = []
    pos = start
    k = 0
    while pos < end:
        out.append(pos)
        while k < len(inside) and inside[k] <= pos:
            k += 1
        nxt = min(pos + chunk, end)
        if k < len(inside):
            nxt = min(nxt, inside[k])
        pos = nxt
    return out


def batches(starts: list[int], end: int) -> list[tuple[int, int]]:
    """(first, last + 1) positions of each batch."""
    return list(zip(starts, [*starts[1:], end]))


def shared_history(tokens_a: list[int], cuts_a: list[int], tokens_b: list[int],
                   cuts_b: list[int], end_b: int, any_boundary: bool = False) -> int:
    """The longest prefix two histories computed alike: the same tokens, and the same batches
    up to a boundary both have (cells computed in other batches may differ in the last bits,
    so a cell is only shared up to a batch end both histories reached the same way).
    History a ends at len(tokens_a); history b at ``end_b``. ``any_boundary``: batches do
    not matter (a grouping-exact kernel), only the tokens."""
    n = 0
    limit = min(len(tokens_a), end_b)
    while n < limit and tokens_a[n] == tokens_b[n]:
        n += 1
    if any_boundary:
        while True:  # each history, then the other again, until neither leaves a lone token
            m = clear_of_single(clear_of_single(n, cuts_a, len(tokens_a)), cuts_b, end_b)
            if m == n:
                return n
            n = m
    bounds_a = sorted({c for c in cuts_a if c <= n} | ({len(tokens_a)} if len(tokens_a) <= n else set()))
    bounds_b = sorted({c for c in cuts_b if c <= n} | ({end_b} if end_b <= n else set()))
    best = 0
    for a, b in zip(bounds_a, bounds_b):
        if a != b:
            break
        best = a
    return best


def batch_end_at_or_before(cuts: list[int], end: int, upto: int,
                           any_boundary: bool = False) -> int:
    """The last batch boundary of a history (batch starts ``cuts``, ending at ``end``) at or
    before ``upto``: reusing its cells up to there is reusing whole batches. ``any_boundary``:
    every position counts (a grouping-exact kernel)."""
    if any_boundary:
        return clear_of_single(max(0, min(upto, end)), cuts, end)
    return max([c for c in cuts if c <= upto] + ([end] if end <= upto else []), default=0)


def clear_of_single(n: int, cuts, end: int | None) -> int:
    """``n``, or ``n - 1`` when sharing a history's first ``n`` positions would leave a one-token
    batch [n - 1, n) for the cold run to replay that the history computed in a longer batch (it
    started a batch at n - 1 and none at n; ``end``: where the history ended, a batch end too;
    None when not known, as for a cache node that ends inside a batch)."""
    if n > 0 and n - 1 in cuts and n not in cuts and n != end:
        return n - 1
    return n
