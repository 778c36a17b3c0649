"""Reuse modes compared side by side, so the machine's load cannot pass for a mode's cost.

Timed one mode after another, minutes apart, a benchmark compares the machine's load as much as
the modes: a busy minute during prefix mode once made chain look 10% slower. So a benchmark
runs every mode on a row before the next row, in an order that balances: with two modes A B
on one row (or repeat), B A on the next, then B A, A B (ABBA), so a drift of the machine's speed
weighs on both alike; with three, rotations and their mirrors (ABC CBA BCA ACB CAB BAC). The
headline "chain against prefix" is then the median over rows of each row's ratio of its own
side-by-side runs, not a ratio of medians over phases.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


def mode_order(modes: tuple[str, ...], k: int) -> tuple[str, ...]:
    """The modes' order in round ``k`` (a row's repeat, counted over the whole benchmark): a
    rotation by k // 2, reversed on odd k. Over 2n rounds each mode runs in each place twice."""
    n = len(modes)
    if n < 2:
        return tuple(modes)
    r = (k // 2) % n
    base = tuple(modes[r:]) + tuple(modes[:r])
    return base[::-1] if k % 2 else base


@dataclass(frozen=True)
class Step:
    """One timed call of a benchmark: a row (its index among the rows), a round, a mode."""
    row: int
    round: int
    mode: str


def bench_order(n_rows: int, modes: tuple[str, ...], repeat: int) -> list[Step]:
    """Every call of a benchmark in the order it runs: row by row, each row's ``repeat``
    rounds, each round all modes (``mode_order``)."""
    out, k = [], 0
    for i in range(n_rows):
        for rnd in range(repeat):
            out.extend(Step(i, rnd, m) for m in mode_order(modes, k))
            k += 1
    return out


def paired_ratio(runs_ms: list[float], base_ms: list[float]) -> float | None:
    """A row's ratio to its base mode: the median over rounds of each round's two warm times,
    measured side by side (None: no round has both)."""
    ratios = [a / b for a, b in zip(runs_ms, base_ms) if a > 0 and b > 0]
    return statistics.median(ratios) if ratios else None


@dataclass(frozen=True)
class PairedFigure:
    mode: str
    base: str
    ratio: float | None  # median over rows of each row's paired ratio
    rows: int  # rows measured in both modes
    static_ratio: float | None = None  # over the rows where mode reused no more than base
    static_rows: int = 0

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "rows": self.rows, "static_rows_ratio": self.static_ratio,
                "static_rows": self.static_rows}

    def text(self) -> str:
        """"chain ×1.00 of prefix, side by side (median of 10 rows; ×1.00 on the 6 rows
        reusing only what prefix reused)"."""
        if self.ratio is None:
            return f"{self.mode} against {self.base}: no row measured in both"
        rows = f"{self.rows} row" + ("s" if self.rows != 1 else "")
        more = ""
        if self.static_ratio is not None and self.static_rows < self.rows:
            more = (f"; ×{self.static_ratio:.2f} on the {self.static_rows} reusing no more "
                    f"than {self.base}")
        return (f"{self.mode} ×{self.ratio:.2f} of {self.base}'s warm time, side by side "
                f"(median of {rows}{more})")


def paired_figures(rows, modes: tuple[str, ...], base: str = "prefix") -> list[PairedFigure]:
    """Each other mode against ``base`` from the rows' side-by-side runs (BenchRows with
    ``warm_runs_ms``; rows that failed in either mode are left out)."""
    if base not in modes:
        return []
    ok = {(r.row, r.reuse): r for r in rows if r.error is None and r.warm_runs_ms}
    out = []
    for mode in modes:
        if mode == base:
            continue
        per_row, static = [], []
        for (number, m), r in ok.items():
            b = ok.get((number, base))
            if m != mode or b is None:
                continue
            ratio = paired_ratio(r.warm_runs_ms, b.warm_runs_ms)
            if ratio is None:
                continue
            per_row.append(ratio)
            if r.reused_tokens <= b.reused_tokens:
                static.append(ratio)
        if per_row:  # (results saved before modes ran side by side have no pairs)
            out.append(PairedFigure(mode, base, statistics.median(per_row), len(per_row),
                                    statistics.median(static) if static else None,
                                    len(static)))
    return out
