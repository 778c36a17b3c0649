"""-ngl on a build without GPU offload is an error, not silently ignored (this machine's build
has none); with offload available the count reaches llama.cpp's model params."""
import llama_cpp as L
import pytest

from app.engine import Engine, EngineConfig, ModelError
from app.engine.llama import native
from app.engine.llama.native import GPU_OFFLOAD_MISSING, check_gpu_layers


def test_cpu_only_build_refuses_gpu_layers(tiny_model, monkeypatch):
    monkeypatch.setattr(L, "llama_supports_gpu_offload", lambda: False)
    for n in (1, 99, -1):
        with pytest.raises(ModelError) as e:
            Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_gpu_layers=n))
        assert str(e.value) == GPU_OFFLOAD_MISSING
    check_gpu_layers(0)  # the default works everywhere
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=32)) as eng:
        assert eng.model.n_vocab > 0


def test_a_negative_count_other_than_all_is_refused():
    with pytest.raises(ModelError, match="GPU layers must be 0 .* not -2"):
        check_gpu_layers(-2)


def test_gpu_layers_reach_the_model_params_when_offload_exists(tiny_model, monkeypatch):
    seen = []
    real_load = L.llama_model_load_from_file

    def load(path, params):
        seen.append(params.n_gpu_layers)
        return real_load(path, params)

    monkeypatch.setattr(L, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(L, "llama_model_load_from_file", load)
    for n, expected in ((3, 3), (-1, 1 << 30)):
        model = native.NativeModel(tiny_model, n)
        model.close()
        assert seen[-1] == expected
