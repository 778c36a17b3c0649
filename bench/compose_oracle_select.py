"""Which module tokens to recompute: a share of them, chosen by a score or by place.

Indices count the module tokens of a row in order (0 .. module_tokens-1, modules back to back);
RowPlan.positions turns them into positions in the prompt.

- ``oracle``: the tokens whose K and V deviate most from the cold run's over all layers (known
  only with a cold run: the best any per-token score can pick);
- ``layer1_v``: CacheBlend's signal, the V deviation at layer 1 (what a scoring pass that runs
  layers 0 and 1 of the whole prompt in context would see, no cold run needed);
- ``first_k``: the first tokens of each module (EPIC's rule), the same share of each.
"""
from __future__ import annotations

import numpy as np

METHODS = ("oracle", "layer1_v", "first_k")


def share_count(n: int, share: float) -> int:
    """How many of ``n`` tokens a share means (at least one when the share is above 0)."""
    return 0 if share <= 0 or n == 0 else min(n, max(1, round(share * n)))


def top_share(scores: np.ndarray, share: float) -> list[int]:
    """The indices of the largest scores, ``share`` of them, in index order (ties: the earlier
    token first)."""
    k = share_count(len(scores), share)
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return sorted(int(i) for i in order[:k])


def first_k(module_lengths: list[int], share: float) -> list[int]:
    """The first ``share`` of each module's tokens."""
    out, base = [], 0
    for n in module_lengths:
        out += range(base, base + share_count(n, share))
        base += n
    return out


def choose(method: str, share: float, module_lengths: list[int], dev,
           layer1=None) -> list[int]:
    """Module-token indices for ``method`` at ``share``; ``dev`` is the row's Deviation,
    ``layer1`` the scoring pass's layer-1 V deviation (None: the cold run's, the same up to f16
    rounding)."""
    if method == "oracle":
        return top_share(dev.oracle(), share)
    if method == "layer1_v":
        return top_share(dev.layer_v(1) if layer1 is None else layer1, share)
    if method == "first_k":
        return first_k(module_lengths, share)
    raise ValueError(f"unknown selection method {method!r}; use one of {', '.join(METHODS)}")


def recall(chosen: list[int], best: list[int]) -> float:
    """The share of ``best`` (the oracle's choice at the same share) that ``chosen`` holds."""
    return len(set(chosen) & set(best)) / len(best) if best else 1.0
