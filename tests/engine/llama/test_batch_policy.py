"""Where batches start (app/engine/llama/batch_policy.py): each entry point on its own, and
that no other module computes a batch boundary or calls llama_decode outside the one loop."""
import ast
import random
from pathlib import Path

import pytest

from app.engine.llama.batch_policy import (EXACT_CHUNK, SMALL_UBATCH, BatchPolicy, batch_starts,
                                          batches, chain_marks, chain_node_ends, fork_marks,
                                          node_reuse, reusable_depths)
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
ENGINE = ROOT / "app" / "engine"
POLICY = ENGINE / "llama" / "batch_policy.py"


def test_plain_batches_are_n_batch_long_and_also_start_at_marks():
    p = BatchPolicy(32)
    assert p.plain(0, 70) == [0, 32, 64]
    assert p.plain(5, 70, marks=[20, 90, 3]) == [5, 20, 52]  # marks outside the span ignored
    assert p.plain(7, 7) == []


def test_chunked_is_capped_by_n_batch():
    assert BatchPolicy(16).chunked(0, 40, chunk=100) == [0, 16, 32]
    assert BatchPolicy(256).chunked(10, 50, chunk=16, marks=[30]) == [10, 26, 30, 46]
    assert BatchPolicy(256).chunked(0, 300) == [0, 256]


def test_the_shared_context_evaluates_in_small_batches():
    p = BatchPolicy(256)
    assert p.exact_chunks(0, 130) == [0, 63, 126]
    assert BatchPolicy(20).exact_chunks(0, 50) == [0, 20, 40]  # n_batch still caps them
    assert p.warm(0, 130, [100], windowed=True) == [0, 63, 100]
    assert p.warm(0, 130, [100], windowed=True) == batch_starts(0, 130, EXACT_CHUNK, [100])
    assert p.warm(0, 300, [100], windowed=False) == [0, 100]
    assert p.module(4, 200, windowed=True) == [4, 67, 130, 193]
    assert p.module(4, 200, windowed=False) == [4]


def test_a_prefix_is_primed_plainly_unless_it_lands_among_other_cells():
    p = BatchPolicy(64)
    assert p.prime(0, 150, windowed=False, cache_empty=False) == [0, 64, 128]
    assert p.prime(0, 150, windowed=True, cache_empty=True) == [0, 64, 128]
    assert p.prime(10, 150, windowed=True, cache_empty=False) == [10, 73, 136]


def test_the_cold_reference_replays_the_warm_history_from_zero():
    p = BatchPolicy(50)
    assert p.replay(120, None) == [0, 50, 100]
    assert p.replay(120, []) == [0, 50, 100]
    assert p.replay(120, [30, 40]) == [0, 30, 40, 90]
    assert p.saved_state(120) == [0, 50, 100] and p.saved_state(0) == []


def test_a_composed_row_shares_one_reference():
    p = BatchPolicy(512)
    plan = p.composed_reference([0, 40, 80, 120], 100, 260, [100, 150, 170])
    # the prefix's own batches before it ends, then each segment in chunks under 64 tokens
    assert plan == [0, 40, 80, 100, 150, 170, 233]


def test_chain_cuts_at_segment_starts_only_when_it_stores_and_batches_matter():
    starts = [0, 12, 30, 55]
    assert chain_marks(starts, 12, storing=True, grouping_exact=False) == [30, 55]
    assert chain_marks(starts, 12, storing=False, grouping_exact=False) == []
    assert chain_marks(starts, 12, storing=True, grouping_exact=True) == []
    assert fork_marks(starts, 12, 80) == [30, 55, 80]


def test_chain_cuts_only_where_another_row_of_the_job_can_reuse():
    starts = [0, 12, 30, 55]
    # another row shares up to 40: the segment starting at 30 ends a node it can reuse whole
    assert chain_marks(starts, 12, storing=True, grouping_exact=False, reusable=40) == [30]
    assert chain_marks(starts, 12, storing=True, grouping_exact=False, reusable=55) == [30, 55]
    # rows that share only the static prefix (ends at 12): batched as prefix mode batches them
    assert chain_marks(starts, 12, storing=True, grouping_exact=False, reusable=12) == []
    assert chain_marks(starts, 12, storing=True, grouping_exact=False, reusable=0) == []
    # no rows known (a single run): every segment start, for later runs it cannot see
    assert chain_marks(starts, 12, storing=True, grouping_exact=False, reusable=None) == [30, 55]
    assert chain_marks(starts, 12, storing=True, grouping_exact=True, reusable=55) == []


def test_chain_stores_nodes_only_where_a_batch_ends():
    ends = [12, 30, 55, 80]
    assert chain_node_ends(ends, 12, 80, [30], grouping_exact=False) == [30, 80]
    assert chain_node_ends(ends, 12, 80, [], grouping_exact=False) == [80]
    assert chain_node_ends(ends, 12, 80, [], grouping_exact=True) == [30, 55, 80]
    assert chain_node_ends(ends, 30, 80, [30, 55], grouping_exact=False) == [55, 80]


def test_reusable_depths_are_what_another_prompt_shares():
    a, b, c = [1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9], [1, 2, 7]
    assert reusable_depths([a, b, c]) == [3, 3, 2]
    assert reusable_depths([a]) == [0] and reusable_depths([]) == []
    # a row that will not run shares nothing, and nothing with it counts
    assert reusable_depths([a, None, [1, 2, 3, 4, 8]]) == [4, 0, 4]
    # an identical prompt: up to the other's last token (a run evaluates one at least)
    assert reusable_depths([a, list(a)]) == [4, 4]
    # a prompt that is the start of another: the longer one can reuse all but its last token
    assert reusable_depths([[1, 2, 3], [1, 2, 3, 4]]) == [3, 2]


def test_reusable_depths_match_every_pair_compared():
    rng = random.Random(7)
    for _ in range(200):
        prompts = [[rng.randrange(3) for _ in range(rng.randrange(1, 7))]
                   for _ in range(rng.randrange(1, 7))]

        def shared(x, y):
            n = 0
            while n < min(len(x), len(y)) and x[n] == y[n]:
                n += 1
            return min(n, len(y) - 1)
        want = [max([shared(p, q) for j, q in enumerate(prompts) if j != i], default=0)
                for i, p in enumerate(prompts)]
        assert reusable_depths(prompts) == want, prompts


def test_fewer_marks_only_reduce_reuse_never_split_a_batch():
    """A node is reused in whole batches of its history, whatever marks made them: a segment
    end that was marked is reused up to it; one that was not, only up to an earlier batch
    boundary. Dropping marks can cost reuse, never make it inexact."""
    rng = random.Random(3)
    policy = BatchPolicy(16)
    for _ in range(300):
        end = rng.randrange(20, 90)
        starts = sorted(rng.sample(range(13, end), rng.randrange(0, 5)))
        kept = [s for s in starts if rng.random() < 0.5]
        full, fewer = policy.plain(0, end, starts), policy.plain(0, end, kept)
        for cuts in (full, fewer):
            reused = rng.randrange(1, end + 1)
            got = node_reuse(cuts, end, reused, grouping_exact=False)
            assert got in set(cuts) | {0, end} and got <= reused
        for s in starts:
            assert node_reuse(full, end, s, grouping_exact=False) == s
            got = node_reuse(fewer, end, s, grouping_exact=False)
            assert got == s if s in fewer else got < s


def test_a_node_is_reused_in_whole_batches_or_clear_of_a_lone_token():
    cuts = [0, 32, 64]
    assert node_reuse(cuts, 90, 70, grouping_exact=False) == 64
    assert node_reuse(cuts, 90, 90, grouping_exact=False) == 90  # its end is a batch end
    assert node_reuse(cuts, 90, 65, grouping_exact=True) == 64  # [64, 65) alone: one back
    assert node_reuse(cuts, 90, 70, grouping_exact=True) == 70


@pytest.mark.parametrize("exact", [True, False])
def test_forked_rows_are_cut_as_their_one_by_one_runs_and_packed_under_the_cap(exact):
    p = BatchPolicy(256)
    rows = [("a", 10, 150, [10, 100]), ("b", 10, 40, [10]), ("c", 10, 30, [10, 20])]
    groups = p.forked_decodes(rows, exact)
    pieces = [piece for g in groups for piece in g]
    for key, reused, end, marks in rows:
        mine = [(a, b) for k, a, b in pieces if k == key]
        assert mine == batches(batch_starts(reused, end, EXACT_CHUNK, marks), end)
    cap = SMALL_UBATCH - 1 if exact else 256
    assert all(sum(b - a for _k, a, b in g) <= cap for g in groups)
    # exact: a's pieces (63, 27, 50 tokens) do not fit two to a decode; b and c's all fit one
    assert len(groups) == (4 if exact else 1)


# ---- nobody else decides ----------------------------------------------------------------------

# modules that size a context or a kernel measurement's probes with n_batch: no run's batches
SIZING = {"llama/native.py", "llama/memory_budget.py", "llama/kernel_passes.py",
          "llama/kernel_measure.py"}
BOUNDARY_NAMES = {"n_batch", "EXACT_CHUNK", "SMALL_UBATCH"}
PRIMITIVES = {"batch_starts", "_pack"}


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def _boundary_arithmetic(src: Path) -> list[str]:
    """Arithmetic on n_batch or the chunk constants (operators, min/max, range), and imports
    of the raw batch-start primitives: a batch boundary computed here."""
    out = []
    for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("min", "max", "range")):
            if _names(node) & BOUNDARY_NAMES:
                out.append(f"{src.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & PRIMITIVES:
            out.append(f"{src.relative_to(ROOT)}:{node.lineno} imports a primitive")
    return out


def test_the_scan_sees_boundary_arithmetic(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from x import batch_starts\n"
                   "def f(e, n):\n    return list(range(0, n, e.config.n_batch))\n"
                   "def g(n):\n    return min(n, EXACT_CHUNK)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(_boundary_arithmetic(bad)) == 3
    finally:
        ROOT = saved


def test_no_other_module_computes_a_batch_boundary():
    offenders = [hit for src in sorted(ENGINE.rglob("*.py"))
                 if src != POLICY and str(src.relative_to(ENGINE)) not in SIZING
                 for hit in _boundary_arithmetic(src)]
    assert offenders == []


@pytest.mark.parametrize("exact", [True, False])
def test_forked_rows_fit_an_n_batch_under_the_small_ubatch_size(exact):
    """With n_batch under 64, a forked row is cut in n_batch pieces, as its one-by-one run in
    the shared context is, and no decode holds more than n_batch tokens."""
    p = BatchPolicy(32)
    groups = p.forked_decodes([("a", 10, 150, [10, 100]), ("b", 10, 40, [10])], exact)
    assert [(a, b) for g in groups for k, a, b in g if k == "a"] == batches(
        p.exact_chunks(10, 150, [10, 100]), 150)
    assert all(sum(b - a for _k, a, b in g) <= 32 for g in groups)
