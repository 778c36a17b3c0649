"""Which tokens of composed modules a run evaluates again in context, and why.

A composed module's cached cells attended to the static prefix only; evaluating some of its
tokens in context (after everything before them, as a cold run does) brings the run closer to
the cold run at the cost of evaluating them. The setting is either a count (``8``: the first 8
tokens of each module, as EPIC does) or a share (``15%``: that share of each module's tokens,
the ones the selection signal ranks highest).

The signal is a module's first tokens. Measured on the recurring rows (BENCHMARKS.md, the
compose-oracle curves), ranking tokens by CacheBlend's layer-1 V deviation did no better on
greedy-equal rows, top-1 agreement or KL than taking each module's first tokens, while it cost
a scoring pass per run and scattered the chosen tokens into many runs (one decode each), so it
took about twice the time. The first tokens are one run per module and need no scoring pass.
``choose_runs`` takes any per-token scores, so another signal only has to provide them.

A row's first module needs no recompute when it lies where it was made: right after the static
prefix, at the positions it was cached at (a module is built by evaluating its tokens after the
static prefix's cells). Its cached cells are then what evaluating it in context computes, up to
batch grouping. ``row_runs`` leaves it out and spends a share's tokens on the later modules
instead (the same total as each module's share would take); a count of first tokens is per
module, so leaving the first one out saves its evaluation.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import KvPrimerError

# compose's default share of each module recomputed in context: no share reaches the accuracy
# goals (BENCHMARKS.md), so it is the most accurate point (lowest KL median) of the shares within
# half of prefix mode's warm time, measured through the engine side by side with prefix mode
# (bench/compose-shares.json, bench/compose_shares.py's pick_default); none above 0% was, on a
# quiet machine, so compose recomputes nothing unless asked
DEFAULT_SHARE = 0.0
SIGNAL = "first_k"  # the selection signal in use (see the module docstring)
_SHARE = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Recompute:
    """How much of each composed module to recompute: ``count`` first tokens, or, when
    ``share`` is set (0..1), that share of its tokens."""
    count: int = 0
    share: float | None = None

    @property
    def text(self) -> str:
        """As a user writes it: ``8`` or ``15%``."""
        return str(self.count) if self.share is None else f"{self.share * 100:g}%"

    def tokens_of(self, n: int) -> int:
        """Tokens of an ``n``-token module to recompute (a share above 0 takes one at least)."""
        if self.share is None:
            return min(self.count, n)
        if self.share <= 0 or n == 0:
            return 0
        return min(n, max(1, round(self.share * n)))


def parse_recompute(value) -> Recompute:
    """A recompute setting from what a user gave: a count of tokens (``8``, ``"8"``), a share
    (``"15%"``) or a ``Recompute``; anything else is one clear error."""
    if isinstance(value, Recompute):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KvPrimerError(f"recompute takes a count of tokens per module (8) or a share of "
                            f"each module (15%), not {value!r}")
    if isinstance(value, str):
        m = _SHARE.match(value)
        if m:
            pct = float(m.group(1))
            if not 0 <= pct <= 100:
                raise KvPrimerError(f"the recompute share must be between 0% and 100% of each "
                                    f"module, not {value.strip()}")
            return Recompute(share=pct / 100)
        try:
            value = int(value.strip())
        except ValueError:
            raise KvPrimerError(f"recompute takes a count of tokens per module (8) or a share "
                                f"of each module (15%), not {value!r}") from None
    if value < 0:
        raise KvPrimerError(f"recompute k must be 0 or more tokens, not {value}")
    return Recompute(count=value)


def default_recompute() -> str:
    """The default setting, as a user writes it."""
    return Recompute(share=DEFAULT_SHARE).text


def first_k_scores(n: int) -> np.ndarray:
    """The first-tokens signal: a module's earlier tokens rank higher."""
    return -np.arange(n, dtype=np.float64)


def choose_runs(scores, count: int) -> list[tuple[int, int]]:
    """The ``count`` tokens of a module with the highest ``scores`` (ties: the earlier token),
    as [start, end) runs of consecutive indices in order: each run is one evaluation."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    runs: list[tuple[int, int]] = []
    for i in sorted(int(x) for x in order[:max(0, count)]):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def module_runs(n: int, setting: Recompute) -> list[tuple[int, int]]:
    """The runs of an ``n``-token module to recompute, by the signal in use."""
    return choose_runs(first_k_scores(n), setting.tokens_of(n))


def spread(budget: int, sizes: list[int]) -> list[int]:
    """``budget`` tokens over modules of ``sizes``, in proportion to their sizes (the same
    share of each; the remainders to the largest fractions, ties to the earlier module), none
    above its size."""
    total = sum(sizes)
    if budget >= total:
        return list(sizes)
    if budget <= 0:
        return [0] * len(sizes)
    exact = [budget * n / total for n in sizes]
    counts = [int(x) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[:budget - sum(counts)]:
        counts[i] += 1
    return counts


def row_counts(sizes: list[int], setting: Recompute, first_in_place: bool) -> list[int]:
    """Tokens to recompute of each composed module of a row (``sizes``, in order). Where the
    first module lies where it was made (``first_in_place``) it takes none: a count setting
    saves its evaluation, a share gives its tokens to the later modules (the row recomputes as
    many tokens as the share of every module would, at most all of the later ones)."""
    counts = [setting.tokens_of(n) for n in sizes]
    if not first_in_place or not sizes:
        return counts
    if setting.share is None:
        return [0, *counts[1:]]
    return [0, *spread(sum(counts), sizes[1:])]


def row_runs(sizes: list[int], setting: Recompute,
             first_in_place: bool) -> list[list[tuple[int, int]]]:
    """The runs of each module of a row to recompute (``row_counts`` tokens each, chosen by the
    signal in use)."""
    return [choose_runs(first_k_scores(n), k)
            for n, k in zip(sizes, row_counts(sizes, setting, first_in_place))]


@dataclass(frozen=True)
class RecomputeChoice:
    """What a composed run recomputed and why: the setting, the signal that chose the tokens,
    and how many of the modules' tokens it took."""
    setting: str  # as a user writes it: "15%" or "8"
    tokens: int  # module tokens evaluated in context
    module_tokens: int  # all tokens of the composed modules
    runs: int  # evaluations they took (one per run of consecutive tokens)
    signal: str = SIGNAL
    # the first module's tokens kept as cached, not recomputed: it lay where it was made,
    # right after the static prefix (its cells are what a cold run computes); 0: it did not
    in_place: int = 0

    @property
    def share(self) -> float:
        """The share of the modules' tokens actually recomputed."""
        return self.tokens / self.module_tokens if self.module_tokens else 0.0

    def describe(self) -> str:
        """One line for people: what was recomputed and why these tokens."""
        if self.setting.endswith("%"):
            why = f"the first {self.setting} of each module (signal {self.signal})"
        else:
            why = f"the first {self.setting} tokens of each module"
        if self.in_place:
            kept = (f"; the first module's {self.in_place:,} tokens not, as it lies where it "
                    "was made, right after the static prefix")
            if self.setting.endswith("%"):
                why = (f"each later module's first tokens, up to {self.setting} of all the "
                       f"modules' tokens (signal {self.signal})")
            else:
                why = f"the first {self.setting} tokens of each later module"
            why += kept
        return (f"recomputed {self.tokens:,} of {self.module_tokens:,} module tokens "
                f"({self.share:.0%}) in context: {why}")

    def as_dict(self) -> dict:
        return {**asdict(self), "share": self.share, "text": self.describe()}
