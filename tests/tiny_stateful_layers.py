"""The recurrent parts of the tiny test models (tests/tiny_model.py): metadata keys and tensors
of Mamba's and Mamba 2's mixers and of LFM2's short convolution, with the shapes llama.cpp's
loader asks for (src/models/mamba*.cpp, granite-hybrid.cpp, nemotron-h.cpp, lfm2.cpp).

A model's layers are written as letters: A attention, M a Mamba (2) mixer, C a short
convolution, L linear attention (Qwen3.5's Gated DeltaNet), F a feed-forward block alone
(Nemotron-H). Numpy shapes are ggml's dimensions
reversed: a {n_in, n_out} weight is (n_out, n_in).
"""
from __future__ import annotations

import numpy as np

# each stateful architecture's default layers: hybrids mix attention with recurrent layers in
# different proportions, so that counting attention layers right shows in the numbers
LAYOUTS = {
    "mamba": "MM",
    "mamba2": "MM",
    "lfm2": "CACC",           # 1 attention layer, 3 short convolutions
    "granitehybrid": "MAMA",  # 2 attention layers, 2 Mamba 2 mixers (each with a feed-forward)
    "nemotron_h": "MAMF",     # Mamba 2, attention, Mamba 2, feed-forward alone
    "qwen35": "LLLA",         # Gated DeltaNet ×3, then attention: llama.cpp's default interval 4
}

# Mamba: inner size 2 × n_embd (the only expansion llama.cpp supports), state 16, conv 4.
D_STATE, D_CONV, DT_RANK = 16, 4, 8
# Mamba 2: 8 heads (time_step_rank) over the inner size, one group of B and C
SSM_HEADS, SSM_GROUPS = 8, 1
# LFM2: the convolution sees the current token and the 2 before it
SHORTCONV_L_CACHE = 3
# Qwen3.5's Gated DeltaNet: 2 key heads and 4 value heads of 16 (ssm.group_count and
# ssm.time_step_rank), a convolution of 4 over Q, K and V
DELTA_HEAD, DELTA_K_HEADS, DELTA_V_HEADS = 16, 2, 4
# (head size, key heads, value heads): the tiny default; bench/shaped_models.py gives real ones
DELTA_DIMS = (DELTA_HEAD, DELTA_K_HEADS, DELTA_V_HEADS)


def write_ssm_keys(w, arch: str, n_embd: int, delta: tuple[int, int, int] = DELTA_DIMS) -> None:
    """The ssm.* keys (Mamba and Mamba 2 mixers) or shortconv.* (LFM2); ``delta``: the Gated
    DeltaNet's (head size, key heads, value heads)."""
    if arch == "lfm2":
        w.add_uint32(f"{arch}.shortconv.l_cache", SHORTCONV_L_CACHE)
        return
    if arch == "qwen35":
        head, k_heads, v_heads = delta
        w.add_ssm_conv_kernel(D_CONV)
        w.add_ssm_inner_size(head * v_heads)
        w.add_ssm_state_size(head)
        w.add_ssm_time_step_rank(v_heads)
        w.add_uint32(f"{arch}.ssm.group_count", k_heads)
        w.add_uint32(f"{arch}.full_attention_interval", 4)
        return
    w.add_ssm_conv_kernel(D_CONV)
    w.add_ssm_inner_size(2 * n_embd)
    w.add_ssm_state_size(D_STATE)
    if arch == "mamba":
        w.add_ssm_time_step_rank(DT_RANK)
    else:
        w.add_ssm_time_step_rank(SSM_HEADS)
        w.add_uint32(f"{arch}.ssm.group_count", SSM_GROUPS)


def write_mamba_mixer(w, blk: str, n_embd: int, t) -> None:
    d_inner = 2 * n_embd
    w.add_tensor(blk + "ssm_in.weight", t(2 * d_inner, n_embd))
    w.add_tensor(blk + "ssm_conv1d.weight", t(d_inner, D_CONV))
    w.add_tensor(blk + "ssm_conv1d.bias", t(d_inner, scale=0.1))
    w.add_tensor(blk + "ssm_x.weight", t(DT_RANK + 2 * D_STATE, d_inner))
    w.add_tensor(blk + "ssm_dt.weight", t(d_inner, DT_RANK))
    w.add_tensor(blk + "ssm_dt.bias", t(d_inner, scale=0.1))
    # A is stored as -exp(A_log): negative, so the state decays instead of blowing up
    w.add_tensor(blk + "ssm_a", -np.exp(t(d_inner, D_STATE, scale=0.5)))
    w.add_tensor(blk + "ssm_d", np.ones(d_inner, dtype=np.float32))
    w.add_tensor(blk + "ssm_out.weight", t(n_embd, d_inner))


def write_mamba2_mixer(w, blk: str, n_embd: int, t) -> None:
    d_inner = 2 * n_embd
    conv_dim = d_inner + 2 * SSM_GROUPS * D_STATE
    # the input projection makes z, x, B, C and one dt per head
    w.add_tensor(blk + "ssm_in.weight", t(d_inner + conv_dim + SSM_HEADS, n_embd))
    w.add_tensor(blk + "ssm_conv1d.weight", t(conv_dim, D_CONV))
    w.add_tensor(blk + "ssm_conv1d.bias", t(conv_dim, scale=0.1))
    w.add_tensor(blk + "ssm_dt.bias", t(SSM_HEADS, scale=0.1))
    w.add_tensor(blk + "ssm_a", -np.exp(t(SSM_HEADS, 1, scale=0.5)))  # one decay per head
    w.add_tensor(blk + "ssm_d", np.ones((SSM_HEADS, 1), dtype=np.float32))
    w.add_tensor(blk + "ssm_norm.weight", np.ones((SSM_GROUPS, d_inner // SSM_GROUPS), dtype=np.float32))
    w.add_tensor(blk + "ssm_out.weight", t(n_embd, d_inner))


def write_shortconv(w, blk: str, n_embd: int, t) -> None:
    w.add_tensor(blk + "shortconv.conv.weight", t(n_embd, SHORTCONV_L_CACHE))
    w.add_tensor(blk + "shortconv.in_proj.weight", t(3 * n_embd, n_embd))  # B, C and x
    w.add_tensor(blk + "shortconv.out_proj.weight", t(n_embd, n_embd))


def write_gated_deltanet(w, blk: str, n_embd: int, t, mat=None,
                         delta: tuple[int, int, int] = DELTA_DIMS) -> None:
    """``mat(name, n_out, n_in)`` writes the projections (default: ``t``'s floats), so that a
    real-sized model can write them quantized."""
    mat = mat or (lambda name, n_out, n_in: w.add_tensor(name, t(n_out, n_in)))
    head, k_heads, v_heads = delta
    keys, values = head * k_heads, head * v_heads
    mat(blk + "attn_qkv.weight", 2 * keys + values, n_embd)
    mat(blk + "attn_gate.weight", values, n_embd)
    w.add_tensor(blk + "ssm_conv1d.weight", t(2 * keys + values, D_CONV))
    w.add_tensor(blk + "ssm_dt.bias", t(v_heads, scale=0.1))
    w.add_tensor(blk + "ssm_a", -np.exp(t(v_heads, scale=0.5)))
    w.add_tensor(blk + "ssm_beta.weight", t(v_heads, n_embd))
    w.add_tensor(blk + "ssm_alpha.weight", t(v_heads, n_embd))
    w.add_tensor(blk + "ssm_norm.weight", np.ones(head, dtype=np.float32))
    mat(blk + "ssm_out.weight", n_embd, values)


def write_recurrent_layer(w, arch: str, kind: str, blk: str, n_embd: int, t, mat=None,
                          delta: tuple[int, int, int] = DELTA_DIMS) -> None:
    """One layer's mixer of kind M (Mamba or Mamba 2, by architecture), C (short convolution)
    or L (Gated DeltaNet, whose projections ``mat`` writes when given)."""
    if kind == "C":
        write_shortconv(w, blk, n_embd, t)
    elif kind == "L":
        write_gated_deltanet(w, blk, n_embd, t, mat, delta)
    elif arch == "mamba":
        write_mamba_mixer(w, blk, n_embd, t)
    else:
        write_mamba2_mixer(w, blk, n_embd, t)
