"""Sizes for people, one way across the window: decimal units (kB, MB, GB)."""
from __future__ import annotations


def size_text(n: float) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
