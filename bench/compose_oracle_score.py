"""CacheBlend's scoring pass, measured: layer 1's V of every token after the static prefix, in
context, from a context of its own whose graph callback (cb_eval) copies the ``Vcur-1`` node and
stops the graph there, so layers 2 and up are never computed.

The callback is fixed when a context is made and runs for every node of every decode, so it
lives here and never on a context that generates. The node is read through ggml's tensor
struct (ggml.h of the pinned llama.cpp: type, buffer, ne[4], nb[4], op, op_params[16], flags,
src[10], view_src, view_offs, data, name[64]); a name that does not read back as expected stops
the measurement with an error rather than a wrong figure.
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

import llama_cpp as L

from .compose_oracle import PREFIX, RowPlan

WORK = 1
NODE = b"Vcur-1"
_NE, _DATA, _NAME = 16, 248, 256  # offsets in struct ggml_tensor (64-bit)
GGML_F32 = 0


class ScoringContext:
    """The static prefix in sequence 0; ``layer1_v(plan)`` runs the rest of a row in
    sequence 1 up to layer 1's V and returns it (tokens x width, float32) with its time."""

    def __init__(self, model, prefix_state: bytes, n_ctx: int, n_batch: int, n_threads: int):
        self._got: list[np.ndarray] = []
        self._ubatch = 1
        self._cb = L.ggml_backend_sched_eval_callback(self._on_node)
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_batch, 2
        p.n_threads = p.n_threads_batch = n_threads
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.kv_unified = True
        p.no_perf = True
        p.cb_eval = self._cb
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise RuntimeError("llama.cpp could not create the scoring context")
        self.mem = L.llama_get_memory(self.ptr)
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        buf = (ctypes.c_uint8 * len(prefix_state)).from_buffer_copy(prefix_state)
        if L.llama_state_seq_set_data(self.ptr, buf, len(prefix_state), PREFIX) != len(prefix_state):
            raise RuntimeError("the scoring context refused the prefix's cells")

    def close(self) -> None:
        if self.ptr:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ptr)
            self.ptr = None

    def _on_node(self, t, ask, _user) -> bool:
        name = ctypes.string_at(t + _NAME)
        if ask:
            return name == NODE
        if name != NODE:
            return True
        if ctypes.c_int32.from_address(t).value != GGML_F32:
            raise RuntimeError("Vcur-1 is not f32")
        ne = (ctypes.c_int64 * 4).from_address(t + _NE)
        total = int(ne[0]) * int(ne[1]) * int(ne[2]) * int(ne[3])
        n = self._ubatch  # the node is [width, tokens] or [head, heads, tokens]: rows per token
        width = total // n
        data = ctypes.c_void_p.from_address(t + _DATA).value
        self._got.append(np.ctypeslib.as_array(
            (ctypes.c_float * (width * n)).from_address(data)).reshape(n, width).copy())
        return False  # nothing after layer 1's V is needed: the graph stops here

    def layer1_v(self, plan: RowPlan) -> tuple[np.ndarray, float]:
        """Layer 1's V of tokens[prefix_len:] in context, and the pass's milliseconds."""
        toks = plan.tokens[plan.prefix_len:]
        L.llama_memory_seq_rm(self.mem, WORK, -1, -1)
        self._got = []
        t0 = time.perf_counter()
        L.llama_memory_seq_cp(self.mem, PREFIX, WORK, -1, -1)
        for i in range(0, len(toks), self.n_batch):
            part = toks[i:i + self.n_batch]
            b = self.batch
            for j, tok in enumerate(part):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, plan.prefix_len + i + j, 1, 0
                b.seq_id[j][0] = WORK
            b.n_tokens = self._ubatch = len(part)
            if L.llama_decode(self.ptr, b) != 0:
                raise RuntimeError("the scoring pass's decode failed")
        ms = (time.perf_counter() - t0) * 1000
        L.llama_memory_seq_rm(self.mem, WORK, -1, -1)
        v = np.concatenate(self._got) if self._got else np.zeros((0, 0), np.float32)
        if len(v) != len(toks):
            raise RuntimeError(f"the scoring pass read {len(v)} of {len(toks)} tokens' V")
        return v, ms


def scored(v1: np.ndarray, plan: RowPlan, cached_v1: list[np.ndarray]) -> np.ndarray:
    """Per module token: the squared distance of its layer-1 V in context from its module's
    cached one (``cached_v1``: each module's rows, in order)."""
    n = plan.module_tokens
    return ((v1[:n] - np.concatenate(cached_v1)) ** 2).sum(axis=1)
