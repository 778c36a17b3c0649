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
- ``mamba``: recurrent (state-space) layers, no KV cells at all;
- ``mamba2``: Mamba 2 mixers (multi-head state space, grouped B and C): recurrent only;
- ``lfm2``: hybrid, short convolutions (a 2-token conv state) beside one attention layer;
- ``granitehybrid``: hybrid, Mamba 2 mixers and attention layers, each with a feed-forward;
- ``nemotron_h``: hybrid, Mamba 2, attention (no RoPE) and feed-forward-only layers;
- ``qwen35`` (in ``MORE_STATEFUL_ARCHITECTURES``): hybrid, three Gated DeltaNet layers (linear
  attention with a recurrent state) to one gated attention layer, with multi-axis RoPE.

The stateful ones (``STATEFUL_ARCHITECTURES``) have layouts of layers in
tests/tiny_stateful_layers.py (``LAYOUTS``); a hybrid marks its recurrent layers with 0 KV heads.

Tensor names and metadata keys are those llama.cpp's loader asks for (src/models/*.cpp).

The vocabulary: <unk> <s> </s>, two chat-markup control tokens, the 256 byte tokens (so any
text tokenizes) and a few words with merges-like scores.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.tiny_stateful_layers import DELTA_DIMS, LAYOUTS, write_recurrent_layer, write_ssm_keys

WORDS = ["▁the", "▁a", "▁hello", "▁world", "▁is", "▁of", "▁and", "▁to", "▁in", "▁question",
         "▁answer", "▁context", "▁you", "▁are", "▁helpful", "▁assistant", "he", "ll", "o", "▁"]
CONTROL = ["<|im_start|>", "<|im_end|>"]

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "mamba", "mamba2", "lfm2", "granitehybrid",
                 "nemotron_h")
# the architectures whose layers are all attention layers over a KV cache
ATTENTION_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
# the architectures that keep a recurrent state per sequence: llama.cpp calls the first two
# recurrent (no attention at all) and the others hybrid
RECURRENT_ARCHITECTURES = ("mamba", "mamba2")
HYBRID_ARCHITECTURES = ("lfm2", "granitehybrid", "nemotron_h")
STATEFUL_ARCHITECTURES = RECURRENT_ARCHITECTURES + HYBRID_ARCHITECTURES
# written and tested for what KV Primer says about them, but not in ARCHITECTURES (whose every
# architecture the caching tests run): Qwen3.5's multi-axis RoPE gives its cells extra fields,
# which state files refuse
MORE_STATEFUL_ARCHITECTURES = ("qwen35",)


def write_tiny_model(path: Path, *, n_embd: int = 128, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 256, n_ctx: int = 4096, seed: int = 7,
                     chat_template: str | None = None) -> Path:
    return write_arch_model(path, "llama", n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                            n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=n_ctx, seed=seed,
                            chat_template=chat_template)


class Weights:
    """How write_arch_model makes each tensor: random normal float32 (``t``), the 2-D
    attention, feed-forward and output matrices in ``weight_type`` (``mat``).
    bench/shaped_models.py's subclass writes real-sized matrices as random quantized blocks."""

    def __init__(self, w, seed: int, weight_type: str = "f32"):
        self.w = w
        self.rng = np.random.default_rng(seed)
        self.weight_type = weight_type

    def t(self, *shape, scale=0.2) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def mat(self, name: str, n_out: int, n_in: int, scale: float = 0.2) -> None:
        """A {n_in, n_out} weight (numpy shape (n_out, n_in)) in the model's weight type."""
        import gguf

        a = self.t(n_out, n_in, scale=scale)
        if self.weight_type == "f32":
            self.w.add_tensor(name, a)
        elif self.weight_type == "f16":
            self.w.add_tensor(name, a.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[self.weight_type.upper()]
            self.w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    def embedding(self, name: str, n_vocab: int, n_embd: int) -> None:
        self.w.add_tensor(name, self.t(n_vocab, n_embd, scale=1.0))


def write_tiny_vocab(w) -> int:
    """The tiny models' vocabulary (module docstring); returns its size."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *CONTROL] + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.CONTROL] * len(CONTROL) + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.NORMAL] * len(WORDS))
    scores = [0.0] * (len(tokens) - len(WORDS)) + [-float(i) for i in range(len(WORDS))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    return len(tokens)


def write_arch_model(path: Path, arch: str = "llama", *, n_embd: int = 128,
                     n_layer: int | None = None, n_head: int = 4, n_head_kv: int = 2,
                     n_ff: int = 256, n_ctx: int = 4096, seed: int = 7, n_swa: int = 8,
                     swa_pattern: int | list[bool] | None = 2, weight_type: str = "f32",
                     layout: str | None = None, head_dim: int | None = None,
                     rope_theta: float | None = None, delta: tuple[int, int, int] | None = None,
                     vocab=write_tiny_vocab, weights=Weights, tied_output: bool = False,
                     name: str | None = None, chat_template: str | None = None) -> Path:
    """A tiny random-weight model of ``arch`` (one of ARCHITECTURES).

    ``n_layer`` defaults to 4 for gemma3 (so its pattern S F S F shows) and 2 otherwise.
    ``n_swa`` and ``swa_pattern`` apply to gemma3: the window in tokens, and the period of the
    layer pattern (llama.cpp: a layer il slides when il % period < period - 1), or one flag a
    layer (True: slides), or None for no pattern key (llama.cpp then uses gemma3's period, 6).
    ``weight_type`` ("f32", "f16", or a gguf quantization such as "q4_0") is the type of the
    attention, feed-forward and output matrices: the types that AMX and repacked CPU kernels
    take (app/engine/cpu_kernels.py).
    ``layout`` (stateful architectures): one letter a layer, A attention, M Mamba (2) mixer,
    C short convolution, F feed-forward alone; LAYOUTS has each architecture's default, and
    ``n_layer`` is its length.

    For real shapes (bench/shaped_models.py): ``head_dim`` (default n_embd / n_head),
    ``rope_theta``, ``delta`` (Qwen3.5's DeltaNet head size, key heads, value heads),
    ``vocab(writer) -> n_vocab`` writes the tokenizer keys, ``weights(writer, seed,
    weight_type)`` makes the tensors (a ``Weights``), ``tied_output`` leaves output.weight out
    (llama.cpp then uses the token embeddings, as Llama 3.2 and Gemma 3 do).
    ``chat_template``: Jinja text stored as ``tokenizer.chat_template`` (None: no template,
    as in a GGUF converted without one).
    """
    import gguf

    writable = ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES
    if arch not in writable:
        raise ValueError(f"no tiny writer for {arch!r}; choose one of {', '.join(writable)}")
    if arch in RECURRENT_ARCHITECTURES and n_layer and not layout:
        layout = "M" * n_layer
    if arch in STATEFUL_ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES:
        layout = layout or LAYOUTS[arch]
        n_layer = len(layout)
    else:
        n_layer = n_layer or (4 if arch == "gemma3" else 2)
        layout = "A" * n_layer
    # lfm2, granitehybrid and nemotron_h mark recurrent layers with 0 KV heads; qwen35 by
    # its full_attention_interval
    heads_per_layer = arch in HYBRID_ARCHITECTURES
    head_dim = head_dim or n_embd // n_head
    delta = delta or DELTA_DIMS

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name or ("kvprimer-tiny" if arch == "llama" else f"kvprimer-tiny-{arch}"))
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    if arch in STATEFUL_ARCHITECTURES + MORE_STATEFUL_ARCHITECTURES:
        write_ssm_keys(w, arch, n_embd, delta)
    if arch not in RECURRENT_ARCHITECTURES:
        # a hybrid's recurrent layers have no KV heads (llama.cpp: is_recr = n_head_kv == 0);
        # Nemotron-H's feed-forward length is per layer, 0 where there is none
        w.add_feed_forward_length([n_ff if k == "F" else 0 for k in layout]
                                  if arch == "nemotron_h" else n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv([n_head_kv if k == "A" else 0 for k in layout] if heads_per_layer
                            else n_head_kv)
        w.add_rope_dimension_count(head_dim)
        if head_dim != n_embd // n_head:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
    if rope_theta:
        w.add_rope_freq_base(rope_theta)
    if arch == "qwen35":  # multi-axis RoPE: text uses the first section's rotation
        half = head_dim // 2
        w.add_array(f"{arch}.rope.dimension_sections", [half - 2 * (half // 3), half // 3, half // 3, 0])
    if arch == "nemotron_h":
        w.add_layer_norm_eps(1e-5)
    if arch == "gemma3":
        w.add_sliding_window(n_swa)
        if swa_pattern is not None:
            w.add_sliding_window_pattern(swa_pattern)
    w.add_layer_norm_rms_eps(1e-5 if arch != "gemma3" else 1e-6)
    n_vocab = vocab(w)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    ws = weights(w, seed, weight_type)
    t, mat = ws.t, ws.mat

    def ones(n):
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml's dimensions reversed: a {n_in, n_out} weight is (n_out, n_in)
    n_q = n_head * head_dim
    n_kv = n_head_kv * head_dim
    ws.embedding("token_embd.weight", n_vocab, n_embd)
    # LFM2's final norm has its own (historical) name
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", ones(n_embd))
    if not tied_output:
        mat("output.weight", n_vocab, n_embd, scale=0.5)
    for i, kind in enumerate(layout):
        blk = f"blk.{i}."
        w.add_tensor(blk + "attn_norm.weight", ones(n_embd))
        if arch == "qwen35":  # a norm after every mixer
            w.add_tensor(blk + "post_attention_norm.weight", ones(n_embd))
        if kind in "MCL":
            write_recurrent_layer(w, arch, kind, blk, n_embd, t, mat, delta)
        elif kind == "A":
            # Qwen3.5 projects a gate for the attention output beside each query
            mat(blk + "attn_q.weight", (2 if arch == "qwen35" else 1) * n_q, n_embd)
            mat(blk + "attn_k.weight", n_kv, n_embd)
            mat(blk + "attn_v.weight", n_kv, n_embd)
            if arch == "qwen2":
                w.add_tensor(blk + "attn_q.bias", t(n_q, scale=0.1))
                w.add_tensor(blk + "attn_k.bias", t(n_kv, scale=0.1))
                w.add_tensor(blk + "attn_v.bias", t(n_kv, scale=0.1))
            if arch in ("qwen3", "gemma3", "lfm2", "qwen35"):
                w.add_tensor(blk + "attn_q_norm.weight", ones(head_dim))
                w.add_tensor(blk + "attn_k_norm.weight", ones(head_dim))
            mat(blk + "attn_output.weight", n_embd, n_q)
            if arch == "gemma3":
                w.add_tensor(blk + "post_attention_norm.weight", ones(n_embd))
        if kind == "F":  # Nemotron-H: squared-ReLU feed-forward without a gate, no norm of its own
            mat(blk + "ffn_up.weight", n_ff, n_embd)
            mat(blk + "ffn_down.weight", n_embd, n_ff)
        elif arch not in RECURRENT_ARCHITECTURES and arch != "nemotron_h":
            # every other layer ends in a gated feed-forward, after a recurrent mixer too
            if arch != "qwen35":  # (whose post-attention norm is the feed-forward's)
                w.add_tensor(blk + "ffn_norm.weight", ones(n_embd))
            mat(blk + "ffn_gate.weight", n_ff, n_embd)
            mat(blk + "ffn_up.weight", n_ff, n_embd)
            mat(blk + "ffn_down.weight", n_embd, n_ff)
            if arch == "gemma3":
                w.add_tensor(blk + "post_ffw_norm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
