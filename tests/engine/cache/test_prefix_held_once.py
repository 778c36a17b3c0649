"""A prefix larger than the resident tier's cap is held once in RAM: it goes there at once, its
snapshot the cells the work context gave back (never placed in the cache's context, nor read
back from it), and the state a prime returns shares those bytes; runs from it stay exact."""
from __future__ import annotations

from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt

TPL = Template.parse("hello world of the answer and question. " * 17 + "<q>")
GEN = GenerationConfig(max_tokens=2)


def _node(e):
    return next(n for n in e.cache.tree if n.depth and n.parent is not None)


def test_a_spilled_prefix_is_its_kept_copy_and_the_primed_states_bytes(tiny_model):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=768, n_batch=64,
                             n_threads=1)) as e:
        state = e.prime(TPL)
        node = _node(e)
        assert state.n_tokens * e.info.kv_bytes_per_token > e.cache.tiers.resident_cap
        # in the RAM tier at once, never placed in the cache's context, whose snapshot is the
        # state: one object, not two
        assert node.tier == "ram" and node.ram is state.data and not e.ctx.opened
        first = run_prompt(e, TPL, {"q": "why?"}, reuse="prefix", gen=GEN)
        assert first.verdict.exact
        assert node.tier == "ram" and node.ram is state.data
        assert [u.kept_copies for u in e.cache.tier_usage() if u.name == "ram"] == [0]
        e.work.reset()  # the next run copies the prefix from the RAM tier
        again = run_prompt(e, TPL, {"q": "why?"}, reuse="prefix", gen=GEN)
        assert again.hit_tier == "ram" and again.verdict.exact
        assert again.warm.tokens == first.warm.tokens


def test_the_saved_state_loads_back_and_runs_exact(tiny_model, tmp_path):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=768, n_batch=64,
                             n_threads=1)) as e:
        state = e.prime(TPL)
        state.save(tmp_path / "p.kvstate")
        e.clear_cache()
        loaded = e.load_state(tmp_path / "p.kvstate")
        assert loaded.data == state.data
        rep = run_prompt(e, TPL, {"q": "why?"}, reuse="prefix", state=loaded, gen=GEN)
        assert rep.verdict.exact and rep.reused_tokens > 0
