"""llama.cpp's own per-sequence state file: ours loads in llama.cpp's loader, llama.cpp's loads
through ours, and bad files give one-line errors. Tiny model, real llama.cpp calls."""
import ctypes
from dataclasses import replace

import llama_cpp as L
import numpy as np
import pytest

from app.engine import Engine, EngineConfig, PrefixState, StateFileError, Template
from app.engine.states.llama_state_file import (load_any_state, save_llama_state, save_state)
from app.engine.llama.native import ContextParams, NativeContext, NativeModel
from app.engine.states.prefix_state import NO_IDENTITY_NOTE
from tests.tiny_model import write_tiny_model

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 6
                     + "\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
PARAMS = ContextParams(n_ctx=1024, n_batch=32, n_threads=1)
SUFFIX = "the world is a question"


def _engine(model):
    return Engine(EngineConfig(model_path=str(model), n_ctx=PARAMS.n_ctx, n_batch=PARAMS.n_batch,
                               n_threads=1))


def primed_kernel(model) -> bool | None:
    """The flash attention setting the engine measured for this model (cached)."""
    with _engine(model) as e:
        return e.kernels.flash_attn


def _decode(ctx: NativeContext, tokens, start: int, seq: int = 0) -> np.ndarray:
    """Evaluate ``tokens`` from position ``start`` in batches of n_batch; the last logits."""
    nb = PARAMS.n_batch
    for a in range(0, len(tokens), nb):
        chunk = tokens[a:a + nb]
        ctx.decode([(t, start + a + i, (seq,), a + i == len(tokens) - 1)
                    for i, t in enumerate(chunk)])
    return ctx.logits(-1)


def _seq_of(eng, state) -> int:
    """The sequence of the radix cache's node holding exactly ``state``'s tokens."""
    node = eng.cache.lookup(list(state.tokens)).node
    assert node.depth == state.n_tokens and eng.seq_tokens[node.seq] == list(state.tokens)
    return node.seq


@pytest.fixture
def primed(tiny_model):
    """An engine with TPL's prefix primed (in the radix cache), its state, and the suffix tokens."""
    eng = _engine(tiny_model)
    state = eng.prime(TPL)
    suffix = eng.model.tokenize(SUFFIX)
    yield eng, state, suffix
    eng.close()


def _cold_logits(eng, state, suffix) -> np.ndarray:
    eng.seqs.clear(1)
    eng.evaluate(list(state.tokens), 1, want_logits=False)
    return eng.evaluate(suffix, 1)


def test_our_export_loads_in_llama_cpps_own_loader(primed, tiny_model, tmp_path):
    eng, state, suffix = primed
    path = tmp_path / "slot.bin"
    size = save_llama_state(state, path)
    assert size == path.stat().st_size
    expected = _cold_logits(eng, state, suffix)

    model = NativeModel(tiny_model)
    # fresh context, llama.cpp's own file loader, with the engine's attention kernel (it
    # decides V's layout)
    ctx = NativeContext(model, replace(PARAMS, flash_attn=primed_kernel(tiny_model)))
    try:
        cap = state.n_tokens + 16
        toks = (L.llama_token * cap)()
        n = ctypes.c_size_t(0)
        read = L.llama_state_seq_load_file(ctx.ptr, str(path).encode(), 0, toks, cap, ctypes.byref(n))
        assert read == size and n.value == state.n_tokens
        assert list(toks[:n.value]) == list(state.tokens)
        got = _decode(ctx, suffix, n.value)
    finally:
        ctx.close()
        model.close()
    assert np.array_equal(got, expected)


def test_our_bytes_equal_what_llama_cpp_writes(primed, tmp_path):
    eng, state, _ = primed
    theirs = tmp_path / "theirs.bin"
    toks = (L.llama_token * state.n_tokens)(*state.tokens)
    n = L.llama_state_seq_save_file(eng.ctx.ptr, str(theirs).encode(), _seq_of(eng, state), toks,
                                    state.n_tokens)
    save_llama_state(state, tmp_path / "ours.bin")
    assert n == theirs.stat().st_size
    assert (tmp_path / "ours.bin").read_bytes() == theirs.read_bytes()


def test_a_file_llama_cpp_wrote_loads_through_ours_bit_identically(tiny_model, tmp_path):
    path = tmp_path / "server-slot.bin"
    eng = _engine(tiny_model)
    try:
        prefix = eng.tokenize(TPL.prefix_prompt())
        model = NativeModel(tiny_model)
        # another context writes the file, as a server would (with the engine's kernel)
        ctx = NativeContext(model, replace(PARAMS, flash_attn=primed_kernel(tiny_model)))
        try:
            _decode(ctx, prefix, 0)
            arr = (L.llama_token * len(prefix))(*prefix)
            assert L.llama_state_seq_save_file(ctx.ptr, str(path).encode(), 0, arr, len(prefix)) > 0
        finally:
            ctx.close()
            model.close()

        state = load_any_state(eng, path, TPL)
        assert state.origin == "llama.cpp" and state.warning == NO_IDENTITY_NOTE
        assert list(state.tokens) == prefix and (state.type_k, state.type_v) == ("f16", "f16")
        suffix = eng.model.tokenize(SUFFIX)
        eng.restore(state, 2)
        warm = eng.evaluate(suffix, 2)
        assert np.array_equal(warm, _cold_logits(eng, state, suffix))
    finally:
        eng.close()


def test_either_format_is_read_by_content(primed, tmp_path):
    eng, state, _ = primed
    save_state(state, tmp_path / "a.bin", "kvprimer")
    save_state(state, tmp_path / "b.kvstate", "llama")  # names do not decide
    ours, theirs = eng.load_state(tmp_path / "a.bin"), eng.load_state(tmp_path / "b.kvstate")
    assert ours.origin == "kvprimer" and ours.warning == ""
    assert theirs.origin == "llama.cpp" and theirs.tokens == state.tokens
    # the in-memory form's 8-byte head names the source sequence, which a file does not keep
    assert theirs.data[8:] == state.data[8:] and len(theirs.data) == len(state.data)
    with pytest.raises(StateFileError, match="no model identity"):
        theirs.save(tmp_path / "c.kvstate")
    with pytest.raises(StateFileError, match="unknown state format 'gguf'"):
        save_state(state, tmp_path / "d", "gguf")


def test_another_models_file_is_refused_by_its_row_sizes(primed, tmp_path):
    eng, state, _ = primed
    path = tmp_path / "other.bin"
    save_llama_state(state, path)
    narrow = write_tiny_model(tmp_path / "narrow.gguf", n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    other = _engine(narrow)
    try:
        with pytest.raises(StateFileError, match="bytes of K/V per token .* another model"):
            other.load_state(path)
    finally:
        other.close()
    deep = write_tiny_model(tmp_path / "deep.gguf", n_layer=3)
    other = _engine(deep)
    try:
        with pytest.raises(StateFileError, match="rows for 2 layers but the model has 3"):
            other.load_state(path)
    finally:
        other.close()


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_truncated_garbage_and_bad_tokens_give_one_line_errors(primed, tmp_path):
    eng, state, _ = primed
    path = tmp_path / "s.bin"
    save_llama_state(state, path)
    raw = path.read_bytes()
    cases = {
        "truncated": raw[:len(raw) // 2],
        "tokens cut": raw[:12 + 4 * state.n_tokens - 8],
        "no data": raw[:12 + 4 * state.n_tokens],
        "header": raw[:6],
        "garbage": b"\x00junk" * 100,
        "zero tokens": raw[:8] + b"\x00\x00\x00\x00" + raw[12 + 4 * state.n_tokens:],
    }
    out_of_vocab = bytearray(raw)
    out_of_vocab[12 + 4 * 3:12 + 4 * 4] = (eng.info.n_vocab + 5).to_bytes(4, "little")
    cases["out of vocab"] = bytes(out_of_vocab)
    negative = bytearray(raw)
    negative[12:16] = (-3).to_bytes(4, "little", signed=True)
    cases["negative"] = bytes(negative)
    version = bytearray(raw)
    version[4] = 99
    cases["version"] = bytes(version)
    expect = {"truncated": "malformed", "tokens cut": "truncated", "no data": "truncated",
              "header": "truncated", "garbage": "neither", "zero tokens": "no tokens",
              "out of vocab": "outside this model's vocabulary", "negative": "negative",
              "version": "version 99"}
    for name, data in cases.items():
        path.write_bytes(data)
        with pytest.raises(StateFileError) as e:
            eng.load_state(path)
        assert expect[name] in _one_line(e), (name, str(e.value))
    path.write_bytes(raw)
    assert eng.load_state(path).tokens == state.tokens  # and the good file still loads


def test_a_state_for_another_prompt_is_refused_with_a_template(primed, tmp_path):
    eng, state, _ = primed
    path = tmp_path / "s.bin"
    save_llama_state(state, path)
    assert load_any_state(eng, path, TPL).tokens == state.tokens
    other = Template.parse("<|im_start|>system\nyou are a question. the answer is:\n"
                           + "world hello. " * 8 + "<q>")
    with pytest.raises(StateFileError, match="differ from the template's static prefix at token") as e:
        load_any_state(eng, path, other)
    _one_line(e)
    assert isinstance(load_any_state(eng, path), PrefixState)  # no template: no prefix check


def test_context_too_small_for_the_tokens(primed, tiny_model, tmp_path):
    _, state, _ = primed
    path = tmp_path / "s.bin"
    save_llama_state(state, path)
    small = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=16, n_batch=16, n_threads=1))
    try:
        with pytest.raises(StateFileError, match="raise the context size"):
            small.load_state(path)
    finally:
        small.close()


def test_sliding_window_model_files_hold_both_caches(tmp_path):
    """On an iSWA model the state has a full-attention and a window block; both round-trip
    (whether a restore past the window is exact is the engine's business, not the file's)."""
    from app.engine.states.seq_payload import row_layout
    from tests.tiny_model import write_arch_model

    eng = _engine(write_arch_model(tmp_path / "g.gguf", "gemma3"))
    try:
        state = eng.prime(TPL)
        assert len(row_layout(state.data)) == 2
        ours, theirs = tmp_path / "ours.bin", tmp_path / "theirs.bin"
        save_llama_state(state, ours)
        toks = (L.llama_token * state.n_tokens)(*state.tokens)
        L.llama_state_seq_save_file(eng.ctx.ptr, str(theirs).encode(), _seq_of(eng, state), toks,
                                    state.n_tokens)
        assert ours.read_bytes() == theirs.read_bytes()
        back = load_any_state(eng, theirs, TPL)
        assert back.data[8:] == state.data[8:] and back.origin == "llama.cpp"
        eng.restore(back, 3)
        assert eng.seq_tokens[3] == list(state.tokens)
    finally:
        eng.close()


def test_a_state_saved_with_the_other_attention_kernel_loads_rewritten_not_as_it_is(
        tiny_model, tmp_path):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn="off")) as off:
        state = off.prime(TPL)
        save_state(state, tmp_path / "off.kvstate")
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn="on")) as on:
        # loading rewrites V for this kernel (tests/engine/states/test_v_layout.py) ...
        assert on.load_state(tmp_path / "off.kvstate").note == "rewritten for flash attention on"
        # ... while the bytes as primed are still one clear error, never given to llama.cpp
        with pytest.raises(StateFileError, match="saved with flash attention off.*runs it on"):
            on.restore(state, 1)
