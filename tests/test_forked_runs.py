"""Forked batch runs on the tiny model: one prefix, k rows decoded together."""
import pytest

from app.engine import Engine, EngineConfig, GenerationConfig, KvPrimerError, Template
from app.engine.forked_runs import compare_with_sequential, run_forked

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 12
                     + "\n<c1>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
ROWS = [{"c1": "the world is a question", "question": "hello?"},
        {"c1": "a", "question": "world and the answer of hello?"},
        {"c1": "question answer", "question": "to be or not"}]
GEN = GenerationConfig(max_tokens=8)


@pytest.fixture
def wide(tiny_model):
    """n_batch 128: the three suffixes fit one decode."""
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=128, n_threads=1))
    yield eng
    eng.close()


def test_forked_batch_gives_the_tokens_of_one_by_one_warm_runs(wide):
    state = wide.prime(TPL)
    batch = run_forked(wide, TPL, ROWS, state=state, gen=GEN)
    assert batch.prompt_decodes == 1  # all three suffixes in one llama_decode
    assert batch.gen_decodes <= GEN.max_tokens - 1
    assert [len(r.tokens) for r in batch.rows] == [GEN.max_tokens] * 3
    assert batch.evaluated_tokens == sum(r.prompt_tokens - r.reused_tokens for r in batch.rows)
    # while the rows run, every row shares the prefix cells with sequence 0
    v = wide.kv_view()
    assert v.source == "debug-log"
    assert v.seq(0).cells == state.n_tokens
    for r in batch.rows:
        u = v.seq(r.seq)
        assert u.shared_cells == r.reused_tokens
        assert u.cells == r.prompt_tokens + len(r.tokens) - 1  # the last token is not evaluated
    assert v.used_cells == state.n_tokens + sum(r.evaluated_tokens + len(r.tokens) - 1
                                                for r in batch.rows)
    cmp = compare_with_sequential(wide, TPL, ROWS, batch, state, GEN)
    assert [c.tokens_equal for c in cmp] == [True] * 3, cmp
    assert all(c.forked_tokens == tuple(r.tokens) for c, r in zip(cmp, batch.rows))
    # the batch holds more tokens than one row: llama.cpp's numerics may move a little (reported)
    assert all(c.max_logit_diff >= 0 for c in cmp)


def test_forked_run_keeps_resident_and_reuses_the_prefix(wide):
    state = wide.prime(TPL)
    batch = run_forked(wide, TPL, ROWS[:2], state=state, gen=GEN)
    for r in batch.rows:
        toks = wide.tokenize(TPL.fill(ROWS[r.index]))
        assert wide.resident[r.seq] == toks + r.tokens[:-1]
        assert wide.ctx.pos_range(r.seq) == (0, len(toks) + len(r.tokens) - 2)
    assert wide.resident[0] == list(state.tokens)
    again = run_forked(wide, TPL, ROWS[:2], state=state, gen=GEN)  # same prefix: no restore
    assert [r.tokens for r in again.rows] == [r.tokens for r in batch.rows]


def test_too_many_rows_for_the_sequences_is_refused(engine):
    with pytest.raises(KvPrimerError, match="at most 7 rows"):
        run_forked(engine, TPL, ROWS * 3)
