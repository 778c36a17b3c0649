"""Caching facts across architectures, on tiny random-weight models (tests/tiny_model.py).

Every comparison is against a cold run of the same tokens with the same batch boundaries
(prefix, then suffix), since llama.cpp's numerics depend on them. The fixtures: llama (plain),
qwen2 (Q/K/V biases), qwen3 (Q/K norms), gemma3 (an 8-token sliding window on layers S F S F),
mamba and mamba2 (recurrent), lfm2, granitehybrid and nemotron_h (hybrid: attention beside
short convolutions or Mamba 2 mixers). What these tests pin down is what ModelTraits.notes()
tells users.
"""
from __future__ import annotations

import dataclasses
import json

import llama_cpp as L
import numpy as np
import pytest

from app.engine import Engine, EngineConfig
from app.engine.errors import ContextError, KvPrimerError
from tests.tiny_model import (ARCHITECTURES, ATTENTION_ARCHITECTURES, HYBRID_ARCHITECTURES,
                              RECURRENT_ARCHITECTURES, STATEFUL_ARCHITECTURES, write_arch_model)

TEXT = ("the question is hello world and the answer is in the context you are a helpful "
        "assistant of the world and the hello ") * 8
WINDOW = 8  # the gemma3 fixture's n_swa


def _engine(path, n_batch: int = 32) -> Engine:
    return Engine(EngineConfig(model_path=str(path), n_ctx=512, n_batch=n_batch, n_threads=1,
                               kv_debug_log=False))


def _diff(a, b) -> float:
    return float(np.max(np.abs(a - b)))


def _cold(eng: Engine, tokens: list[int], boundary: int, seq: int = 0):
    eng.seqs.clear(seq)
    return eng.evaluate(tokens, seq, starts=eng.batch_plan(seq, len(tokens), marks=[boundary]))


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


# ---- loading and traits


def test_each_architecture_loads_and_generates(arch_models, arch):
    with _engine(arch_models[arch]) as eng:
        assert eng.info.architecture == arch
        toks = eng.model.tokenize("hello world")
        for _ in range(4):  # greedy: each next token from the last logits
            logits = eng.evaluate(toks[-1:] if eng.seq_tokens[0] else toks)
            assert np.isfinite(logits).all()
            toks.append(int(np.argmax(logits)))
        assert len(eng.seq_tokens[0]) == len(toks) - 1


def test_llama_cpp_calls_each_stateful_architecture_what_it_is(arch_models, arch):
    """The tiny hybrids and recurrent models are what llama.cpp takes them for."""
    with _engine(arch_models[arch]) as eng:
        assert bool(L.llama_model_is_recurrent(eng.model.ptr)) == (arch in RECURRENT_ARCHITECTURES)
        assert bool(L.llama_model_is_hybrid(eng.model.ptr)) == (arch in HYBRID_ARCHITECTURES)
        assert (arch in STATEFUL_ARCHITECTURES) == (eng.info.traits.recurrent or eng.info.traits.hybrid)


EXPECTED_TRAITS = {
    "llama": dict(n_swa=0, swa_kind="none", swa_layers=0, swa_pattern="", recurrent=False,
                  rope_type="norm"),
    "qwen2": dict(n_swa=0, swa_kind="none", swa_layers=0, recurrent=False, rope_type="neox"),
    "qwen3": dict(n_swa=0, swa_kind="none", swa_layers=0, recurrent=False, rope_type="neox"),
    "gemma3": dict(n_swa=WINDOW, swa_kind="standard", swa_layers=2, swa_pattern="SFSF",
                   recurrent=False, rope_type="neox"),
    "mamba": dict(n_swa=0, swa_kind="none", recurrent=True, hybrid=False, rope_type="none"),
    "mamba2": dict(n_swa=0, swa_kind="none", recurrent=True, hybrid=False, rope_type="none"),
    "lfm2": dict(n_swa=0, swa_kind="none", recurrent=False, hybrid=True, rope_type="neox"),
    "granitehybrid": dict(n_swa=0, swa_kind="none", recurrent=False, hybrid=True, rope_type="norm"),
    "nemotron_h": dict(n_swa=0, swa_kind="none", recurrent=False, hybrid=True, rope_type="none"),
}


def test_traits_say_what_constrains_caching(arch_models, arch):
    with _engine(arch_models[arch]) as eng:
        t = eng.info.traits
        for key, value in EXPECTED_TRAITS[arch].items():
            assert getattr(t, key) == value, key
        stateful = arch in STATEFUL_ARCHITECTURES
        assert not t.mrope and t.can_shift  # llama.cpp can shift attention cells on all of them
        assert t.sliding == (arch == "gemma3")
        notes = t.notes()
        if arch == "gemma3":
            assert notes[0] == "warm runs from memory: exact (a forked resident prefix, in the cache's cells)"
        elif not stateful:
            assert notes[0] == "warm runs: exact (cells copied or kept where a cold run puts them)"
        if stateful:
            assert notes[0].startswith("warm runs: exact in prefix and chain modes (")
        if arch == "gemma3":
            assert any("approximate once the prefix is longer than the 8-token window" in n
                       for n in notes)
            assert t.restore_exact_tokens == WINDOW
        elif stateful:
            assert any(n.startswith("compose mode: refused (") for n in notes) and not t.can_trim
        else:
            assert "restore from a file or RAM snapshot: exact" in notes
        # the info JSON nests the traits, notes included
        info = json.loads(json.dumps(eng.info.as_dict()))
        assert info["traits"]["n_swa"] == t.n_swa and info["traits"]["notes"] == notes


@pytest.mark.parametrize("pattern, letters", [([True, False, False, True], "SFFS"),
                                              (None, "SSSS"), (3, "SSFS")])
def test_sliding_layers_read_from_a_list_a_period_or_llama_cpp_default(tmp_path, pattern, letters):
    """A per-layer list is not in llama.cpp's metadata strings: it is read from the file; no key
    at all means gemma3's built-in period of 6 (every layer of 4 slides)."""
    p = write_arch_model(tmp_path / "g.gguf", "gemma3", swa_pattern=pattern)
    with _engine(p) as eng:
        assert eng.info.traits.swa_pattern == letters
        assert eng.info.traits.swa_layers == letters.count("S")


# ---- what reuses a prefix exactly


@pytest.mark.parametrize("n_batch, prefix, suffix", [(32, 20, 8), (64, 100, 70)])
def test_prefix_then_suffix_twice_is_deterministic(arch_models, arch, n_batch, prefix, suffix):
    with _engine(arch_models[arch], n_batch) as eng:
        toks = eng.model.tokenize(TEXT)[:prefix + suffix]
        assert _diff(_cold(eng, toks, prefix), _cold(eng, toks, prefix)) == 0.0


@pytest.mark.parametrize("n_batch, prefix, suffix", [(32, 6, 8), (32, 40, 8), (64, 100, 70)])
def test_forked_resident_prefix_is_bit_identical_to_cold(arch_models, arch, n_batch, prefix, suffix):
    """seq_cp shares the prefix cells; the fork's suffix lands right after them, where a cold
    run puts it: exact on every architecture, window or recurrent state alike, also with
    batches of 64+ tokens (llama.cpp's other CPU path)."""
    with _engine(arch_models[arch], n_batch) as eng:
        toks = eng.model.tokenize(TEXT)[:prefix + suffix]
        cold = _cold(eng, toks, prefix)
        eng.clear_all()
        eng.evaluate(toks[:prefix], 0, want_logits=False)
        eng.seqs.fork(0, 1)
        assert _diff(eng.evaluate(toks[prefix:], 1), cold) == 0.0


@pytest.mark.parametrize("arch_name", ATTENTION_ARCHITECTURES)
@pytest.mark.parametrize("prefix, extra", [(6, 5), (20, 5), (40, 30)])
def test_resident_prefix_trimmed_back_is_bit_identical(arch_models, arch_name, prefix, extra):
    """A resident sequence that held more tokens, cut back with seq_rm: exact, also past the
    window (the window cache keeps out-of-window cells until it needs their room)."""
    with _engine(arch_models[arch_name]) as eng:
        toks = eng.model.tokenize(TEXT)
        suffix = toks[prefix:prefix + 8]
        cold = _cold(eng, toks[:prefix] + suffix, prefix)
        eng.clear_all()
        eng.evaluate(toks[:prefix] + toks[300:300 + extra], 0, want_logits=False)
        eng.seqs.trim(0, prefix)
        assert _diff(eng.evaluate(suffix, 0), cold) == 0.0


@pytest.mark.parametrize("arch_name", STATEFUL_ARCHITECTURES)
def test_recurrent_state_cannot_be_trimmed(arch_models, arch_name):
    with _engine(arch_models[arch_name]) as eng:
        toks = eng.model.tokenize(TEXT)
        eng.evaluate(toks[:20], 0, want_logits=False)
        with pytest.raises(ContextError, match="could not trim"):
            eng.seqs.trim(0, 10)


# ---- restoring a saved state


@pytest.mark.parametrize("arch_name", ("llama", "qwen2", "qwen3"))
@pytest.mark.parametrize("n_batch, prefix, suffix", [(32, 40, 8), (64, 100, 70)])
def test_restore_is_bit_identical_without_a_window(arch_models, arch_name, n_batch, prefix, suffix):
    with _engine(arch_models[arch_name], n_batch) as eng:
        toks = eng.model.tokenize(TEXT)[:prefix + suffix]
        cold = _cold(eng, toks, prefix)
        eng.clear_all()
        eng.evaluate(toks[:prefix], 0, want_logits=False)
        state = eng.sequence_state(0)
        eng.clear_all()
        eng.restore(state, 0)
        assert _diff(eng.evaluate(toks[prefix:], 0), cold) == 0.0


def _restored_then_suffix(eng: Engine, toks, prefix: int, saved: int):
    """Save ``saved`` tokens, restore them into a clear cache, trim to ``prefix``, add the rest."""
    eng.clear_all()
    eng.evaluate(toks[:saved], 0, want_logits=False)
    state = eng.sequence_state(0)
    eng.clear_all()
    eng.restore(state, 0)
    eng.seqs.trim(0, prefix)
    return eng.evaluate(toks[prefix:], 0)


def test_sliding_window_restore_is_exact_up_to_the_window_then_moves_cells(arch_models):
    """A state of a prefix longer than the window keeps only the window's cells, and llama.cpp
    puts them back at the start of the window cache instead of where a cold run has them.
    Suffix batches under 64 tokens do not care where cells lie: still exact. Batches of 64+
    do: past the window the logits move by as much as any change of place does (~1e-4 on
    this f32 model; a quantized model's noise floor is ~0.8): approximate, not wrong."""
    with _engine(arch_models["gemma3"], 32) as small, _engine(arch_models["gemma3"], 64) as big:
        toks = small.model.tokenize(TEXT)
        for prefix in (6, WINDOW, WINDOW + 1, 40):
            t = toks[:prefix + 8]
            assert _diff(_restored_then_suffix(small, t, prefix, prefix), _cold(small, t, prefix)) == 0.0
        within, past = [], []
        for prefix in range(4, 14):
            t = toks[:prefix + 70]
            d = _diff(_restored_then_suffix(big, t, prefix, prefix), _cold(big, t, prefix))
            (within if prefix <= WINDOW else past).append(d)
        assert within == [0.0] * len(within)
        assert any(d > 0 for d in past) and max(past) < 1e-3


@pytest.mark.parametrize("arch_name", ATTENTION_ARCHITECTURES)
@pytest.mark.parametrize("prefix, extra", [(6, 1), (6, 2), (6, 3), (20, 1), (20, 2), (20, 5), (40, 5)])
def test_restored_state_trimmed_to_a_shorter_prefix(arch_models, arch_name, prefix, extra):
    """A restored state of prefix + extra tokens, cut back to the prefix: with a window, the
    state lacks the window cells of positions prefix+extra-window .. prefix-window+1 that the
    shorter prefix needs (none when extra is 1 or everything fits in the window). That is a
    real error, 100x the placement noise: restore or fork the exact prefix instead."""
    with _engine(arch_models[arch_name]) as eng:
        toks = eng.model.tokenize(TEXT)[:prefix + 8]
        saved = eng.model.tokenize(TEXT)[:prefix + extra]
        cold = _cold(eng, toks, prefix)
        eng.clear_all()
        eng.evaluate(saved, 0, want_logits=False)
        state = eng.sequence_state(0)
        eng.clear_all()
        eng.restore(state, 0)
        eng.seqs.trim(0, prefix)
        d = _diff(eng.evaluate(toks[prefix:], 0), cold)
        loses_cells = arch_name == "gemma3" and extra >= 2 and prefix + extra > WINDOW
        if loses_cells:
            assert d > 5e-3
        else:
            assert d == 0.0


def test_recurrent_state_is_checked_as_such_and_restored_exactly(arch_models):
    """A recurrent sequence's state is one fixed-size record, not cells per token: our state
    checks read it as a recurrent model's (issue 23), and the restore is bit for bit; a state
    of another length is refused before it reaches llama.cpp."""
    with _engine(arch_models["mamba"]) as eng:
        toks = eng.model.tokenize(TEXT)[:48]
        cold = _cold(eng, toks, 40)
        eng.clear_all()
        eng.evaluate(toks[:40], 0, want_logits=False)
        state = eng.sequence_state(0)
        raw = eng.ctx.state_get(0)
        eng.evaluate(toks[40:44], 0, want_logits=False)
        assert len(eng.ctx.state_get(0)) == len(raw)  # the same size whatever the length
        eng.clear_all()
        with pytest.raises(KvPrimerError):  # its record stands at position 39, not 40
            eng.restore(dataclasses.replace(state, tokens=tuple(toks[:41])), 0)
        eng.restore(state, 0)
        assert _diff(eng.evaluate(toks[40:], 0), cold) == 0.0
