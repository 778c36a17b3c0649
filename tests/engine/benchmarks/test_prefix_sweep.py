"""The prefix-length sweep times the paths runs take: warm in the work context, cold and the
floor in the cold reference context; it leaves the radix cache as it found it."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import Engine, EngineConfig, Template, run_prompt
from app.engine.benchmarks import prefix_sweep as sweep_mod
from app.engine.errors import KvPrimerError
from app.engine.runs.generation import GenerationConfig
from tests.tiny_model import write_arch_model

TPL = Template.parse("<|im_start|>system\nanswer from the context.\n"
                     + "hello world of the answer and question. " * 6
                     + "\n<c1>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
VALUES = {"c1": "the world is a question of the answer. " * 2, "question": "why?"}


@pytest.fixture(params=["on", "off"])
def engine16(request, tiny_model):
    # batches of 16: every length of the sweep spans several batches, and lengths fall mid-batch
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=16, n_threads=1,
                             flash_attn=request.param)) as eng:
        yield eng


def test_warm_is_the_work_context_path_and_matches_its_same_boundary_cold_run(engine16,
                                                                              monkeypatch):
    e = engine16
    run_prompt(e, TPL, VALUES, reuse="chain", gen=GenerationConfig(max_tokens=2))
    nodes = [(n.id, n.tokens, n.tier) for n in e.cache.nodes()]
    warm, cold = [], []
    real_warm, real_cold = sweep_mod.evaluate_and_generate, e.cold.run

    def record_warm(*a, **k):
        warm.append(real_warm(*a, **k))
        return warm[-1]

    def record_cold(tokens, marks, *a, **k):
        r = real_cold(tokens, marks, *a, **k)
        cold.append((tokens, marks, r))
        return r

    monkeypatch.setattr(sweep_mod, "evaluate_and_generate", record_warm)
    monkeypatch.setattr(e.cold, "run", record_cold)
    points = sweep_mod.prefix_sweep(e, TPL, VALUES)

    prefix = len(e.tokenize(TPL.prefix_prompt()))
    assert [p.prefix_tokens for p in points] == sorted({round(prefix * s) for s in sweep_mod.SHARES})
    assert points[-1].prefix_tokens == prefix
    assert all(p.cold_ms > 0 and p.warm_ms > 0 and p.floor_ms > 0 for p in points)
    assert len(warm) == len(points) and len(cold) == 2 * len(points)
    suffix = points[0].suffix_tokens
    for p, w, (c_tokens, c_marks, c), (f_tokens, f_marks, _f) in zip(
            points, warm, cold[0::2], cold[1::2]):
        # warm evaluated only the suffix after p.prefix_tokens reused tokens
        assert (w.reused_tokens, w.evaluated_tokens) == (p.prefix_tokens, suffix)
        # cold: the whole prompt, replaying the warm history's batch starts; floor: the suffix
        assert len(c_tokens) == p.prefix_tokens + suffix and c_marks == w.starts
        assert p.prefix_tokens in w.starts  # the state ended where a batch ended
        assert len(f_tokens) == suffix and f_marks == []
        # the warm run's cells lie where the cold run's do: the same bits
        assert w.tokens[0] == c.tokens[0]
        assert np.array_equal(w.logits[0], c.logits[0])
    # the sweep cached nothing and evicted nothing
    assert [(n.id, n.tokens, n.tier) for n in e.cache.nodes()] == nodes


def test_a_sliding_window_model_is_refused_with_the_reason(tmp_path):
    path = write_arch_model(tmp_path / "tiny-gemma3.gguf", "gemma3")
    with Engine(EngineConfig(model_path=str(path), n_ctx=512, n_batch=32, n_threads=1)) as e:
        assert not e.runs_in_work_context
        with pytest.raises(KvPrimerError, match="work context"):
            sweep_mod.prefix_sweep(e, TPL, VALUES)


def test_a_prefix_too_short_to_sweep_is_refused(engine):
    with pytest.raises(KvPrimerError, match="too short"):
        sweep_mod.prefix_sweep(engine, Template.parse("<q> and more"), {"q": "hello"})
