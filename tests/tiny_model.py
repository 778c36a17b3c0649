"""Writes a tiny random-weight llama GGUF (2 layers, 128 wide, head size 32 so that
quantized KV types fit, ~1 MB) that loads in
milliseconds, so unit tests exercise the real llama.cpp code paths without a real model.

Its vocabulary: <unk> <s> </s>, two chat-markup control tokens, the 256 byte tokens (so any
text tokenizes) and a few words with merges-like scores.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["▁the", "▁a", "▁hello", "▁world", "▁is", "▁of", "▁and", "▁to", "▁in", "▁question",
         "▁answer", "▁context", "▁you", "▁are", "▁helpful", "▁assistant", "he", "ll", "o", "▁"]
CONTROL = ["<|im_start|>", "<|im_end|>"]


def write_tiny_model(path: Path, *, n_embd: int = 128, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 256, n_ctx: int = 4096, seed: int = 7) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *CONTROL] + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.CONTROL] * len(CONTROL) + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.NORMAL] * len(WORDS))
    scores = [0.0] * (len(tokens) - len(WORDS)) + [-float(i) for i in range(len(WORDS))]
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvprimer-tiny")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def t(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head_dim = n_embd // n_head
    w.add_tensor("token_embd.weight", t(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", t(n_vocab, n_embd, scale=0.5))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
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


if __name__ == "__main__":  # python tests/tiny_model.py OUT.gguf
    import sys

    print(write_tiny_model(Path(sys.argv[1])))
