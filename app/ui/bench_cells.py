"""The Benchmark view's tables: their columns, each cell's words, and showing them in place.

A benchmark's rows (one per row and reuse mode) in the results table, each field in words
(``cell_text``; the load in the warning colour when a row was measured under load), and each
mode's accuracy; ``show_cells`` changes only the cells that differ, as a long benchmark shows its
table again after every row.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

# (BenchRow field, header, tooltip)
BENCH_COLUMNS = [
    ("row", "row", "The row's number in the rows table"),
    ("reuse", "reuse", "How the warm run reused the cache: prefix, chain or compose"),
    ("prefix_tokens", "prefix (tokens)", "Tokens in the template's static prefix"),
    ("reused_tokens", "reused (tokens)", "Tokens the warm run took from the radix cache"),
    ("evaluated_tokens", "evaluated (tokens)", "Tokens the warm run evaluated"),
    ("cold_ms", "cold (ms)", "Time to first token without the cache"),
    ("warm_ms", "warm (ms)", "Time to first token reusing the cache (median of the repeats)"),
    ("restore_ms", "fork (ms)", "Time to fork or compose the reused cells (median)"),
    ("speedup", "speedup (×)", "cold ÷ warm"),
    ("vs_prefix", "vs prefix (×)", "Warm time against prefix mode's on the same row, the two "
                                   "measured side by side (median over the repeats)"),
    ("load", "load", "Other programs' share of the cores while the row ran (its busiest half "
                     "second); a row above a quarter is measured under load: its times are less "
                     "sure. ↻: re-measured, the load changed between the row's side-by-side "
                     "runs"),
    ("equivalence", "verdict", "bit-identical; within-noise: same tokens, logits no further "
                               "from cold than the model's own batch-grouping noise; diverged"),
    ("tokens_equal", "same tokens", "The warm run generated exactly the cold run's tokens"),
    ("max_logit_diff", "max |Δlogit|", "Largest logit difference over the compared tokens; "
                                       "0 means bit-identical"),
    ("kl_divergence", "KL (nats)", "Largest next-token KL divergence, cold ‖ warm"),
    ("top1_agree", "top-1 agree", "Generated positions where warm and cold rank the same token "
                                  "first"),
    ("recompute_share", "recomputed", "Compose: the share of the modules' tokens evaluated "
                                      "again in context (the recompute setting)"),
    ("error", "error", "Why the row could not run"),
]
UNDER_LOAD_COLOR = "#b35c00"  # a row measured while other programs used the cores
ACCURACY_COLUMNS = ["mode", "rows", "bit-identical", "within-noise", "diverged", "same tokens",
                    "median KL (nats)", "max KL (nats)", "top-1 agree", "max |Δlogit|",
                    "recomputed", "median warm (ms)", "warm ÷ prefix"]


def cell_text(key: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if key in ("max_logit_diff", "kl_divergence"):
        return f"{value:.3g}"
    if key in ("top1_agree", "recompute_share"):
        return f"{value:.0%}"
    if key == "speedup":
        return f"×{value:.1f}"
    if key == "vs_prefix":
        return f"×{value:.2f}"
    if key == "load":
        return f"{value:.0%}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and key != "row":
        return f"{value:,}"
    return str(value)


def load_cell(r) -> "Cell":
    """The row's load, in the warning colour and said in words when it was measured under load
    or measured again (the load changed between its side-by-side runs)."""
    text = cell_text("load", r.load)
    again = r.load_words()
    if not r.under_load and not r.load_changed:
        return Cell(f"{text} ↻" if again else text, True, "", again)
    words = ("measured while other programs used over a quarter of the cores: its times "
             "are less sure" if r.under_load else "")
    return Cell(f"{text} busy" + (" ↻" if again else ""), True, UNDER_LOAD_COLOR,
                "; ".join(w for w in (words, again) if w))


@dataclass(frozen=True)
class Cell:
    text: str
    right: bool = False  # numbers: aligned right
    color: str = ""  # the text's colour (a verdict's), else the table's own
    tip: str = ""


def show_cells(table: QTableWidget, rows: list[list[Cell]], shown: list[list[Cell]]
               ) -> list[list[Cell]]:
    """Show ``rows`` in ``table``, which shows ``shown``: only the cells that differ change.
    Returns ``rows``, what the table now shows.

    A benchmark shows its table again after every row: making every item anew each time made
    the work grow with the square of the rows (48 rows × 3 modes: ~150,000 items), and with
    PySide6 6.11 and 6.12 every new item shown leaves a reference to None behind."""
    table.setRowCount(len(rows))
    for i, row in enumerate(rows):
        old = shown[i] if i < len(shown) else []
        for c, cell in enumerate(row):
            if c < len(old) and old[c] == cell:
                continue
            item = table.item(i, c)
            if item is None:
                item = QTableWidgetItem()
                table.setItem(i, c, item)
            item.setText(cell.text)
            item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter if cell.right
                                  else Qt.AlignLeft | Qt.AlignVCenter)
            item.setData(Qt.ForegroundRole, QColor(cell.color) if cell.color else None)
            item.setToolTip(cell.tip)
    return rows
