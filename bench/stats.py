"""Medians, ranges and pairwise ratios: the maths behind every figure the bench reports.

Ratios are medians of per-repeat ratios (a / b measured in the same repeat, close in time), not
ratios of medians: on a shared machine, load comes and goes, and pairing cancels most of it.
"""
from __future__ import annotations

import statistics
from typing import Sequence


def summary(xs: Sequence[float]) -> dict:
    """{median, min, max, n} of a list of timings (ms)."""
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def a_first(k: int) -> bool:
    """Whether path A goes first in pair ``k`` of an ABBA series: each path as often first as
    second, so a drift of the machine's speed weighs on both alike."""
    return k % 4 in (0, 3)


def pairwise_ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Median of a[i] / b[i]; the lists are paired by repeat and must be the same length."""
    if len(a) != len(b):
        raise ValueError(f"paired lists differ in length ({len(a)} and {len(b)})")
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return statistics.median(ratios) if ratios else None


def goal_met(value: float | None, goal: float) -> bool | None:
    """A goal is an upper bound on a ratio; None when the ratio could not be measured."""
    return None if value is None else value <= goal
