"""Where decode batches start: the one module that decides it, since the batches a run used are
what make it bit-identical to its cold run. Every evaluation asks ``BatchPolicy`` for its batch
starts (prime, warm, module, recompute, the cold reference's replay, chain segments, forked rows)
and the reuse rules below say how far a history's cells can be shared.

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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXACT_CHUNK = 63
# a decode of fewer tokens than this takes llama.cpp's small-batch path (see above)
SMALL_UBATCH = 64


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


def node_reuse(cuts, depth: int, reused: int, grouping_exact: bool) -> int:
    """How much of a cache node's history (batch starts ``cuts``, ending at ``depth``) a run
    reuses of the ``reused`` tokens it shares: whole batches, so a cold run replaying them
    computes the same bits; on a grouping-exact kernel any position short of a lone token (a
    node may end inside its history's batch: its depth is no batch end to rely on)."""
    if grouping_exact:
        return clear_of_single(reused, set(cuts), None)
    return batch_end_at_or_before(list(cuts), depth, reused)


def chain_marks(segment_starts: Iterable[int], reused: int, *, storing: bool,
                grouping_exact: bool, reusable: int | None = None) -> list[int]:
    """Where a run in the work context also starts a batch when it stores segment ends as
    nodes: a node must end where a batch ends, so a later run reusing it replays whole batches.
    A mark costs a batch (small batches are slower per token), so it is made only where it can
    pay: at a segment start after the reused part and no deeper than ``reusable``, the most
    another row of the job could reuse of this prompt (``reusable_depths``); the segments past
    it are evaluated in the batches prefix mode uses. ``reusable`` None: the job's rows are not
    known (a single run), so every segment start after the reused part is marked: chain is
    there for later calls it cannot see, and a segment end left inside a batch is lost to all
    of them (each would evaluate the segment again, which costs more than this run's extra
    batches). No marks on a grouping-exact kernel, where any position will do."""
    if not storing or grouping_exact:
        return []
    return [s for s in segment_starts if s > reused and (reusable is None or s <= reusable)]


def chain_node_ends(segment_ends: Iterable[int], reused: int, end: int, marks: Iterable[int],
                    *, grouping_exact: bool) -> list[int]:
    """The segment ends after the reused part a run stores as nodes: where a batch of its
    history ends (a mark, or its end), so reusing a node is reusing whole batches and a
    stateful model has its recurrent state there; every one on a grouping-exact kernel. (Fewer
    marks only mean fewer nodes: ``node_reuse`` never shares past a batch end.)"""
    ends = set(marks) | {end}
    return [e for e in segment_ends if e > reused and (grouping_exact or e in ends)]


def reusable_depths(prompts: Sequence[Sequence[int] | None]) -> list[int]:
    """For each prompt of a job whose rows are all known (None: a row that will not run), the
    most another prompt of the job could reuse of it: their shared start, short of the other's
    last token (a run evaluates one token at least); 0 when no other prompt runs."""
    live = sorted((tuple(p), i) for i, p in enumerate(prompts) if p)
    out = [0] * len(prompts)
    for k, (p, i) in enumerate(live):
        best = 0
        for step in (-1, 1):  # sorted, the shared start only shrinks away from a prompt
            shared, j = len(p), k + step
            while 0 <= j < len(live) and shared > best:
                other = live[j][0]
                shared = min(shared, _common(live[j - step][0], other))
                best = max(best, min(shared, len(other) - 1))
                j += step
        out[i] = best
    return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def fork_marks(segment_starts: Iterable[int], reused: int, end: int) -> list[int]:
    """Where a run in the cache's shared context (sliding-window models) starts a batch besides
    its small ones: at every segment start after the reused part, and its end. Its nodes are
    forked there, while the sequence ends there (a window's cells do not survive a trim)."""
    return [s for s in segment_starts if s > reused] + [end]


@dataclass(frozen=True)
class BatchPolicy:
    """The batch starts of every evaluation, for an engine evaluating ``n_batch`` tokens per
    llama_decode at most. Starts are absolute positions; an evaluation of ``start``..``end - 1``
    gets its plan here and passes it to the feeding loop (batch_feed.py)."""
    n_batch: int

    def plain(self, start: int, end: int, marks: Iterable[int] = ()) -> list[int]:
        """Plain n_batch batches, also starting at ``marks``: how the work context evaluates
        (its cells lie as a cold run's), and how a prefix is primed from cell 0."""
        return batch_starts(start, end, self.n_batch, marks)

    def chunked(self, start: int, end: int, chunk: int | None = None,
                marks: Iterable[int] = ()) -> list[int]:
        """Batches of at most ``chunk`` tokens (default and cap n_batch), also starting at
        ``marks``."""
        return batch_starts(start, end, min(chunk or self.n_batch, self.n_batch), marks)

    def exact_chunks(self, start: int, end: int, marks: Iterable[int] = ()) -> list[int]:
        """Batches under 64 tokens: in the cache's shared context (sliding-window models) their
        results do not depend on where the cells lie."""
        return self.chunked(start, end, EXACT_CHUNK, marks)

    def prime(self, start: int, end: int, *, windowed: bool, cache_empty: bool) -> list[int]:
        """A static prefix: plain batches in the work context, or into an empty shared
        context (cells from cell 0, as a cold run lays them); small ones among other cells."""
        if not windowed or cache_empty:
            return self.plain(start, end)
        return self.exact_chunks(start, end)

    def warm(self, start: int, end: int, marks: Iterable[int] = (), *,
             windowed: bool) -> list[int]:
        """The evaluated part of a warm run (also starting at ``marks``): plain batches in the
        work context, small ones in the shared context."""
        if windowed:
            return self.exact_chunks(start, end, marks)
        return self.plain(start, end, marks)

    def module(self, start: int, end: int, *, windowed: bool) -> list[int]:
        """A composed module, or a module's tokens recomputed in context: as a warm run."""
        return self.warm(start, end, windowed=windowed)

    def replay(self, n_tokens: int, marks: Iterable[int] | None) -> list[int]:
        """The cold reference's batches from scratch: plain n_batch batches also starting at
        ``marks`` (the warm history's batch starts; None or empty: plain batches only)."""
        return batch_starts(0, n_tokens, self.n_batch, marks or ())

    def saved_state(self, n_tokens: int) -> list[int]:
        """The batch starts a saved state's cells were computed with: a prefix is primed in
        plain n_batch batches from position 0."""
        return self.plain(0, n_tokens)

    def composed_reference(self, prefix_cuts: Iterable[int], prefix_end: int, end: int,
                           segment_starts: Iterable[int]) -> list[int]:
        """The cold run every exact mode of a composed row shares: the static prefix as it was
        primed, then each segment in small batches (a composed sequence has no single history
        to replay)."""
        return ([c for c in prefix_cuts if c < prefix_end]
                + batch_starts(prefix_end, end, EXACT_CHUNK, segment_starts))

    def forked_decodes(self, rows: Sequence[tuple[object, int, int, Iterable[int]]],
                       exact: bool) -> list[list[tuple[object, int, int]]]:
        """The decodes of a forked batch: each row (key, reused, end, segment starts) cut where
        its one-by-one warm run in the shared context cuts it (``exact_chunks``: pieces under
        SMALL_UBATCH tokens, and n_batch at most), then consecutive pieces packed into decodes
        of under SMALL_UBATCH tokens (so every token stays on the path its one-by-one run
        takes) or, not ``exact``, of up to n_batch."""
        pieces = [(key, a, b) for key, reused, end, marks in rows
                  for a, b in batches(self.exact_chunks(reused, end, marks), end)]
        return _pack(pieces, min(self.n_batch, SMALL_UBATCH - 1) if exact else self.n_batch)


def _pack(pieces, cap: int) -> list[list]:
    """Consecutive pieces into groups of at most ``cap`` tokens, in order."""
    groups: list[list] = []
    size = cap + 1
    for piece in pieces:
        n = piece[2] - piece[1]
        if size + n > cap:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += n
    return groups
