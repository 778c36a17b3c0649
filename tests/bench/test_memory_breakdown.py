"""bench/memory_breakdown.py's report names peak RSS after the run with the RAM tier's bytes
apart, as the scale section's RSS goal counts them."""
from __future__ import annotations

from bench.memory_breakdown import report


def _tiers(ram: int) -> list[dict]:
    return [{"name": "resident", "used_bytes": 5_000_000}, {"name": "ram", "used_bytes": ram},
            {"name": "file", "used_bytes": 9_000_000}]


def test_the_report_gives_peak_rss_less_the_ram_tier():
    step = {"VmRSS": 390_000_000, "VmHWM": 397_000_000, "RssAnon": 270_000_000,
            "RssFile": 120_000_000}
    b = {"model": "m", "n_ctx": 2560, "prefix_tokens": 2055, "prompt_tokens": 2075,
         "flash_attn": False, "verdicts": ["bit-identical"], "load_ms": 20.0,
         "steps": [("prime", step), ("run (warm + cold)", step)],
         "parts": {"model_file": 97_000_000, "state_bytes_held_by_caller": 47_000_000,
                   "contexts": [{"name": "cache", "cells": 2560, "kv": 59_000_000,
                                 "compute": 42_000_000, "opened": False}],
                   # the least the tier held: a run could have peaked before it stored more
                   "tiers_after_prime": _tiers(47_000_000), "tiers_after_run": _tiers(60_000_000)}}
    text = report(b)
    assert "peak RSS after the run 397 MB: 350 MB less the RAM tier's 47 MB" in text
    assert "cache context: 2560 cells, KV 59 MB, compute+output 42 MB (never opened" in text
