"""The engine on a tiny random-weight model: real llama.cpp calls, milliseconds each."""
import numpy as np
import pytest

from app.engine import (Cancelled, ContextOverflowError, Engine, EngineConfig, GenerationConfig,
                        PrefixState, StateFileError, TaskState, Template, run_prompt)

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 12
                     + "\n<c1>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
VALUES = {"c1": "the world is a question", "question": "hello?"}


def test_template_text_tokenizes_like_llama_parse_special(engine):
    tpl = Template.parse("<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n")
    ours = engine.tokenize(tpl.fill({}))
    theirs = engine.model.tokenize(tpl.source, add_special=True, parse_special=True)
    assert ours == theirs


def test_special_token_text_in_a_value_stays_plain(engine):
    im_end = engine.model.tokenize("<|im_end|>", parse_special=True)
    assert len(im_end) == 1
    tpl = Template.parse("<|im_end|> <v>")
    toks = engine.tokenize(tpl.fill({"v": "<|im_end|>"}))
    assert toks.count(im_end[0]) == 1  # only the template's own
    assert len(toks) > 3


def test_whole_prompt_tokenization_differs_from_pieces_at_the_boundary(engine):
    # "he" + "llo" merge across the boundary when tokenized together
    tpl = Template.parse("say he<v>")
    whole = engine.tokenize(tpl.fill({"v": "llo"}))
    pieces = engine.tokenize(tpl.prefix_prompt()) + engine.model.tokenize("llo")
    assert whole != pieces
    assert whole == engine.model.tokenize("say hello", add_special=True)


def test_warm_equals_cold_bit_for_bit(engine):
    rep = run_prompt(engine, TPL, VALUES, gen=GenerationConfig(max_tokens=8), oneshot=True)
    assert rep.reused_tokens > 400 and rep.evaluated_tokens < 60
    assert rep.reused_tokens + rep.evaluated_tokens == rep.prompt_tokens
    assert rep.warm.evaluated_tokens == rep.evaluated_tokens
    assert rep.cold.evaluated_tokens == rep.prompt_tokens
    eq = rep.verdict
    assert eq.tokens_equal and eq.max_logit_diff == 0.0 and eq.exact
    assert eq.equivalence == "bit-identical" and eq.first_diff is None
    assert rep.cold.tokens == rep.warm.tokens and len(rep.warm.tokens) >= 1
    # the one-shot cold run (asked for here) measured the model's own batch-grouping noise
    assert rep.oneshot is not None and rep.oneshot.tokens
    assert eq.noise_max_logit_diff is not None and eq.noise_kl_divergence is not None


def test_second_run_reuses_the_stored_prefix(engine):
    first = run_prompt(engine, TPL, VALUES, reuse="prefix", oneshot=False)
    nodes = list(engine.cache.tree)
    assert len(nodes) == 1 and nodes[0].label == "static prefix"
    rep = run_prompt(engine, TPL, {**VALUES, "question": "world?"}, reuse="prefix", oneshot=False)
    assert list(engine.cache.tree) == nodes and rep.verdict.exact
    assert rep.reused_tokens == first.reused_tokens == nodes[0].depth
    assert nodes[0].hits >= 2


def test_state_size_is_the_raw_kv_plus_little(engine):
    state = engine.prime(TPL)
    raw = state.n_tokens * engine.info.kv_bytes_per_token
    assert raw <= len(state.data) <= raw + 64 * 1024


def test_file_round_trip_into_a_fresh_engine(engine, tiny_model, tmp_path):
    state = engine.prime(TPL)
    path = tmp_path / "p.kvstate"
    state.save(path)
    cold = run_prompt(engine, TPL, VALUES, warm=False, oneshot=False)
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1)) as fresh:
        loaded = fresh.load_state(path)
        rep = run_prompt(fresh, TPL, VALUES, state=loaded, cold=False, oneshot=False)
    assert rep.warm.tokens == cold.cold.tokens
    assert np.array_equal(rep.warm.first_logits, cold.cold.first_logits)


def test_state_from_another_model_is_refused_and_context_kept(engine, other_tiny_model, tmp_path):
    with Engine(EngineConfig(model_path=str(other_tiny_model), n_ctx=1024, n_batch=32, n_threads=1)) as other:
        other.prime(TPL).save(tmp_path / "other.kvstate")
    engine.prime(TPL)
    before = (list(engine.seq_tokens[0]), engine.ctx.pos_range(0))
    with pytest.raises(StateFileError, match="another model"):
        engine.load_state(tmp_path / "other.kvstate")
    assert (engine.seq_tokens[0], engine.ctx.pos_range(0)) == before


def test_kv_type_mismatch_is_refused(engine, tiny_model, tmp_path):
    engine.prime(TPL).save(tmp_path / "f16.kvstate")
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             type_k="q8_0", type_v="q8_0")) as q8:
        with pytest.raises(StateFileError, match="KV types f16/f16"):
            q8.load_state(tmp_path / "f16.kvstate")


def test_rejected_kv_data_leaves_sequence_empty_not_corrupt(engine):
    good = engine.prime(TPL)
    bad = PrefixState(tokens=good.tokens, data=good.data[: len(good.data) // 2],
                      model_sha256=good.model_sha256, model_name="x", type_k="f16", type_v="f16",
                      seq_state_version=good.seq_state_version)
    with pytest.raises(StateFileError, match="rejected"):
        engine.restore(bad, 0)
    assert engine.seq_tokens[0] == [] and engine.ctx.pos_range(0) == (-1, -1)
    assert run_prompt(engine, TPL, VALUES, oneshot=False).verdict.exact


def test_cancel_prime_between_batches_leaves_a_known_length(engine):
    seen = []
    task = TaskState(on_progress=lambda p: (seen.append(p.done), p.done >= 32 and task.cancel()))
    with pytest.raises(Cancelled) as e:
        engine.prime(TPL, task=task)
    kept = e.value.kept_tokens
    assert kept == 32
    # the half-primed working sequence was given back: no cells, no node left behind
    assert len(engine.cache.tree) == 0 and engine.seqs.used_cells() == 0
    assert all(not toks for toks in engine.seq_tokens.values())
    assert all(engine.ctx.pos_range(s) == (-1, -1) for s in range(engine.config.n_seq_max))
    state = engine.prime(TPL)  # the next job works
    assert state.n_tokens > kept


def test_prompt_longer_than_context_is_refused_before_evaluation(tiny_model):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=32, n_threads=1)) as small:
        n = len(small.tokenize(TPL.fill(VALUES)))
        with pytest.raises(ContextOverflowError,
                           match=f"prompt has {n} tokens but the context holds {small.ctx.n_ctx}"):
            run_prompt(small, TPL, VALUES)
        assert small.ctx.pos_range(0) == (-1, -1)


def test_sampling_with_seed_is_reproducible_and_warm_matches_cold(engine):
    gen = GenerationConfig(max_tokens=12, temperature=0.9, top_p=0.95, seed=42)
    a = run_prompt(engine, TPL, VALUES, gen=gen, oneshot=False)
    b = run_prompt(engine, TPL, VALUES, gen=gen, oneshot=False)
    # sampling draws from the logits: the same bits and the same seed, the same tokens
    assert a.verdict.exact and a.warm.tokens == b.warm.tokens == a.cold.tokens


def test_progress_is_reported_per_batch(engine):
    seen = []
    engine.prime(TPL, task=TaskState(on_progress=seen.append))
    prime = [p for p in seen if p.stage == "prime"]
    assert prime[0].done == 0 and prime[-1].done == prime[-1].total
    assert len(prime) == 1 + -(-prime[-1].total // 32)


def test_the_batch_plan_is_a_value_the_caller_holds(engine):
    # the plan a node or a cold run records is the one evaluate used: made before, passed in
    engine.seqs.clear(3)
    engine.evaluate([5] * 10, 3, want_logits=False)
    plan = engine.batch_plan(3, 40, chunk=16, marks=[30])
    assert plan == [10, 26, 30, 46]
    seen: list[int] = []
    engine.evaluate([7] * 40, 3, want_logits=False, starts=plan, marks=[30, 50], at_mark=seen.append)
    assert seen == [30, 50] and len(engine.seq_tokens[3]) == 50
    with pytest.raises(ValueError):  # a plan that does not start where the sequence ends
        engine.evaluate([7] * 4, 3, starts=[0])
    with pytest.raises(ValueError):  # a mark where no batch starts would never be called
        engine.evaluate([7] * 4, 3, starts=[50], marks=[52], at_mark=seen.append)
    assert len(engine.seq_tokens[3]) == 50 and not hasattr(engine, "last_starts")
    engine.seqs.clear(3)
