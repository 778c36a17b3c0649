"""A benchmark's results written to a file, as CSV (one line per row and reuse mode) or JSON
(rows, summary and the prefix sweep): the window's Export and `kvprimer bench --csv /
--json-out` write the same columns.

The CSV's columns are BenchRow's fields in their order; a field holding a list or a record
(``reused_by_source``, ``breakdown``) is one cell of JSON text, so that a spreadsheet keeps one
line per row.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import fields
from pathlib import Path

from ..errors import KvPrimerError
from ..user_files import atomic_write
from .bench_rows import BenchResult, BenchRow
from .prefix_sweep import SweepPoint

CSV_COLUMNS = tuple(f.name for f in fields(BenchRow))


def results_dict(bench: BenchResult | None, sweep: list[SweepPoint] | tuple = ()) -> dict:
    """The JSON of a benchmark (BenchResult.as_dict), with the sweep's points when there are."""
    data = bench.as_dict() if bench is not None else {}
    if sweep:
        data["sweep"] = [p.as_dict() for p in sweep]
    return data


def results_csv(bench: BenchResult) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in bench.as_dict()["rows"]:
        w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v
                    for k, v in row.items() if k in CSV_COLUMNS})
    return out.getvalue()


def write_results(path: str | os.PathLike, bench: BenchResult | None,
                  sweep: list[SweepPoint] | tuple = (), fmt: str | None = None) -> None:
    """Write the results to ``path``: JSON for ``fmt`` "json" (or a .json path), else CSV,
    which holds the benchmark's rows only."""
    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "csv")
    if fmt == "json":
        if bench is None and not sweep:
            raise KvPrimerError("nothing to export yet; run a benchmark or a sweep first")
        text = json.dumps(results_dict(bench, sweep), indent=2) + "\n"
    else:
        if bench is None:
            raise KvPrimerError("no benchmark to export as CSV yet; run a benchmark first (a "
                                "sweep alone exports as JSON)")
        text = results_csv(bench)
    atomic_write(path, [text.encode("utf-8")], KvPrimerError, "result")
