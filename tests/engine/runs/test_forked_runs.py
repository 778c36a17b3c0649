"""Forked batch runs on the tiny model: one prefix, k rows decoded together."""
import pytest

from app.engine import (Engine, EngineConfig, GenerationConfig, KvPrimerError, TaskState,
                        Template)
from app.engine.runs.forked_runs import SMALL_UBATCH, compare_with_sequential, run_forked

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 12
                     + "\n<c1>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
ROWS = [{"c1": "the world is a question", "question": "hello?"},
        {"c1": "a", "question": "world and the answer of hello?"},
        {"c1": "question answer", "question": "to be or not"}]
# suffixes of 64 tokens or more (SMALL_UBATCH): they can share one decode exactly
LONG = [{"c1": "the answer of the world is in the context; " + f"row {i}", "question": q}
        for i, q in enumerate(["hello, world?", "is the world a question?", "and you?"])]
GEN = GenerationConfig(max_tokens=8)


@pytest.fixture
def wide(tiny_model):
    """n_batch 256: the three long suffixes fit one decode."""
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=256, n_threads=1))
    yield eng
    eng.close()


def test_forked_batch_gives_the_tokens_of_one_by_one_warm_runs(wide):
    state = wide.prime(TPL)
    node = wide.cache.lookup(list(state.tokens)).node
    views = []

    def look(p):  # once every suffix is in, before generation
        if p.stage == "fork" and p.done == p.total:
            views.append(wide.kv_view())

    batch = run_forked(wide, TPL, LONG, state=state, gen=GEN, task=TaskState(on_progress=look))
    assert all(r.evaluated_tokens >= SMALL_UBATCH for r in batch.rows)
    # exact: every decode stays under SMALL_UBATCH tokens, several decodes for the suffixes
    assert batch.prompt_decodes >= -(-sum(r.evaluated_tokens for r in batch.rows) // (SMALL_UBATCH - 1))
    # one decode per step for all rows (a row that ends early drops out)
    assert batch.gen_decodes == max(len(r.tokens) for r in batch.rows) - 1
    # while the rows run, every row shares the prefix cells with the prefix's cache node
    (v,) = views
    assert v.source == "debug-log"
    assert v.seq(node.seq).cells == state.n_tokens
    for r in batch.rows:
        u = v.seq(r.seq)
        assert u.shared_cells == r.reused_tokens
        assert u.cells == r.prompt_tokens
    assert v.used_cells == state.n_tokens + sum(r.evaluated_tokens for r in batch.rows)
    cmp = compare_with_sequential(wide, TPL, LONG, batch, state, GEN)
    assert [c.tokens_equal for c in cmp] == [True] * 3
    assert [c.forked_tokens for c in cmp] == [tuple(r.tokens) for r in batch.rows]
    # the one-by-one runs evaluate in the work context, cells where a cold run puts them; the
    # forked rows share one context, so their logits may differ in the last bits: measured
    assert all(0.0 <= c.max_logit_diff < 0.5 for c in cmp), [c.max_logit_diff for c in cmp]
    # packed into as few decodes as n_batch allows: one decode of 64 tokens or more, where
    # llama.cpp's numerics depend on batch grouping and where the cells lie
    loose = run_forked(wide, TPL, LONG, state=state, gen=GEN, exact=False)
    assert loose.prompt_decodes == 1
    cmp = compare_with_sequential(wide, TPL, LONG, loose, state, GEN)
    assert all(0.0 < c.max_logit_diff < 1.0 for c in cmp)  # reported; the tiny model's tokens hold


def test_short_suffixes_stay_below_the_small_ubatch_size_unless_told(wide):
    state = wide.prime(TPL)
    sizes = []
    wide.add_kv_listener(lambda v: sizes.append(v.used_cells), min_interval_s=0.0)
    batch = run_forked(wide, TPL, ROWS, state=state, gen=GEN)
    suffix = [r.evaluated_tokens for r in batch.rows]
    assert max(suffix) < SMALL_UBATCH < sum(suffix)
    steps = [b - a for a, b in zip(sizes, sizes[1:])][:batch.prompt_decodes]
    assert batch.prompt_decodes >= 2 and all(n < SMALL_UBATCH for n in steps)
    cmp = compare_with_sequential(wide, TPL, ROWS, batch, state, GEN)
    # the same tokens; the logits differ at most in the last bits (one shared context: cell
    # placement changes the arithmetic, see forked_runs.py)
    assert [c.tokens_equal for c in cmp] == [True] * 3
    assert all(0.0 <= c.max_logit_diff < 0.5 for c in cmp), [c.max_logit_diff for c in cmp]
    loose = run_forked(wide, TPL, ROWS, state=state, gen=GEN, exact=False)
    assert loose.prompt_decodes == 1
    cmp = compare_with_sequential(wide, TPL, ROWS, loose, state, GEN)
    assert all(c.max_logit_diff < 1.0 for c in cmp)  # reported; the tiny model's tokens hold


def test_forked_run_gives_its_sequences_back_and_reuses_the_prefix(wide):
    state = wide.prime(TPL)
    node = wide.cache.lookup(list(state.tokens)).node
    batch = run_forked(wide, TPL, ROWS[:2], state=state, gen=GEN)
    for r in batch.rows:
        toks = wide.tokenize(TPL.fill(ROWS[r.index]))
        assert r.prompt_tokens == len(toks) and r.reused_tokens == state.n_tokens
        assert wide.seq_tokens[r.seq] == [] and wide.ctx.pos_range(r.seq) == (-1, -1)
    # only the prefix's node stays resident, holding exactly the prefix
    assert [n for n in wide.cache.tree] == [node]
    assert wide.seq_tokens[node.seq] == list(state.tokens)
    assert wide.seqs.used_cells() == state.n_tokens
    hits = node.hits
    again = run_forked(wide, TPL, ROWS[:2], state=state, gen=GEN)  # same prefix: no restore
    assert [n for n in wide.cache.tree] == [node] and node.hits == hits + 1
    assert [r.tokens for r in again.rows] == [r.tokens for r in batch.rows]


def test_too_many_rows_for_the_sequences_is_refused(engine):
    cap = engine.config.n_seq_max // 2
    with pytest.raises(KvPrimerError, match=f"at most {cap} rows"):
        run_forked(engine, TPL, (ROWS * cap)[:cap + 1])


@pytest.mark.parametrize("exact", [True, False])
def test_long_suffixes_run_with_an_n_batch_under_the_small_ubatch_size(engine, exact):
    """n_batch 32: each long suffix is cut in pieces of 32 at most, as its one-by-one run in the
    shared context is, and the rows give their one-by-one runs' tokens."""
    batch = run_forked(engine, TPL, LONG, gen=GEN, exact=exact)
    assert all(r.evaluated_tokens > engine.config.n_batch for r in batch.rows)
    cmp = compare_with_sequential(engine, TPL, LONG, batch, None, GEN)
    assert [c.tokens_equal for c in cmp] == [True] * 3
