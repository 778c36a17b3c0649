"""Warm runs in the work context: cells where a cold run puts them, so every run is
bit-identical on either attention kernel and at every batch size, and the cache's cells are
copied only when the work context does not already hold them."""
from __future__ import annotations

import struct

import pytest

from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
from app.engine.llama.batch_policy import batch_end_at_or_before, shared_history
from tests.cache_checks import assert_tree_consistent

# a static prefix of ~250 tokens and values long enough that suffixes pass 64 tokens: the
# batch size from which flash attention's tiled path (cell placement matters) runs
TPL = Template.parse("<|im_start|>system\nanswer from the context.\n"
                     + "hello world of the answer and question. " * 6
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
A = "the world is a question of the answer. " * 3
B = "hello answer of the context and the world. " * 3
C = "a helpful assistant answers the question. " * 3
GEN = GenerationConfig(max_tokens=4)


@pytest.fixture(params=["on", "off"])
def engine128(request, tiny_model):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=128, n_threads=1,
                             flash_attn=request.param)) as eng:
        yield eng


def test_shared_history_stops_where_tokens_or_batches_differ():
    t = list(range(100))
    assert shared_history(t[:50], [0, 32], t, [0, 32, 50], 60) == 50  # a batch ended at 50 in both
    assert shared_history(t[:50], [0, 32], t, [0, 32, 64], 80) == 32  # b's batch went past 50
    assert shared_history(t[:50], [0, 20], t, [0, 32], 50) == 0  # other batches from the start
    assert shared_history(t[:40] + [7, 7], [0, 32], t, [0, 32], 60) == 32  # tokens differ at 40
    assert shared_history([], [], t, [0], 10) == 0
    assert batch_end_at_or_before([0, 32, 64], 90, 70) == 64
    assert batch_end_at_or_before([0, 32, 64], 90, 95) == 90
    assert batch_end_at_or_before([0, 32], 40, 10) == 0


def test_every_mode_is_bit_identical_on_either_kernel_with_big_batches(engine128):
    e = engine128
    first = run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", gen=GEN)
    assert first.evaluated_tokens > 64 and first.verdict.exact, first.verdict.describe()
    shared = run_prompt(e, TPL, {"c1": A, "c2": C, "question": "how?"}, reuse="chain", gen=GEN)
    assert shared.reused_tokens > first.prefix_tokens  # through <c1> = A
    assert shared.verdict.exact, shared.verdict.describe()
    prefix = run_prompt(e, TPL, {"c1": C, "c2": A, "question": "when?"}, reuse="prefix", gen=GEN)
    assert prefix.reused_tokens == prefix.prefix_tokens and prefix.verdict.exact
    # every module recomputed in context but <c1>, whose cells were made where the row puts
    # them (in a batch of its own, as the cold run replays it): a chain run by another road
    whole = run_prompt(e, TPL, {"c1": B, "c2": C, "question": "where?"}, reuse="compose",
                       recompute=10_000, gen=GEN)
    n1 = whole.recompute.in_place
    assert n1 > 64  # a big batch: the kernels' grouped path
    assert whole.reused_tokens == whole.prefix_tokens + n1 and whole.verdict.exact
    assert_tree_consistent(e)


def test_the_prefix_is_copied_only_when_the_work_context_lost_it(engine128):
    e = engine128
    vals = [{"c1": A, "c2": B, "question": f"why {i}?"} for i in range(3)]
    run_prompt(e, TPL, vals[0], reuse="prefix", gen=GEN)
    kept = run_prompt(e, TPL, vals[1], reuse="prefix", gen=GEN, cold=False, oneshot=False)
    assert kept.copied_tokens == 0  # the previous row's prefix stayed in place
    e.work.reset()
    copied = run_prompt(e, TPL, vals[2], reuse="prefix", gen=GEN)
    assert copied.copied_tokens == copied.reused_tokens == copied.prefix_tokens
    assert copied.verdict.exact, copied.verdict.describe()
    assert e.work.tokens[:copied.prompt_tokens] == e.tokenize(TPL.fill(vals[2]))


def test_composed_modules_are_measured_against_their_cold_run(engine128):
    e = engine128
    run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="compose", gen=GEN)
    rep = run_prompt(e, TPL, {"c1": B, "c2": A, "question": "why?"}, reuse="compose", gen=GEN)
    # <c2> = A was evaluated after the prefix alone, not after <c1> = B: a real difference
    assert rep.verdict.max_logit_diff > 0 and not rep.verdict.exact
    assert rep.reused_tokens > rep.prefix_tokens


def test_a_saved_state_goes_straight_into_the_work_context_and_says_what_it_reused(engine128):
    e = engine128
    state = e.prime(TPL)
    e.cache.clear()
    e.work.reset()
    rep = run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", state=state,
                     gen=GEN)
    # a state holds one prefix: the run says it ran as prefix mode instead of claiming chain
    assert rep.reuse == "prefix" and "ran as prefix mode" in rep.note
    assert rep.reused_tokens == state.n_tokens == rep.copied_tokens and rep.verdict.exact
    assert [n.label for n in e.cache.tree] == ["saved state"]  # adopted after the first token
    again = run_prompt(e, TPL, {"c1": B, "c2": A, "question": "how?"}, reuse="prefix",
                       state=state, gen=GEN)
    assert again.copied_tokens == 0 and again.verdict.exact  # still in place


def test_clear_cache_drops_every_cached_prompt_and_the_work_context(engine128):
    e = engine128
    first = run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", gen=GEN)
    assert len(list(e.cache.tree)) > 1 and e.work.tokens
    e.clear_cache()
    assert not list(e.cache.tree) and e.work.tokens == [] and e.seqs.used_cells() == 0
    again = run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", gen=GEN)
    # rebuilt from nothing: the static prefix evaluated again, the same answer bit for bit
    assert again.reused_tokens == again.prefix_tokens and again.verdict.exact
    assert again.warm.tokens == first.warm.tokens


def _cells_and_rows(state: bytes) -> tuple[list[int], bytes]:
    """A sequence state's cell positions and K/V rows, without the sequence ids (which say
    only which sequence the state was taken through; seq_payload.py has the layout)."""
    n_cells = struct.unpack_from("<I", state, 12)[0]
    cells = [struct.unpack_from("<i", state, 16 + 12 * i)[0] for i in range(n_cells)]
    return cells, state[16 + 12 * n_cells:]


def _count_cell_states(e, monkeypatch) -> list:
    calls = []
    real = e.seqs.cells_of
    monkeypatch.setattr(e.seqs, "cells_of", lambda *a: calls.append(a) or real(*a))
    return calls


def test_copying_the_prefix_again_takes_no_new_state_of_its_cells(engine128, monkeypatch):
    e = engine128
    vals = [{"c1": A, "c2": B, "question": f"why {i}?"} for i in range(4)]
    state = e.prime(TPL)
    run_prompt(e, TPL, vals[0], reuse="prefix", gen=GEN)
    calls = _count_cell_states(e, monkeypatch)
    for v in vals[1:3]:  # the state the prefix was stored from is its copy
        e.work.reset()
        rep = run_prompt(e, TPL, v, reuse="prefix", gen=GEN)
        assert rep.copied_tokens == rep.prefix_tokens and rep.verdict.exact, rep.verdict.describe()
    assert calls == []
    ram = {t.name: t.used_bytes for t in e.cache.tier_usage()}["ram"]
    assert ram >= rep.prefix_tokens * e.info.kv_bytes_per_token  # the kept copy is counted
    # a saved state adopted into an empty cache: its own bytes are the copy
    e.clear_cache()
    run_prompt(e, TPL, vals[3], reuse="prefix", gen=GEN, state=state)
    e.work.reset()
    rep = run_prompt(e, TPL, vals[0], reuse="prefix", gen=GEN)
    assert rep.copied_tokens == state.n_tokens and rep.verdict.exact and calls == []
    assert_tree_consistent(e)


def test_the_kept_copy_goes_first_when_ram_is_short(tiny_model, monkeypatch):
    from app.engine.cache.cache_tiers import CacheLimits
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=128, n_threads=1,
                             cache=CacheLimits(ram_bytes=1024))) as e:
        calls = _count_cell_states(e, monkeypatch)
        run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="prefix", gen=GEN)
        for question in ("how?", "who?"):
            e.work.reset()
            rep = run_prompt(e, TPL, {"c1": B, "c2": A, "question": question}, reuse="prefix",
                             gen=GEN)
            assert rep.copied_tokens == rep.prefix_tokens and rep.verdict.exact
            assert {t.name: t.used_bytes for t in e.cache.tier_usage()}["ram"] <= 1024  # not kept
        assert len(calls) == 2  # a state of the cells taken for each copy


def test_a_node_computed_again_is_never_copied_from_its_old_state(engine128, monkeypatch):
    e = engine128
    run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", gen=GEN)
    e.work.reset()
    run_prompt(e, TPL, {"c1": B, "c2": A, "question": "how?"}, reuse="prefix", gen=GEN)
    prefix = next(n for n in e.cache.tree if n.label == "static prefix")
    assert prefix.children  # it stays in the tree (as a branching point) when dropped
    for _ in range(3):  # resident → RAM → file → dropped
        e.cache.evict(prefix.id)
    assert prefix.tier == "gone"
    e.work.reset()
    again = run_prompt(e, TPL, {"c1": C, "c2": B, "question": "who?"}, reuse="prefix", gen=GEN)
    # the prefix evaluated again in the work context (nothing copied), and cached again
    assert again.copied_tokens == 0 and prefix.tier == "resident"
    # the copy the cache keeps is a state of the cells the node holds now
    n = prefix.depth
    kept = e.cache.tiers.copy_of(prefix, 0, n)
    fresh = e.seqs.cells_of(e.cache.materialise(prefix), 0, n, e.cache.scratch)
    assert _cells_and_rows(kept) == _cells_and_rows(fresh)
    e.work.reset()
    third = run_prompt(e, TPL, {"c1": C, "c2": A, "question": "when?"}, reuse="prefix", gen=GEN)
    assert third.copied_tokens == third.prefix_tokens
    assert third.verdict.exact, third.verdict.describe()
    assert_tree_consistent(e)


def test_emptying_the_work_context_keeps_its_cells_bytes_and_runs_stay_exact(tiny_model, monkeypatch):
    """An emptied work context is not zeroed (an empty cell is masked: its old bytes weigh
    exactly nothing), yet a run after it gives, bit for bit, what a new engine gives."""
    from app.engine.llama.native import NativeContext
    said: list[bool] = []
    clear = NativeContext.clear
    monkeypatch.setattr(NativeContext, "clear", lambda self, data=True: (said.append(data), clear(self, data))[1])
    cfg = EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=128, n_threads=1)
    row = {"c1": C, "c2": A, "question": "when?"}
    with Engine(cfg) as e:
        run_prompt(e, TPL, {"c1": A, "c2": B, "question": "why?"}, reuse="chain", gen=GEN)
        e.work.reset()  # over the cells the first row left
        after = run_prompt(e, TPL, row, reuse="prefix", gen=GEN)
    assert said and not any(said)  # attention cells only: never zeroed
    with Engine(cfg) as fresh:
        new = run_prompt(fresh, TPL, row, reuse="prefix", gen=GEN)
    assert after.verdict.exact and after.warm.tokens == new.warm.tokens
    for a, b in zip(after.warm.logits, new.warm.logits, strict=True):
        assert (a == b).all()


def test_a_recurrent_models_work_context_is_zeroed_when_emptied(arch_models, monkeypatch):
    from app.engine.llama.native import NativeContext
    said: list[bool] = []
    clear = NativeContext.clear
    monkeypatch.setattr(NativeContext, "clear", lambda self, data=True: (said.append(data), clear(self, data))[1])
    with Engine(EngineConfig(model_path=str(arch_models["mamba2"]), n_ctx=512, n_threads=1)) as e:
        e.work.ctx  # opened
        e.work.reset()
    assert said and all(said)
