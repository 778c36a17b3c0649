"""Tiny random-weight GGUF models that load in milliseconds, so unit tests exercise the real
llama.cpp code paths without a real model.

``write_tiny_model``: llama, 2 layers, 128 wide, head size 32 (so that quantized KV types fit),
~1 MB. ``write_arch_model(path, arch)`` writes the same kind of model for each architecture in
``ARCHITECTURES``, each with what makes it different for the KV cache:

- ``llama``: plain causal attention (the same file as ``write_tiny_model``);
- ``qwen2``: biases on the Q, K and V projections, NeoX RoPE;
- ``qwen3``: RMS norms on Q and K per head;
- ``gemma3``: interleaved sliding-window attention (layers S F S F: a window of ``n_swa``
  tokens, 8 by default, so a short prompt already crosses it) with post-norms and GELU;
- ``mamba``: recurrent (state-space) layers, no KV cells at all.

Tensor names and metadata keys are those llama.cpp's loader asks for (src/models/*.cpp).

The vocabulary: <unk> <s> </s>, two chat-markup control tokens, the 256 byte tokens (so any
text tokenizes) and a few words with merges-like scores.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["▁the", "▁a", "▁hello", "▁world", "▁is", "▁of", "▁and", "▁to", "▁in", "▁question",
         "▁answer", "▁context", "▁you", "▁are", "▁helpful", "▁assistant", "he", "ll", "o", "▁"]
CONTROL = ["<|im_start|>", "<|im_end|>"]

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "mamba")
# the architectures whose layers are all attention layers over a KV cache
ATTENTION_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


def write_tiny_model(path: Path, *, n_embd: int = 128, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 256, n_ctx: int = 4096, seed: int = 7) -> Path:
    return write_arch_model(path, "llama", n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                            n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=n_ctx, seed=seed)


def write_arch_model(path: Path, arch: str = "llama", *, n_embd: int = 128,
                     n_layer: int | None = None, n_head: int = 4, n_head_kv: int = 2,
                     n_ff: int = 256, n_ctx: int = 4096, seed: int = 7, n_swa: int = 8,
                     swa_pattern: int | list[bool] | None = 2, weight_type: str = "f32") -> Path:
    """A tiny random-weight model of ``arch`` (one of ARCHITECTURES).

    ``n_layer`` defaults to 4 for gemma3 (so its pattern S F S F shows) and 2 otherwise.
    ``n_swa`` and ``swa_pattern`` apply to gemma3: the window in tokens, and the period of the
    layer pattern (llama.cpp: a layer il slides when il % period < period - 1), or one flag a
    layer (True: slides), or None for no pattern key (llama.cpp then uses gemma3's period, 6).
    ``weight_type`` ("f32", "f16", or a gguf quantization such as "q4_0") is the type of the
    attention, feed-forward and output matrices: the types that AMX and repacked CPU kernels
    take (app/engine/cpu_kernels.py).
    """
    import gguf

    if arch not in ARCHITECTURES:
        raise ValueError(f"no tiny writer for {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    if n_layer is None:
        n_layer = 4 if arch == "gemma3" else 2
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *CONTROL] + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.CONTROL] * len(CONTROL) + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.NORMAL] * len(WORDS))
    scores = [0.0] * (len(tokens) - len(WORDS)) + [-float(i) for i in range(len(WORDS))]
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("kvprimer-tiny" if arch == "llama" else f"kvprimer-tiny-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    if arch == "mamba":
        _mamba_keys(w, n_embd)
    else:
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(n_embd // n_head)
    if arch == "gemma3":
        w.add_sliding_window(n_swa)
        if swa_pattern is not None:
            w.add_sliding_window_pattern(swa_pattern)
    w.add_layer_norm_rms_eps(1e-5 if arch != "gemma3" else 1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def t(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    def mat(name, a):  # a 2-D weight in the model's weight type
        if weight_type == "f32":
            w.add_tensor(name, a)
        elif weight_type == "f16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[weight_type.upper()]
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    # numpy shapes are ggml's dimensions reversed: a {n_in, n_out} weight is (n_out, n_in)
    head_dim = n_embd // n_head
    n_kv = n_head_kv * head_dim
    w.add_tensor("token_embd.weight", t(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", ones(n_embd))
    mat("output.weight", t(n_vocab, n_embd, scale=0.5))
    for i in range(n_layer):
        blk = f"blk.{i}."
        w.add_tensor(blk + "attn_norm.weight", ones(n_embd))
        if arch == "mamba":
            _mamba_layer(w, blk, n_embd, t)
            continue
        mat(blk + "attn_q.weight", t(n_embd, n_embd))
        mat(blk + "attn_k.weight", t(n_kv, n_embd))
        mat(blk + "attn_v.weight", t(n_kv, n_embd))
        if arch == "qwen2":
            w.add_tensor(blk + "attn_q.bias", t(n_embd, scale=0.1))
            w.add_tensor(blk + "attn_k.bias", t(n_kv, scale=0.1))
            w.add_tensor(blk + "attn_v.bias", t(n_kv, scale=0.1))
        if arch in ("qwen3", "gemma3"):
            w.add_tensor(blk + "attn_q_norm.weight", ones(head_dim))
            w.add_tensor(blk + "attn_k_norm.weight", ones(head_dim))
        mat(blk + "attn_output.weight", t(n_embd, n_embd))
        if arch == "gemma3":
            w.add_tensor(blk + "post_attention_norm.weight", ones(n_embd))
        w.add_tensor(blk + "ffn_norm.weight", ones(n_embd))
        mat(blk + "ffn_gate.weight", t(n_ff, n_embd))
        mat(blk + "ffn_up.weight", t(n_ff, n_embd))
        mat(blk + "ffn_down.weight", t(n_embd, n_ff))
        if arch == "gemma3":
            w.add_tensor(blk + "post_ffw_norm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Mamba: inner size 2 × n_embd (the only expansion llama.cpp supports), state 16, conv 4.
_D_STATE, _D_CONV, _DT_RANK = 16, 4, 8


def _mamba_keys(w, n_embd: int) -> None:
    w.add_ssm_conv_kernel(_D_CONV)
    w.add_ssm_inner_size(2 * n_embd)
    w.add_ssm_state_size(_D_STATE)
    w.add_ssm_time_step_rank(_DT_RANK)


def _mamba_layer(w, blk: str, n_embd: int, t) -> None:
    d_inner = 2 * n_embd
    w.add_tensor(blk + "ssm_in.weight", t(2 * d_inner, n_embd))
    w.add_tensor(blk + "ssm_conv1d.weight", t(d_inner, _D_CONV))
    w.add_tensor(blk + "ssm_conv1d.bias", t(d_inner, scale=0.1))
    w.add_tensor(blk + "ssm_x.weight", t(_DT_RANK + 2 * _D_STATE, d_inner))
    w.add_tensor(blk + "ssm_dt.weight", t(d_inner, _DT_RANK))
    w.add_tensor(blk + "ssm_dt.bias", t(d_inner, scale=0.1))
    # A is stored as -exp(A_log): negative, so the state decays instead of blowing up
    w.add_tensor(blk + "ssm_a", -np.exp(t(d_inner, _D_STATE, scale=0.5)))
    w.add_tensor(blk + "ssm_d", np.ones(d_inner, dtype=np.float32))
    w.add_tensor(blk + "ssm_out.weight", t(n_embd, d_inner))


def write_unknown_arch_model(path: Path) -> Path:
    """A well-formed GGUF of an architecture llama.cpp does not know: it passes our own checks,
    and llama.cpp refuses it with its own words."""
    import gguf

    w = gguf.GGUFWriter(str(path), "no-such-arch")
    w.add_tensor("x.weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":  # python tests/tiny_model.py OUT.gguf [ARCH]
    import sys

    print(write_arch_model(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "llama"))
