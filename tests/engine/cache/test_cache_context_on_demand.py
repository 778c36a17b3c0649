"""The cache's context is created when a node's cells are first placed in it: on an
attention-only model runs evaluate in the work context, so a prefix over the resident cap (held
in the RAM tier) never makes the engine allocate and clear a second context's cells. Before it
is created the context reports the sizes llama.cpp then gives it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
from app.engine.llama.native import ContextParams, NativeContext, NativeModel

LONG = Template.parse("hello world of the answer and question. " * 17 + "<q>")
SHORT = Template.parse("a short prefix. <q>")
GEN = GenerationConfig(max_tokens=2)


def _config(path, n_ctx: int = 768) -> EngineConfig:
    return EngineConfig(model_path=str(path), n_ctx=n_ctx, n_batch=64, n_threads=1)


def test_a_prefix_in_the_ram_tier_never_opens_the_cache_context(tiny_model):
    with Engine(_config(tiny_model)) as e:
        assert not e.ctx.opened and e.work.ctx.opened
        state = e.prime(LONG)
        assert state.n_tokens * e.info.kv_bytes_per_token > e.cache.tiers.resident_cap
        first = run_prompt(e, LONG, {"q": "why?"}, reuse="prefix", gen=GEN)
        e.work.reset()  # the next run copies the prefix from the RAM tier
        again = run_prompt(e, LONG, {"q": "why?"}, reuse="prefix", gen=GEN)
        assert first.verdict.exact and again.verdict.exact and again.hit_tier == "ram"
        view = e.kv_view()  # the cell map of an empty cache
        assert view.n_cells == e.n_ctx and not view.used_cells
        e.clear_all()
        e.clear_cache()
        assert not e.ctx.opened


def test_the_first_resident_node_opens_it_as_it_said(tiny_model):
    with Engine(_config(tiny_model)) as e:
        said = (e.ctx.n_ctx, e.ctx.n_ubatch, e.info.n_ctx)
        e.prime(SHORT)
        node = next(n for n in e.cache.tree if n.depth and n.parent is not None)
        assert e.ctx.opened and node.seq is not None  # resident: its cells in the context
        assert (e.ctx.n_ctx, e.ctx.n_ubatch, e.info.n_ctx) == said
        e.work.reset()  # the run copies the prefix from the cache's context
        rep = run_prompt(e, SHORT, {"q": "why?"}, reuse="prefix", gen=GEN)
        assert rep.verdict.exact and rep.reused_tokens == node.depth


@pytest.mark.parametrize("arch", ["gemma3", "mamba2"])
def test_windowed_and_stateful_models_open_it_at_once(arch_models, arch):
    """A sliding-window model runs in the cache's own sequences; a stateful one keeps a
    recurrent state per sequence there: both open it with the engine."""
    with Engine(_config(arch_models[arch], n_ctx=512)) as e:
        assert e.ctx.opened


@pytest.mark.parametrize("n_ctx,n_batch,n_ubatch", [(300, 64, 0), (1000, 2000, 0),
                                                     (512, 64, 32), (100, 256, 512)])
def test_a_lazy_context_says_the_sizes_llama_cpp_gives_it(tiny_model, n_ctx, n_batch, n_ubatch):
    model = NativeModel(str(tiny_model))
    try:
        params = replace(ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_threads=1, n_seq_max=2),
                         n_ubatch=n_ubatch)
        ctx = NativeContext(model, params, lazy=True)
        said = (ctx.n_ctx, ctx.n_ubatch)
        assert not ctx.opened
        assert ctx.mem and ctx.opened  # the first handle asked for opens it
        assert (ctx.n_ctx, ctx.n_ubatch) == said
        ctx.close()
        unused = NativeContext(model, params, lazy=True)
        unused.close()
        with pytest.raises(AttributeError):  # closed before use: never opened after
            unused.mem
    finally:
        model.close()
