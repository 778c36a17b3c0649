"""Cancel anywhere: at every progress report and every streamed token of prime, run (cold, warm,
one-shot, generation) and bench. Afterwards every sequence holds exactly the tokens the engine
says it holds (llama.cpp's position range agrees), and the next job gives exact results."""
from __future__ import annotations

import pytest

from app.engine import (Cancelled, GenerationConfig, TaskState, Template, bench_rows, run_prompt)
from app.engine.runs.prompt_runs import TextDelta
from app.engine.prompts.rows import Row
from tests.cache_checks import assert_sequences_consistent, assert_tree_consistent

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
VALUES = {"c": "the world is a question " * 3, "q": "hello?"}
GEN = GenerationConfig(max_tokens=4)


def assert_consistent(eng) -> None:
    assert_tree_consistent(eng)


def cancelling_at(k: int, on_tokens: bool = False) -> TaskState:
    """A task that cancels itself at its k-th progress report (or k-th streamed text)."""
    seen = [0]

    def tick(_):
        seen[0] += 1
        if seen[0] == k:
            task.cancel()

    task = TaskState(on_progress=None if on_tokens else tick,
                     on_partial=(lambda r: isinstance(r, TextDelta) and tick(r)) if on_tokens else None)
    return task


def cancel_everywhere(eng, job, on_tokens=False, limit=200) -> int:
    """Run ``job(task)`` cancelling at point 1, 2, ... until it completes; returns the count."""
    for k in range(1, limit):
        try:
            job(cancelling_at(k, on_tokens))
        except Cancelled:
            assert_consistent(eng)
            continue
        assert_consistent(eng)
        return k - 1
    raise AssertionError("the job never completed")


@pytest.fixture
def reference(engine):
    rep = run_prompt(engine, TPL, VALUES, gen=GEN)
    assert rep.verdict.exact
    engine.cache.clear()
    return rep


def check_next_job(eng, reference) -> None:
    rep = run_prompt(eng, TPL, VALUES, gen=GEN)
    assert rep.verdict.exact
    assert rep.warm.tokens == reference.warm.tokens
    assert_consistent(eng)


def test_cancel_prime_anywhere(engine, reference):
    n = cancel_everywhere(engine, lambda task: engine.prime(TPL, task=task))
    assert n >= 3  # the prefix takes several batches of 32
    check_next_job(engine, reference)


@pytest.mark.parametrize("paths", [dict(), dict(cold=False, oneshot=False),
                                   dict(warm=False, oneshot=False)])
def test_cancel_run_anywhere(engine, reference, paths):
    n = cancel_everywhere(engine, lambda task: run_prompt(engine, TPL, VALUES, gen=GEN, task=task,
                                                          **paths))
    assert n >= 3
    check_next_job(engine, reference)


def test_cancel_during_generation(engine, reference):
    gen = GenerationConfig(max_tokens=12)
    n = cancel_everywhere(engine, lambda task: run_prompt(engine, TPL, VALUES, gen=gen, task=task),
                          on_tokens=True)
    assert n >= 1
    check_next_job(engine, reference)


def test_cancel_with_a_saved_state_restored_into_other_sequences(engine, reference):
    state = engine.prime(TPL)
    engine.cache.clear()  # the state is restored into the cache by the run itself
    # the user's sequence holds something else that a cancel must not disturb
    engine.evaluate(engine.model.tokenize("hello world of the answer"), 0, want_logits=False)
    before0 = list(engine.seq_tokens[0])
    cancel_everywhere(engine, lambda task: run_prompt(engine, TPL, VALUES, state=state, gen=GEN,
                                                      task=task))
    assert engine.seq_tokens[0] == before0
    check_next_job(engine, reference)


def test_cancel_bench_anywhere(engine, reference):
    rows = [Row(2, VALUES), Row(3, {**VALUES, "q": "why?"})]
    for k in range(1, 400, 5):  # every fifth point: the job has a hundred
        try:
            res = bench_rows(engine, TPL, rows, gen=GEN, task=cancelling_at(k))
        except Cancelled:  # while priming the prefix, before any row
            assert_consistent(engine)
            continue
        assert_consistent(engine)
        if not res.cancelled:
            assert all(r.error is None and r.tokens_equal for r in res.rows)
            break
        assert len(res.rows) < len(rows) or res.rows[-1].error is None
    else:
        raise AssertionError("bench never completed")
    assert k > 3
    check_next_job(engine, reference)


def test_kv_cache_full_mid_prompt_leaves_a_known_length(tiny_model):
    # check_fits looks at one sequence; other sequences can still fill the cache, and then a
    # decode fails part-way through the prompt.
    from app.engine import Engine, EngineConfig
    from app.engine.errors import ContextError

    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=32, n_threads=1,
                             n_seq_max=6)) as eng:
        toks = eng.model.tokenize("hello world of the answer and question " * 12)
        eng.evaluate(toks[:200], 1, want_logits=False)
        with pytest.raises(ContextError, match="KV cache is full"):
            eng.evaluate(toks[:120], 0)
        assert_sequences_consistent(eng)
        assert 0 < len(eng.seq_tokens[0]) < 120 and eng.seq_tokens[1] == toks[:200]
        eng.seqs.clear(1)
        eng.evaluate(toks[len(eng.seq_tokens[0]):120], 0)  # the rest fits now
        assert eng.seq_tokens[0] == toks[:120]
        assert_sequences_consistent(eng)
