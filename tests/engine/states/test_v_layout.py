"""V's layout rewritten for the other attention kernel: the bytes a context with that kernel
writes itself (where they cannot depend on the kernel), loadable there, a `--format llama`
file that loads in llama.cpp's default context, and a state file primed with the other kernel
rewritten as it loads (saying so in one line). Tiny models, real llama.cpp calls."""
from __future__ import annotations

import ctypes
import json

import llama_cpp as L
import numpy as np
import pytest

from app.engine import Engine, EngineConfig, StateFileError, Template
from app.engine.states.seq_state_layout import parse
from app.engine.states.v_layout import (default_flash_attn, for_context, for_flash_attn,
                                        v_layout_of)
from app.engine.llama.native import ContextParams, NativeContext, NativeModel

TEXT = ("you are a helpful assistant. the context is: "
        + "hello world of the answer and question. " * 5 + "<question>")
TPL = Template.parse(TEXT)
SUFFIX = "the world is a question"


def _engine(model, fa: str, **kw) -> Engine:
    return Engine(EngineConfig(model_path=str(model), n_ctx=1024, n_batch=32, n_threads=1,
                               flash_attn=fa, **kw))


def _primed(model, fa: str, **kw):
    with _engine(model, fa, **kw) as eng:
        return eng.prime(TPL)


def _desc(state):
    return parse(state.data, state.seq_state_version)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "lfm2"])
def test_the_rewritten_state_is_laid_out_as_the_other_kernel_writes_it(arch_models, arch):
    off, on = _primed(arch_models[arch], "off"), _primed(arch_models[arch], "on")
    for src, dst, fa in ((off, on, True), (on, off, False)):
        got = for_flash_attn(src, fa)
        a, b = _desc(got), _desc(dst)
        assert v_layout_of(a) is (not fa) and len(got.data) == len(dst.data)
        assert len(a.kv) == len(b.kv) and (a.recurrent is None) == (b.recurrent is None)
        for block_a, block_b in zip(a.kv, b.kv):
            for sa, sb in zip(block_a.streams, block_b.streams):
                assert np.array_equal(sa.positions, sb.positions)
                assert [v.data.shape for v in sa.v] == [v.data.shape for v in sb.v]
        # the first attention layer's K and V come from the embeddings alone, before any
        # attention ran: the same values whichever kernel computed the rest
        sa, sb = a.first_stream, b.first_stream
        assert np.array_equal(sa.k[0].data, sb.k[0].data)
        assert np.array_equal(sa.v[0].data, sb.v[0].data)
        assert for_flash_attn(got, not fa).data == src.data  # and back, byte for byte
        assert for_flash_attn(src, not fa) is src  # already so: left alone


def test_the_rewritten_state_restores_under_the_other_kernel_and_answers_alike(tiny_model):
    off = _primed(tiny_model, "off")
    with _engine(tiny_model, "on") as on:
        with pytest.raises(StateFileError, match="flash attention off"):
            on.check_state(off)  # as primed: refused
        suffix = on.model.tokenize(SUFFIX)
        on.restore(for_flash_attn(off, True), 1)
        warm = on.evaluate(suffix, 1)
        on.seqs.clear(2)
        on.evaluate(list(off.tokens), 2, want_logits=False)
        cold = on.evaluate(suffix, 2)
    # the prefix was computed with the other kernel, so close but not bit for bit
    assert int(np.argmax(warm)) == int(np.argmax(cold))
    assert np.max(np.abs(warm - cold)) < 0.05 * np.max(np.abs(cold))


def test_a_quantized_v_cache_cannot_be_stored_for_flash_attention_off(tiny_model):
    state = _primed(tiny_model, "on", type_k="q8_0", type_v="q8_0")
    with pytest.raises(StateFileError) as e:
        for_flash_attn(state, False)
    msg = str(e.value)
    assert "q8_0" in msg and "flash attention on" in msg and "\n" not in msg
    assert for_flash_attn(state, True) is state


def test_llama_cpps_default_turns_flash_attention_on_on_this_cpu(tiny_model):
    model = NativeModel(tiny_model)
    try:
        assert default_flash_attn(model) is True
    finally:
        model.close()


def _load_file(ctx_ptr, path, cap: int) -> int:
    toks = (L.llama_token * cap)()
    n = ctypes.c_size_t(0)
    return L.llama_state_seq_load_file(ctx_ptr, str(path).encode(), 0, toks, cap, ctypes.byref(n))


def test_a_llama_format_file_from_flash_attention_off_loads_in_llama_cpps_default_context(
        tiny_model, tmp_path, monkeypatch, capsys):
    from app.cli import main

    monkeypatch.setenv("KVPRIMER_FLASH_ATTN", "off")  # primed here with flash attention off
    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TEXT)
    common = ["-m", str(tiny_model), "-c", "1024", "-b", "32", "-t", "1"]
    for name, extra in (("default.bin", []), ("off.bin", ["--for-fa", "off"])):
        assert main(["prime", str(tpl), "-o", str(tmp_path / name), "--format", "llama",
                     "--json", *extra, *common]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["for_flash_attn"] is (name == "default.bin")
    model = NativeModel(tiny_model)
    try:
        # llama.cpp's default context: flash attention auto, as llama-server's -fa auto
        ctx = NativeContext(model, ContextParams(n_ctx=1024, n_batch=32, n_threads=1,
                                                 flash_attn=None))
        try:
            size = (tmp_path / "default.bin").stat().st_size
            assert _load_file(ctx.ptr, tmp_path / "default.bin", 512) == size
            ctx.clear()
            assert _load_file(ctx.ptr, tmp_path / "off.bin", 512) == 0  # "incompatible V"
        finally:
            ctx.close()
    finally:
        model.close()
    # llama-cpp-python's Llama() leaves flash attention off unless asked: --for-fa off is its
    llm = L.Llama(str(tiny_model), n_ctx=1024, n_batch=32, verbose=False)
    try:
        size = (tmp_path / "off.bin").stat().st_size
        assert _load_file(llm.ctx, tmp_path / "off.bin", 512) == size
    finally:
        llm.close()


def test_for_fa_without_the_llama_format_is_refused_before_the_model_loads(tmp_path, capsys):
    from app.cli import main

    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TEXT)
    assert main(["prime", str(tpl), "-o", str(tmp_path / "x.kvstate"), "--for-fa", "on",
                 "-m", str(tmp_path / "no-such-model.gguf")]) == 2
    err = capsys.readouterr().err
    assert "--format llama" in err and err.count("\n") == 1


def test_a_sliding_window_state_has_both_caches_rewritten(arch_models):
    """The engine keeps flash attention on for sliding-window models; their states still
    load in a llama.cpp context without it once rewritten (both caches: full and window)."""
    on = _primed(arch_models["gemma3"], "on")
    off = for_flash_attn(on, False)
    desc = _desc(off)
    assert len(desc.kv) == 2
    assert [s.v_trans for b in desc.kv for s in b.streams if s.n_cells] == [True, True]
    assert for_flash_attn(off, True).data == on.data
    model = NativeModel(arch_models["gemma3"])
    try:
        ctx = NativeContext(model, ContextParams(n_ctx=1024, n_batch=32, n_threads=1,
                                                 n_seq_max=1, flash_attn=False))
        try:
            assert ctx.state_set(off.data, 0)
            ctx.clear()
            assert not ctx.state_set(on.data, 0)  # "incompatible V transposition"
        finally:
            ctx.close()
    finally:
        model.close()


@pytest.mark.parametrize("primed, runs", [("off", "on"), ("on", "off")])
def test_a_state_primed_with_the_other_kernel_is_rewritten_as_it_loads(tiny_model, tmp_path,
                                                                      primed, runs):
    from app.engine import state_flows
    from app.engine.runs.prompt_runs import run_prompt
    from app.engine.states.llama_state_file import read_any_state, save_state

    state = _primed(tiny_model, primed)
    save_state(state, tmp_path / "s.kvstate")
    save_state(state, tmp_path / "s.bin", "llama")
    with _engine(tiny_model, runs) as eng:
        for name in ("s.kvstate", "s.bin"):
            loaded = eng.load_state(tmp_path / name)
            # exact: the same values, moved to the layout this kernel keeps
            as_read = read_any_state(tmp_path / name)
            assert loaded.data == for_flash_attn(as_read, runs == "on").data != as_read.data
            assert loaded.note == f"rewritten for flash attention {runs}"
            assert loaded.note in loaded.warning and "\n" not in loaded.warning
            assert loaded.tokens == state.tokens
            eng.restore(loaded, 1)  # llama.cpp takes it
            assert eng.seq_tokens[1] == list(state.tokens)
            eng.seqs.clear(1)
        # the session's load (window and --state): adopted into the cache, and a run reuses it
        loaded = state_flows.load_state(eng, tmp_path / "s.kvstate", TPL)
        assert loaded.note == f"rewritten for flash attention {runs}"
        # read and rewritten once, not placed from the page cache (that would need it as is)
        assert eng.work.tokens == []
        report = run_prompt(eng, TPL, {"question": SUFFIX}, reuse="prefix", cold=False)
        assert report.reused_tokens == state.n_tokens
    with _engine(tiny_model, primed) as eng:  # its own kernel: nothing to rewrite or say
        same = eng.load_state(tmp_path / "s.kvstate")
        assert same.data == state.data and same.note == "" and same.warning == ""


def test_the_cli_says_in_one_line_that_a_loaded_state_was_rewritten(tiny_model, tmp_path,
                                                                    monkeypatch, capsys):
    from app.cli import main

    _primed(tiny_model, "off").save(tmp_path / "off.kvstate")
    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TEXT)
    monkeypatch.setenv("KVPRIMER_FLASH_ATTN", "on")
    assert main(["run", str(tpl), "--state", str(tmp_path / "off.kvstate"), "--set",
                 f"question={SUFFIX}", "--warm", "-n", "2", "-m", str(tiny_model),
                 "-c", "1024", "-b", "32", "-t", "1"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "rewritten" in ln]
    assert notes == ["kvprimer: note: rewritten for flash attention on"], err


def test_a_quantized_v_that_would_need_rewriting_stays_a_one_line_refusal(tiny_model):
    state = _primed(tiny_model, "on", type_k="q8_0", type_v="q8_0")
    assert for_context(state, True) is state and for_context(state, None) is state
    with pytest.raises(StateFileError) as e:
        for_context(state, False)
    msg = str(e.value)
    assert "q8_0" in msg and "flash attention on" in msg and "\n" not in msg


@pytest.mark.parametrize("type_id, el", [(1, 2), (0, 4)])
@pytest.mark.parametrize("cells", [1, 255, 256, 700])
def test_v_is_transposed_a_block_of_cells_at_a_time_to_the_same_bytes(type_id, el, cells):
    """V turned for flash attention off in blocks of cells (4.8x numpy's whole-array transpose
    at 8k cells of 512 f16 elements) is the plain transpose, whatever the last block holds, and
    turning it back gives the rows it came from."""
    from app.engine.states.seq_state_layout import Rows
    from app.engine.states.v_layout import _rows

    rng = np.random.default_rng(cells)
    rows = Rows(type_id, rng.integers(0, 256, (cells, 24 * el), dtype=np.uint8))
    t = _rows(rows, True)
    words = rows.data.view(f"<u{el}")
    assert t.transposed and t.data.dtype == words.dtype
    assert np.array_equal(t.data, words.T) and t.data.flags.c_contiguous
    back = _rows(t, False)
    assert not back.transposed and np.array_equal(back.data, rows.data)
