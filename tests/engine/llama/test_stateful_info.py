"""What KV Primer says about hybrid and recurrent models (tiny ones, tests/tiny_model.py): which
layers are which, the bytes a sequence's state takes, `kvprimer info`'s notes, and no llama.cpp
return code as a message."""
from __future__ import annotations

import json
import re

import llama_cpp as L
import pytest

from app.cli import main
from app.engine import Engine, EngineConfig
from app.engine.errors import ContextError
from app.engine.llama import crash_probe
from app.engine.llama.crash_probe import checked_cpu_kernels
from app.engine.llama.layer_kinds import LayerKinds, architecture_is_stateful, read_layer_kinds
from app.engine.llama.recurrent_state import measure_recurrent_bytes
from tests.tiny_model import (ARCHITECTURES, HYBRID_ARCHITECTURES, MORE_STATEFUL_ARCHITECTURES,
                              STATEFUL_ARCHITECTURES, write_arch_model)

LEGENDS = {"mamba": "no attention, 2 Mamba layers", "mamba2": "no attention, 2 Mamba 2 layers",
           "lfm2": "1 attention layer, 3 convolution layers",
           "granitehybrid": "2 attention layers, 2 Mamba 2 layers",
           "nemotron_h": "1 attention layer, 2 Mamba 2 layers, 1 feed-forward layer",
           "qwen35": "1 attention layer, 3 Gated DeltaNet layers"}
# a cell in a saved state also records its position, its sequence count and its sequence id
CELL_RECORD = 12
# the architectures of ARCHITECTURES and Qwen3.5 (written apart: tests/tiny_model.py)
ALL = ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES
STATEFUL = STATEFUL_ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES
HYBRID = HYBRID_ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES


@pytest.fixture(scope="module")
def models(arch_models, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("more-models")
    return {**arch_models, **{a: write_arch_model(root / f"tiny-{a}.gguf", a)
                              for a in MORE_STATEFUL_ARCHITECTURES}}


def _engine(path, fa: str = "on") -> Engine:
    return Engine(EngineConfig(model_path=str(path), n_ctx=512, n_batch=32, n_threads=1,
                               flash_attn=fa, kv_debug_log=False))


@pytest.mark.parametrize("arch", MORE_STATEFUL_ARCHITECTURES)
def test_qwen35_loads_and_generates(models, arch):
    """As every architecture of tests/engine/llama/test_model_arches.py does, with its multi-axis RoPE."""
    from tests.engine.llama.test_model_arches import test_each_architecture_loads_and_generates

    test_each_architecture_loads_and_generates(models, arch)
    with _engine(models[arch]) as eng:
        assert eng.info.traits.hybrid and eng.info.traits.rope_type == "imrope"


@pytest.mark.parametrize("arch", ALL)
def test_layer_kinds_from_the_header_agree_with_llama_cpp(models, arch):
    kinds = read_layer_kinds(models[arch])
    assert kinds.stateful == (arch in STATEFUL) == architecture_is_stateful(arch)
    if kinds.stateful:
        assert kinds.legend() == LEGENDS[arch]
    with _engine(models[arch]) as eng:
        assert kinds.n_layer == L.llama_model_n_layer(eng.model.ptr)
        assert bool(L.llama_model_is_hybrid(eng.model.ptr)) == (arch in HYBRID)
        assert eng.info.traits.layers == (LEGENDS[arch] if kinds.stateful else "")


def test_legends_of_layouts_the_tiny_models_lack():
    assert LayerKinds("falcon-h1", 24, 24, 24, "Mamba 2").legend() == \
        "24 layers, each attention beside a Mamba 2 mixer"
    assert LayerKinds("qwen35", 24, 6, 18, "Gated DeltaNet").legend() == \
        "6 attention layers, 18 Gated DeltaNet layers"
    assert LayerKinds("rwkv7", 12, 0, 12, "RWKV").legend() == "no attention, 12 RWKV layers"


@pytest.mark.parametrize("arch", ALL)
@pytest.mark.parametrize("fa, type_kv", [("on", "f16"), ("off", "f16"), ("on", "q8_0")])
def test_kv_bytes_per_token_count_attention_layers_only(models, arch, fa, type_kv):
    """What a saved state grows by per token, measured: the K and V rows of the attention
    layers (a hybrid's recurrent layers have none) plus the cell's record."""
    fa = "on" if arch == "gemma3" else fa  # (its window needs flash attention)
    with Engine(EngineConfig(model_path=str(models[arch]), n_ctx=512, n_batch=32,
                             n_threads=1, flash_attn=fa, type_k=type_kv, type_v=type_kv,
                             kv_debug_log=False)) as eng:
        toks = eng.model.tokenize("hello world")
        eng.evaluate(toks[:1], 0, want_logits=False)
        one = L.llama_state_seq_get_size(eng.ctx.ptr, 0)
        eng.evaluate(toks[1:2], 0, want_logits=False)
        grown = L.llama_state_seq_get_size(eng.ctx.ptr, 0) - one
        per_token = eng.info.kv_bytes_per_token
        if arch in ("mamba", "mamba2"):
            assert per_token == grown == 0
        else:
            caches = 2 if arch == "gemma3" else 1  # its sliding-window layers have their own
            # M-RoPE cells also record two more positions and a token (llama_kv_cell_ext)
            record = CELL_RECORD + (12 if arch == "qwen35" else 0)
            assert per_token > 0 and grown == per_token + caches * record
        t = eng.info.traits
        if arch in STATEFUL:
            assert t.attention_bytes_per_token == per_token
            assert t.recurrent_state_bytes == measure_recurrent_bytes(eng.model, eng.ctx.params) \
                == L.llama_state_seq_get_size_ext(eng.ctx.ptr, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) > 1000


def test_recurrent_state_is_the_same_size_at_any_length(arch_models):
    with _engine(arch_models["lfm2"]) as eng:
        toks = eng.model.tokenize("the question is hello world " * 6)
        eng.evaluate(toks[:5], 0, want_logits=False)
        short = L.llama_state_seq_get_size_ext(eng.ctx.ptr, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        eng.evaluate(toks[5:], 0, want_logits=False)
        assert L.llama_state_seq_get_size_ext(eng.ctx.ptr, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) \
            == short == eng.info.traits.recurrent_state_bytes


# ---- kvprimer info


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("arch", STATEFUL)
@pytest.mark.parametrize("fa", ["on", "off"])
def test_info_says_what_caching_does_on_a_stateful_model(models, capsys, arch, fa):
    code, out, err = _cli(capsys, "info", "-m", str(models[arch]), "-fa", fa, "-c", "512")
    assert code == 0 and not re.search(r"code -?\d", err + out)
    assert "warm runs: exact in prefix and chain modes" in out
    assert f"layers: {LEGENDS[arch]}" in out
    assert "compose mode: refused" in out and "forked batches: refused" in out
    assert "cannot be cut back" in out
    if arch in HYBRID:
        assert re.search(r"cache size: [\d,]+ bytes of K and V per token \(attention layers only\) "
                         r"\+ [\d,]+ bytes of recurrent state per sequence", out)
    else:
        assert re.search(r"cache size: no cells per token; [\d,]+ bytes of recurrent state", out)
    code, out, _ = _cli(capsys, "info", "-m", str(models[arch]), "-fa", fa, "-c", "512",
                        "--json")
    traits = json.loads(out)["traits"]
    assert traits["layers"] == LEGENDS[arch] and traits["recurrent_state_bytes"] > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_info_on_attention_models_is_as_before(arch_models, capsys, arch):
    code, out, _ = _cli(capsys, "info", "-m", str(arch_models[arch]), "-c", "512")
    assert code == 0 and "exact in prefix and chain modes" not in out and "layers:" not in out
    assert "restore from a file or RAM snapshot:" in out


# ---- no llama.cpp return code as a message


@pytest.mark.parametrize("arch", STATEFUL)
def test_a_decode_behind_a_recurrent_state_says_why_not_a_code(models, arch):
    """A recurrent state cannot be cut back: evaluating again from an earlier position is
    refused by llama.cpp (an invalid batch); the message says which sequence and why."""
    with _engine(models[arch]) as eng:
        toks = eng.model.tokenize("the question is hello world")
        eng.evaluate(toks[:6], 0, want_logits=False)
        assert not eng.ctx.seq_rm(0, 3, -1)  # llama.cpp keeps the state as it was
        with pytest.raises(ContextError) as err:
            eng.ctx.decode([(toks[3], 3, (0,), True)])
        msg = str(err.value)
        assert msg == ("sequence 0 ends at position 5, so llama.cpp cannot evaluate tokens from "
                       "position 3 in it (this model's recurrent state cannot be cut back)")


def test_a_decode_behind_an_attention_sequence_says_to_trim_it(arch_models):
    with _engine(arch_models["llama"]) as eng:
        toks = eng.model.tokenize("the question is hello world")
        eng.evaluate(toks[:6], 0, want_logits=False)
        with pytest.raises(ContextError, match=r"ends at position 5, .* from position 2 in it; "
                                               r"clear or trim the sequence first$"):
            eng.ctx.decode([(toks[2], 2, (0,), True)])


@pytest.mark.parametrize("arch", STATEFUL)
def test_the_crash_check_passes_on_stateful_models(tmp_path, monkeypatch, arch):
    """Quantized weights take the check in a child process: its test decode runs on hybrid and
    recurrent models too (a failed one would show in `info` as 'no crash check')."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(crash_probe.CRASH_TEST_ENV, raising=False)
    path = write_arch_model(tmp_path / f"{arch}-q8.gguf", arch, weight_type="q8_0")
    k = checked_cpu_kernels(path)
    assert "passed" in k.probe and not re.search(r"code -?\d|returned|failed", k.probe + k.reason)


# ---- compose refused before the model loads


def _truncated_copy(src, dst):
    """The header whole, the tensors cut: llama.cpp (and our own checks) would refuse to load it."""
    data = src.read_bytes()
    dst.write_bytes(data[:len(data) // 2])
    return dst


@pytest.mark.parametrize("arch", STATEFUL)
@pytest.mark.parametrize("command", ["run", "bench"])
def test_compose_is_refused_before_a_stateful_model_loads(models, tmp_path, capsys, arch,
                                                          command):
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("you are a helpful assistant; answer the question\n<q>\n")
    rows = tmp_path / "rows.csv"
    rows.write_text("q\nhello world\n")
    model = _truncated_copy(models[arch], tmp_path / f"{arch}-cut.gguf")
    args = (["run", str(tpl), "--set", "q=hello", "--reuse", "compose"] if command == "run" else
            ["bench", str(tpl), "--rows", str(rows), "--reuse", "prefix,compose"])
    code, out, err = _cli(capsys, *args, "-m", str(model), "-fa", "on")
    assert code != 0 and "truncated" not in err  # the file was never opened as a model
    assert err.strip().splitlines() == [
        f"kvprimer: error: compose mode cannot run on {model.name}: its recurrent layers "
        f"({LEGENDS[arch]}) keep one state per sequence, which cannot be shifted into place "
        "or composed from modules; use prefix or chain"]


def test_compose_on_an_attention_model_is_not_refused_by_the_header(arch_models, tmp_path, capsys):
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("you are a helpful assistant; answer the question\n<q>\n")
    model = _truncated_copy(arch_models["llama"], tmp_path / "llama-cut.gguf")
    code, _out, err = _cli(capsys, "run", str(tpl), "--set", "q=hello", "--reuse", "compose",
                           "-m", str(model), "-fa", "on")
    assert code != 0 and "truncated" in err and "compose" not in err


@pytest.mark.parametrize("arch", ["lfm2", "mamba2"])
def test_the_sweep_on_a_stateful_model_runs_or_says_why_in_words(arch_models, arch):
    from app.engine import Template
    from app.engine.errors import KvPrimerError
    from app.engine.benchmarks.prefix_sweep import prefix_sweep

    tpl = Template.parse("you are a helpful assistant of the world and the answer is hello " * 4
                         + "<q>")
    with _engine(arch_models[arch]) as eng:
        try:
            assert prefix_sweep(eng, tpl, {"q": "hello world"})
        except KvPrimerError as e:  # one line in words, never llama.cpp's return code
            assert "\n" not in str(e) and not re.search(r"code -?\d", str(e))
