"""Sizes for people, one way everywhere (the CLI, the window, error messages): decimal units."""
from __future__ import annotations


def size_text(n: float) -> str:
    """"512 B", "40.7 MB", "2.4 GB"."""
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
