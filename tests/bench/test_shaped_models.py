"""Random-weight models of real models' shapes (bench/shaped_models.py): each writes, loads in
llama.cpp with the shape it claims (layers, width, KV heads, KV bytes per token), tokenizes as
the default model does, and generates. At reduced depth here; one test loads the whole Llama 3.2
1B shape (about 600 MB)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from bench.shaped_models import DEFAULT_32K, SHAPES, shaped_model

# the depth each shape is tested at: enough layers for its pattern (Gemma 3: 5 local, 1
# global; Qwen3.5: 3 DeltaNet, 1 attention), the full width
DEPTHS = {"llama3.2-1b": 2, "llama3.2-3b": 1, "qwen3-1.7b": 2, "qwen3.5-2b": 4, "gemma3-1b": 6}
TEXT = "<|im_start|>user\nWhat does E-204 mean on the Helios Home Battery?<|im_end|>\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("shaped")


@pytest.fixture(scope="module")
def default_ids(default_model):
    from app.engine.llama.native_model import NativeModel

    m = NativeModel(default_model)
    try:
        return m.n_vocab, m.tokenize(TEXT, add_special=True, parse_special=True)
    finally:
        m.close()


def _engine(path, n_ctx=512):
    from app.engine import Engine, EngineConfig

    return Engine(EngineConfig(model_path=str(path), n_ctx=n_ctx, n_batch=64, n_threads=1))


def _generates(eng, n=4) -> list[int]:
    from app.engine import GenerationConfig, Template, run_prompt

    rep = run_prompt(eng, Template.parse("<|im_start|>user\n<q><|im_end|>\n"), {"q": "Hello"},
                     reuse="prefix", cold=True, warm=False, gen=GenerationConfig(max_tokens=n))
    return rep.cold.tokens


def test_shapes_match_their_published_kv_sizes():
    # KV bytes per token at f16 as published (/work/shared/LLAMA_FACTS.md: 32 KiB, 112 KiB,
    # 112 KiB; Qwen3.5-2B about 12 KiB a token beside its recurrent state)
    assert SHAPES["llama3.2-1b"].kv_bytes_per_token == 32 * 1024
    assert SHAPES["llama3.2-3b"].kv_bytes_per_token == 112 * 1024
    assert SHAPES["qwen3-1.7b"].kv_bytes_per_token == 112 * 1024
    assert SHAPES["qwen3.5-2b"].kv_bytes_per_token == 12 * 1024
    assert SHAPES["gemma3-1b"].layout is None and SHAPES["qwen3.5-2b"].layout == "LLLA" * 6


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(DEPTHS))
def test_each_shape_loads_with_its_shape_and_the_default_tokenizer(name, folder, default_ids):
    depth = DEPTHS[name]
    shape = SHAPES[name].at_depth(depth)
    path = shaped_model(name, n_layer=depth, folder=folder)
    with _engine(path) as eng:
        info = eng.info
        assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (
            shape.arch, depth, shape.n_embd, shape.n_head, shape.n_head_kv)
        assert info.n_ctx_train == shape.n_ctx
        assert info.kv_bytes_per_token == shape.kv_bytes_per_token
        n_vocab, ids = default_ids
        assert info.n_vocab == n_vocab
        assert eng.model.tokenize(TEXT, add_special=True, parse_special=True) == ids
        assert len(_generates(eng)) >= 1


@pytest.mark.model
def test_written_once_then_found_in_the_cache(folder):
    a = shaped_model("llama3.2-1b", n_layer=1, folder=folder)
    mtime = a.stat().st_mtime_ns
    assert shaped_model("llama3.2-1b", n_layer=1, folder=folder) == a
    assert a.stat().st_mtime_ns == mtime
    other = shaped_model("llama3.2-1b", n_layer=1, seed=1, folder=folder)
    assert other != a and other.stat().st_size == a.stat().st_size
    assert not list(folder.glob("*.tmp"))


@pytest.mark.model
def test_the_default_model_declaring_32k_is_its_own_weights(folder, default_model):
    path = shaped_model(DEFAULT_32K, folder=folder)
    a = np.fromfile(default_model, dtype=np.uint8)
    b = np.fromfile(path, dtype=np.uint8)
    assert a.size == b.size
    assert np.count_nonzero(a != b) <= 4  # the one uint32 value, nothing else
    with _engine(path, n_ctx=1024) as eng:
        assert eng.info.n_ctx_train == 32768
        assert eng.info.kv_bytes_per_token == 23040
        assert len(_generates(eng)) >= 1


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("KVPRIMER_SKIP_1B") == "1", reason="KVPRIMER_SKIP_1B=1")
def test_the_whole_llama_1b_shape_loads_like_a_real_one(folder):
    path = shaped_model("llama3.2-1b", folder=folder)
    assert 550e6 < path.stat().st_size < 650e6  # Q4_0 at Llama 3.2 1B's shape, tied output
    with _engine(path) as eng:
        info = eng.info
        assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (16, 2048, 32, 8)
        assert info.kv_bytes_per_token == 32 * 1024
        assert 1.0e9 < info.n_params < 1.3e9
        assert len(_generates(eng)) >= 1
