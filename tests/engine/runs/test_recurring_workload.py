"""The recurring RAG workload: its script rewrites the shipped CSV exactly, the engine reads it,
and its passages recur with skewed (Zipf) popularity, so that rows repeat earlier rows' values."""
from __future__ import annotations

import importlib.util
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

from app.engine import Template, read_rows
from tests.paths import REPO_ROOT

EXAMPLES = REPO_ROOT / "resources" / "examples"
CSV_PATH = EXAMPLES / "rag-recurring.csv"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("make_rag_recurring", EXAMPLES / "make_rag_recurring.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows():
    template = Template.load(EXAMPLES / "rag.tmpl")
    return [r.values for r in read_rows(CSV_PATH, template.placeholders)]


def test_script_rewrites_the_committed_csv_byte_for_byte(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "OUTPUT", tmp_path / "rag-recurring.csv")
    script.main()
    assert (tmp_path / "rag-recurring.csv").read_bytes() == CSV_PATH.read_bytes()


def test_engine_reads_the_rows_the_script_made(script, rows):
    assert rows == script.make_rows()


def test_rows_draw_three_distinct_passages_from_the_pool(script, rows):
    pool = [passage for passage, _ in script.POOL]
    assert len(set(pool)) == len(pool) >= 12
    assert len(rows) >= 40
    for row in rows:
        passages = (row["c1"], row["c2"], row["c3"])
        assert len(set(passages)) == 3
        assert set(passages) <= set(pool)
        assert row["question"].strip()
    assert len({p for row in rows for p in (row["c1"], row["c2"], row["c3"])}) >= 12
    assert len({row["question"] for row in rows}) >= 0.8 * len(rows)
    assert len({tuple(row.values()) for row in rows}) == len(rows)


def test_popularity_is_skewed_and_values_recur(script, rows):
    pool = [passage for passage, _ in script.POOL]
    uses = Counter(p for row in rows for p in (row["c1"], row["c2"], row["c3"]))
    counts = [uses[p] for p in pool]
    assert max(counts) == counts[0]  # rank 1 is the most drawn
    assert max(counts) >= 3 * statistics.median(counts)
    repeats_c1, repeats_c1c2 = script.repeats(rows)
    assert repeats_c1 >= len(rows) // 2
    assert repeats_c1c2 >= len(rows) // 5


def test_first_draw_follows_zipf_weights(script):
    rng = random.Random(0)
    firsts = Counter(script.draw_passages(rng)[0] for _ in range(20000))
    # weight 1/k: rank 1 is drawn twice as often as rank 2 and four times as often as rank 4
    assert 1.8 < firsts[0] / firsts[1] < 2.2
    assert 3.5 < firsts[0] / firsts[3] < 4.5
