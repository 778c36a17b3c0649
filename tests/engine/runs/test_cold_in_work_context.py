"""Cold runs evaluate in the work context, after the warm run: no third context is opened or
held, a cold run gives the bits a context of its own gives, and the work context keeps what a
warm run left when the cold run computed that same history (and holds nothing otherwise)."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import Engine, EngineConfig, run_prompt
from app.engine.llama import native
from app.engine.llama.batch_feed import feed_batches, feed_token
from app.engine.llama.native import NativeContext
from app.engine.runs.cold_reference import ColdReference
from app.engine.runs.generation import generate

from tests.cold_runs import GEN, TPL, VALS


@pytest.fixture
def opened(monkeypatch):
    """Every NativeContext opened from here on."""
    seen: list[NativeContext] = []
    real = NativeContext.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        seen.append(self)

    monkeypatch.setattr(native.NativeContext, "__init__", spy)
    return seen


def _own_context_run(engine, tokens, marks, max_new):
    """The cold run as a context of its own makes it: the same parameters, fresh."""
    ctx = NativeContext(engine.model, engine.context_params(2))
    try:
        if marks is None:
            feed_batches(ctx.decode, tokens[:1], 0, [0], seq=1, want_logits=False)
        feed_batches(ctx.decode, tokens, 0, engine.batching.replay(len(tokens), marks))
        pos = [len(tokens)]

        def step(tok):
            feed_token(ctx.decode, tok, pos[0])
            pos[0] += 1

        return generate(ctx, engine.model, step, GEN, GEN.max_tokens, None, "cold", 4)
    finally:
        ctx.close()


@pytest.mark.parametrize("fa", ["on", "off"])
def test_a_run_opens_no_context_besides_the_cache_and_the_work_context(tiny_model, opened, fa):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn=fa)) as e:
        assert [c.name for c in e.info.memory.contexts] == ["cache", "work"]
        work = e.work.ctx  # opened when a run needs it
        opened.clear()
        for reuse in ("prefix", "chain"):
            rep = run_prompt(e, TPL, VALS, reuse=reuse, gen=GEN, oneshot=True)
            assert rep.verdict.exact and rep.oneshot is not None
        assert opened == []  # no context for the cold and noise runs: they ran in the work one
        assert e.cold.context is work is e.work.ctx


@pytest.mark.parametrize("oneshot", [False, True])
def test_a_cold_run_gives_the_bits_of_a_context_of_its_own(engine, oneshot):
    rep = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, oneshot=oneshot)
    tokens = engine.tokenize(TPL.fill(VALS))
    own = _own_context_run(engine, tokens, rep.plan, GEN.max_tokens)
    assert rep.cold.tokens == own.tokens
    assert all(np.array_equal(a, b) for a, b in zip(rep.cold.logits, own.logits))
    if oneshot:
        noise = _own_context_run(engine, tokens, None, GEN.max_tokens)
        assert rep.oneshot.tokens == noise.tokens
        assert all(np.array_equal(a, b) for a, b in zip(rep.oneshot.logits, noise.logits))


def test_the_work_context_keeps_the_warm_history_after_its_same_boundary_cold_run(engine):
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False)
    after_warm = (list(engine.work.tokens), list(engine.work.cuts))
    rep = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, oneshot=False)
    assert rep.verdict.exact and not rep.cold_kept
    # the cold run computed the history the warm run left: it stays, for the next run to keep
    assert (engine.work.tokens, engine.work.cuts) == after_warm
    again = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False)
    assert again.copied_tokens == 0  # kept in place, as after a warm run


def test_the_work_context_is_emptied_after_a_noise_run_or_another_history(engine):
    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, oneshot=True)
    assert engine.work.tokens == []  # the noise run's cells are one cell further on
    tokens = engine.tokenize(TPL.fill(VALS))
    engine.cold.run(tokens[:-3], [], GEN, 2, None, "cold", 1)  # another history
    assert engine.work.tokens == []
    rep = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN)
    assert rep.verdict.exact


def test_a_cancelled_cold_run_leaves_the_work_context_empty(engine):
    from app.engine.task_state import Cancelled, TaskState

    run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False)
    task = TaskState()
    task.cancel()
    tokens = engine.tokenize(TPL.fill(VALS))
    with pytest.raises(Cancelled):
        engine.cold.run(tokens, None, GEN, 2, task, "cold", 1)
    assert engine.work.tokens == [] and engine.work.cuts == []
    assert isinstance(engine.cold, ColdReference)
