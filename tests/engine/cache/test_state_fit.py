"""Any saved state that fits the context loads at the context size the user gave (issue 35,
item 3): a 480-token state in a 512-cell context, run with a short suffix, through the CLI's
`run --state` and through the engine API; and when it cannot fit, one line names the cells it
needs, the cells the context has and the context size that works."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.engine import CacheLimits, Engine, EngineConfig, Template
from app.engine.errors import StateFitError, context_size_for
from app.engine.runs.prompt_runs import run_prompt
from app.engine.state_flows import load_state

N_CTX = 512
PREFIX_TOKENS = 480  # beyond the resident tier's default cap (three quarters of the cells)


def _template(engine: Engine) -> Template:
    """A template whose static prefix tokenizes to exactly PREFIX_TOKENS tokens, then a
    placeholder for a short question."""
    text = "<|im_start|>system\n" + "the answer of the world is hello. " * 60
    toks = engine.tokenize(Template.parse(text + "<q>").prefix_prompt())
    while len(toks) > PREFIX_TOKENS:
        text = text[:-1]
        toks = engine.tokenize(Template.parse(text + "<q>").prefix_prompt())
    assert len(toks) == PREFIX_TOKENS, "adjust the filler so that it hits the size exactly"
    return Template.parse(text + "<q>")


# a resident cap above the whole context: states stay in the cache's cells (by default one
# over three quarters of them goes straight to the RAM tier)
ALL_RESIDENT = CacheLimits(resident_bytes=1 << 30)


def _engine(model, n_ctx=N_CTX, cache: CacheLimits = CacheLimits()) -> Engine:
    return Engine(EngineConfig(model_path=str(model), n_ctx=n_ctx, n_batch=32, n_threads=1,
                               cache=cache))


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    """The template file and a state of its 480-token prefix, primed at -c 512."""
    d = tmp_path_factory.mktemp("fit")
    with _engine(tiny_model) as eng:
        tpl = _template(eng)
        state = eng.prime(tpl)
        assert state.n_tokens == PREFIX_TOKENS
        path = d / "p.kvstate"
        state.save(path)
    (d / "t.tmpl").write_text(tpl.source)
    return d, path, tpl


def test_cli_run_with_a_state_near_the_context_size(saved, tiny_model, capfd):
    d, path, _tpl = saved
    m = ["-m", str(tiny_model), "-t", "1", "-c", str(N_CTX), "-b", "32", "-n", "4"]
    q = ["--set", "q=" + "hello world " * 2]  # the run's own tokens: about 20 with the answer
    capfd.readouterr()
    for _ in range(2):  # the second run adopts the state the first one left in the cache
        assert main(["run", str(d / "t.tmpl"), *m, *q, "--state", str(path), "--json"]) == 0
        rep = json.loads(capfd.readouterr().out)
        assert rep["reused_tokens"] == PREFIX_TOKENS
        assert rep["verdict"]["tokens_equal"]


@pytest.mark.parametrize("cache", [CacheLimits(), ALL_RESIDENT], ids=["ram", "resident"])
def test_engine_adopts_and_runs_a_state_near_the_context_size(saved, tiny_model, cache):
    _d, path, tpl = saved
    with _engine(tiny_model, cache=cache) as eng:
        state = load_state(eng, path, tpl)  # as the window's Load state: adopted at once
        for _ in range(3):  # each warm run adopts it again afterwards
            rep = run_prompt(eng, tpl, {"q": "hello world hello world"}, reuse="prefix",
                             state=state)
            assert rep.warm.reused_tokens == PREFIX_TOKENS
            assert rep.verdict.tokens_equal
            assert eng.adopt(state).depth == PREFIX_TOKENS
        node = eng.adopt(state)
        assert node.tier == ("resident" if cache is ALL_RESIDENT else "ram")
        # and a run that copies the node (not the state) into the work context
        eng.work_slot.bring(eng.cache.lookup(list(state.tokens)), list(state.tokens))
        assert eng.work.tokens == list(state.tokens)


def test_a_state_larger_than_the_context_names_the_size_that_works(saved, tiny_model):
    _d, path, tpl = saved
    with _engine(tiny_model, n_ctx=256) as eng:
        with pytest.raises(StateFitError) as e:
            load_state(eng, path, tpl)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"needs {PREFIX_TOKENS:,} KV cells" in msg and "context has 256" in msg
    assert f"context size to {context_size_for(PREFIX_TOKENS):,}" in msg
    assert context_size_for(PREFIX_TOKENS) == 512


def test_cli_says_which_context_size_works(saved, tiny_model, capfd):
    d, path, _tpl = saved
    m = ["-m", str(tiny_model), "-t", "1", "-c", "256", "-b", "32"]
    capfd.readouterr()
    rc = main(["run", str(d / "t.tmpl"), *m, "--set", "q=hi", "--state", str(path)])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "-c/--ctx-size" in err[0] and "to 512 or more" in err[0]


def test_cells_the_user_holds_are_named_when_they_leave_no_room(saved, tiny_model):
    _d, path, tpl = saved
    with _engine(tiny_model, cache=ALL_RESIDENT) as eng:
        eng.evaluate(eng.tokenize(tpl.prefix_prompt())[:100], seq=0)  # the user's own sequence
        with pytest.raises(StateFitError) as e:
            load_state(eng, path, tpl)
        msg = str(e.value)
        assert "sequence 0 holds 100 tokens" in msg and "clear sequence 0" in msg
        assert f"context size to {context_size_for(PREFIX_TOKENS + 100):,}" in msg
        eng.clear_seq(0)  # with the user's cells gone the same state loads
        assert load_state(eng, path, tpl).n_tokens == PREFIX_TOKENS


@pytest.mark.parametrize("arch", ["gemma3", "lfm2"])
def test_windowed_and_hybrid_models_load_a_state_near_the_context_size(arch_models, arch,
                                                                        tmp_path):
    """A sliding-window model's runs fork the state in the cache's cells (promoted from the RAM
    tier); a hybrid's keeps its recurrent state with its cells: both at 474 of 512 cells."""
    tpl = Template.parse("<|im_start|>system\n" + "the answer of the world is hello. " * 16
                         + "<q>")
    with _engine(arch_models[arch]) as eng:
        state = eng.prime(tpl)
        state.save(tmp_path / "p.kvstate")
    assert state.n_tokens > N_CTX * 9 // 10
    with _engine(arch_models[arch]) as eng:
        state = load_state(eng, tmp_path / "p.kvstate", tpl)
        for _ in range(2):
            rep = run_prompt(eng, tpl, {"q": "hello world hello world"}, reuse="prefix",
                             state=state)
            assert rep.warm.reused_tokens == state.n_tokens
            assert rep.verdict.tokens_equal
