"""llama.cpp's model and context, through llama-cpp-python's ctypes bindings (the sampler is in
sampler.py, a failed decode's meaning in decode_problem.py; both are reached from here).

With llama_backend.py (process-wide set-up and logging) this is where the engine calls
llama.cpp; model_traits.py and llama_state_file.py read a few facts and files directly.

We use the low-level API rather than ``llama_cpp.Llama`` because we need several sequences in
one context, per-sequence state copies and the memory (KV) calls, none of which ``Llama``
exposes. Every pointer llama.cpp returns is checked; a NULL becomes an engine error.

Not thread-safe: one worker thread owns a model and its context.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

import llama_cpp as L

from ..errors import ContextError, ModelError
from .ggml_types import KV_TYPES
from .decode_problem import decode_problem
from .layer_kinds import read_layer_kinds
from .llama_backend import add_log_listener, ensure_backend, last_problem, remove_log_listener, versions
from .sampler import NativeSampler
from .thread_count import llama_default_threads

__all__ = ["ContextParams", "NativeContext", "NativeModel", "NativeSampler", "SEQ_STATE_VERSION",
           "add_log_listener", "check_gpu_layers", "ensure_backend", "last_problem",
           "remove_log_listener", "versions"]

# bytes of a given size, not initialised, for a C call to fill before anyone else sees them
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]



def _bytes_ptr(data: bytes):
    """A uint8 pointer to a bytes object's own buffer (no copy); ``data`` must outlive the call."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))


SEQ_STATE_VERSION = int(L.LLAMA_STATE_SEQ_VERSION)

# ---- model ----------------------------------------------------------------------------------


GPU_OFFLOAD_MISSING = ("this llama-cpp-python build has no GPU offload; reinstall it with GPU "
                       "support (see README) or offload no layers (GPU layers 0)")


def gpu_offload_supported() -> bool:
    """Can this llama.cpp build offload layers to a GPU? (A property of the build.)"""
    return bool(L.llama_supports_gpu_offload())


def check_gpu_layers(n_gpu_layers: int) -> None:
    """Raise ModelError unless ``n_gpu_layers`` (llama.cpp's -ngl) can be honoured: a CPU-only
    build would silently run everything on the CPU."""
    if n_gpu_layers < -1:
        raise ModelError(f"GPU layers must be 0 (CPU only), a layer count, or -1 (all layers), "
                         f"not {n_gpu_layers}")
    if n_gpu_layers != 0 and not gpu_offload_supported():
        raise ModelError(GPU_OFFLOAD_MISSING)


class NativeModel:
    def __init__(self, path: Path, n_gpu_layers: int = 0, use_extra_bufts: bool = True):
        """``use_extra_bufts`` False keeps weights out of the CPU's extra buffer types (AMX,
        repacked weights): cpu_kernels.py says when, crash_probe.py checks it."""
        check_gpu_layers(n_gpu_layers)
        ensure_backend()
        self.path = Path(path)
        params = L.llama_model_default_params()
        # -1 is "all layers" (llama-cpp-python's convention); llama.cpp caps a count at the layers
        params.n_gpu_layers = 1 << 30 if n_gpu_layers == -1 else n_gpu_layers
        params.use_mmap = True
        params.use_extra_bufts = use_extra_bufts
        # the buffer types llama.cpp puts weights into (CPU_Mapped, CPU_REPACK, AMX, CUDA0, ...)
        # are only in its load log: "load_tensors:   CPU_REPACK model buffer size = 1.50 MiB"
        buffers: list[str] = []

        def listen(_level: int, text: str) -> None:
            if " model buffer size" in text:
                buffers.append(text.split(" model buffer size")[0].split()[-1])

        last_problem()
        add_log_listener(listen)
        try:
            ptr = L.llama_model_load_from_file(str(path).encode("utf-8"), params)
        finally:
            remove_log_listener(listen)
        self.buffer_types = tuple(dict.fromkeys(buffers))
        if not ptr:
            raise ModelError(f"llama.cpp could not load {Path(path).name}: the file is truncated, "
                             f"corrupt or of an unsupported architecture{last_problem()}")
        self.ptr = ptr
        self.vocab = L.llama_model_get_vocab(ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        # what a sequence's state holds: cells per token, and/or one recurrent state
        self.family = ("recurrent" if L.llama_model_is_recurrent(ptr) else
                       "hybrid" if L.llama_model_is_hybrid(ptr) else "attention")
        self._special: list[tuple[str, int]] | None = None

    def close(self) -> None:
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def facts(self) -> dict:
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.ptr, desc, len(desc))
        arch = self.meta("general.architecture") or "unknown"
        n_head = L.llama_model_n_head(self.ptr)
        n_embd = L.llama_model_n_embd(self.ptr)
        head_k = _int(self.meta(f"{arch}.attention.key_length")) or (n_embd // max(n_head, 1))
        head_v = _int(self.meta(f"{arch}.attention.value_length")) or head_k
        # llama.cpp gives layer 0's KV heads: on a hybrid that may be a recurrent layer (0)
        kinds = read_layer_kinds(self.path)
        kv_heads = list(kinds.kv_heads) if kinds is not None else None
        return {
            "name": self.meta("general.name") or "",
            "architecture": arch,
            "description": desc.value.decode("utf-8", "replace"),
            "n_layer": L.llama_model_n_layer(self.ptr),
            "n_head": n_head,
            "n_head_kv": max(kv_heads or [L.llama_model_n_head_kv(self.ptr)]),
            "kv_heads": kv_heads,  # of each attention layer; None: not known
            "n_embd": n_embd,
            "head_dim_k": head_k,
            "head_dim_v": head_v,
            "n_ctx_train": L.llama_model_n_ctx_train(self.ptr),
            "n_vocab": self.n_vocab,
            "n_params": L.llama_model_n_params(self.ptr),
            "file_bytes": L.llama_model_size(self.ptr),
        }

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:  # pragma: no cover - llama.cpp overflowed its own int32 count
            raise ContextError("the text is too long to tokenize")
        return list(buf[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        self._check_token(token)
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:max(n, 0)]

    def _check_token(self, token: int) -> None:
        # llama.cpp indexes its vocabulary with .at(): an unknown id throws through the C API
        # and aborts the process
        if not 0 <= token < self.n_vocab:
            raise ContextError(f"token id {token} is outside this model's vocabulary "
                               f"(0 to {self.n_vocab - 1})")

    def is_eog(self, token: int) -> bool:
        self._check_token(token)
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def bos(self) -> int | None:
        return int(L.llama_vocab_bos(self.vocab)) if L.llama_vocab_get_add_bos(self.vocab) else None

    def control_tokens(self) -> list[tuple[str, int]]:
        """Texts of the control tokens, longest first: what parse_special would match."""
        if self._special is None:
            found = []
            for t in range(self.n_vocab):
                attr = L.llama_vocab_get_attr(self.vocab, t)
                if attr & L.LLAMA_TOKEN_ATTR_CONTROL:
                    text = self.piece(t, special=True).decode("utf-8", "replace")
                    if text:
                        found.append((text, t))
            found.sort(key=lambda x: -len(x[0]))
            self._special = found
        return self._special


def _int(s: str | None) -> int | None:
    try:
        return int(s) if s else None
    except ValueError:
        return None


# ---- context --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextParams:
    """A context's settings. These defaults are the app's own (EngineConfig, the CLI's options
    and the window take them from here)."""
    n_ctx: int = 4096
    n_batch: int = 256  # tokens per llama_decode call (llama.cpp's -b)
    n_threads: int = 0  # threads for batches (llama.cpp's -tb); 0: llama.cpp's (thread_count.py)
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 8
    # threads for one-token decodes, i.e. generation (llama.cpp's -t); 0: as n_threads. With
    # flash attention a one-token decode over 512 cells or more splits the cache by thread count,
    # so it is exact against a cold run only where the cells and the cache's extent are the cold
    # run's: the work context's (tests/test_generation_threads.py). Sliding-window models
    # generate in the cache's shared cells: EngineConfig.for_model gives them one thread
    n_threads_gen: int = 0
    # flash attention: True/False, or None for llama.cpp's AUTO (on where supported). The
    # engine decides it by measurement (kernel_choice.py); a quantized V cache needs it on.
    flash_attn: bool | None = None
    # tokens per physical batch inside a decode call (llama.cpp's -ub); 0: the batch size. Warm
    # and cold runs share it, so it never makes them differ
    n_ubatch: int = 0


MAX_THREADS = 512  # GGML_MAX_N_THREADS


class NativeContext:
    def __init__(self, model: NativeModel, params: ContextParams):
        for name in (params.type_k, params.type_v):
            if name not in KV_TYPES:
                raise ContextError(f"unknown KV type '{name}'; use one of {', '.join(KV_TYPES)}")
        # n_ctx goes into a uint32 field: 2**32 + 16 would silently become 16
        if not 16 <= params.n_ctx < 1 << 31 or params.n_batch < 1 or not 1 <= params.n_seq_max <= 64:
            raise ContextError("context size must be between 16 and 2147483647, batch size at "
                               "least 1, and sequences between 1 and 64")
        threads = params.n_threads or llama_default_threads()
        if not 1 <= threads <= MAX_THREADS:
            raise ContextError(f"batch threads must be between 1 and {MAX_THREADS}, not {threads}")
        if not 0 <= params.n_threads_gen <= MAX_THREADS:
            raise ContextError(f"generation threads must be between 0 (as the batch threads) and "
                               f"{MAX_THREADS}, not {params.n_threads_gen}")
        if params.n_ubatch < 0:
            raise ContextError(f"the micro-batch size must be 0 (the batch size) or more, not "
                               f"{params.n_ubatch}")
        # llama.cpp caps its batch at n_ctx; our batch buffer must not be bigger either (a
        # batch of a billion tokens would allocate a billion seq-id arrays)
        n_batch = min(params.n_batch, params.n_ctx)
        p = L.llama_context_default_params()
        p.n_ctx = params.n_ctx
        p.n_batch = n_batch
        p.n_ubatch = min(params.n_ubatch, n_batch) if params.n_ubatch else n_batch
        p.n_seq_max = params.n_seq_max
        # llama.cpp reserves its graph for one output per sequence: with more sequences than
        # batch tokens the default (n_batch outputs) fails an assertion and aborts
        p.n_outputs_max = max(n_batch, params.n_seq_max)
        p.n_threads = min(params.n_threads_gen, threads) if params.n_threads_gen > 0 else threads
        p.n_threads_batch = threads
        p.type_k = KV_TYPES[params.type_k].id
        p.type_v = KV_TYPES[params.type_v].id
        p.flash_attn_type = {None: L.LLAMA_FLASH_ATTN_TYPE_AUTO, True: L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                             False: L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[params.flash_attn]
        p.kv_unified = True  # one cell pool shared by all sequences, so seq_cp shares cells
        p.no_perf = True
        last_problem()
        ptr = L.llama_init_from_model(model.ptr, p)
        if not ptr:
            raise ContextError(
                f"llama.cpp could not create a context (n_ctx={params.n_ctx}, KV "
                f"{params.type_k}/{params.type_v}){last_problem()}; try a smaller context size or "
                "f16 KV types"
            )
        self.ptr = ptr
        self.model = model
        self.params = params
        self.n_ctx = L.llama_n_ctx(ptr)
        self.n_ubatch = L.llama_n_ubatch(ptr)  # as llama.cpp took it
        self.mem = L.llama_get_memory(ptr)
        if not self.mem:  # an encoder-only (embedding) model has no KV cache to prime
            L.llama_free(ptr)
            raise ContextError(f"{model.meta('general.name') or 'this model'} has no KV cache "
                               "(an embedding or encoder-only model?); load a text generation model")
        self.batch = L.llama_batch_init(n_batch, 0, params.n_seq_max)
        self._batch_cap = n_batch
        self._empty_recurrent: bytes | None = None  # see cells_state

    def close(self) -> None:
        if self.ptr:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ptr)
            self.ptr = None

    # -- evaluation
    def decode(self, entries: Sequence[tuple[int, int, Sequence[int], bool]]) -> None:
        """One llama_decode of (token, position, seq ids, wants logits) entries."""
        n = len(entries)
        if not 0 < n <= self._batch_cap:
            raise ContextError(f"a batch holds 1 to {self._batch_cap} tokens, not {n}")
        b = self.batch
        for i, (tok, pos, seqs, logits) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
            b.logits[i] = logits
        b.n_tokens = n
        rc = L.llama_decode(self.ptr, b)
        if rc != 0:
            raise ContextError(decode_problem(self, rc, entries))

    def logits(self, i: int) -> np.ndarray:
        """A copy of the logits of batch entry i (-1 for the last one that asked for them)."""
        ptr = L.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise ContextError("no logits for that position")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    # -- memory (KV cache) operations
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(L.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        L.llama_memory_seq_keep(self.mem, seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        L.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        L.llama_memory_seq_div(self.mem, seq, p0, p1, d)

    def clear(self) -> None:
        L.llama_memory_clear(self.mem, True)

    def pos_range(self, seq: int) -> tuple[int, int]:
        return (L.llama_memory_seq_pos_min(self.mem, seq), L.llama_memory_seq_pos_max(self.mem, seq))

    # -- per-sequence state
    def state_get(self, seq: int, partial: bool = False) -> bytes:
        """One sequence's state; ``partial``: only its recurrent part (the state of a hybrid or
        recurrent model's recurrent layers at the sequence's end, no attention cells)."""
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = L.llama_state_seq_get_size_ext(self.ptr, seq, flags)
        if size == 0:
            return b""
        # llama.cpp writes straight into a new, not yet shared bytes object, with the GIL
        # released: zero-filling a ctypes array and copying it to bytes held the GIL for
        # ~100 ms per 40 MB under load, freezing the window at the end of every prime.
        data = _new_bytes(None, size)
        n = L.llama_state_seq_get_data_ext(self.ptr, _bytes_ptr(data), size, seq, flags)
        if n != size:
            raise ContextError(f"llama.cpp copied {n} of {size} state bytes")
        return data

    def cells_state(self, seq: int, p0: int, p1: int, scratch: int) -> bytes:
        """A state of only the cells of ``seq`` at positions p0..p1-1, in position order
        (copied through sequence ``scratch``, which is left empty). On a hybrid or recurrent
        model it carries an empty recurrent record: the sequence's own stands at its end,
        not at p1, and would only take room (the cache keeps the one at p1 apart)."""
        from ..files.hybrid_payload import without_recurrent
        from ..files.seq_payload import in_position_order

        self.seq_rm(scratch)
        if self.model.family != "attention" and self._empty_recurrent is None:
            # what llama.cpp writes for a sequence without a recurrent state: its layout
            self._empty_recurrent = self.state_get(scratch, partial=True)
        self.seq_cp(seq, scratch, p0, p1)
        try:
            data = in_position_order(self.state_get(scratch))
        finally:
            self.seq_rm(scratch)
        if self.model.family == "attention":
            return data
        return without_recurrent(data, self._empty_recurrent, self.model.family)

    def state_set(self, data: bytes, seq: int, partial: bool = False) -> bool:
        """Put a state into ``seq``; ``partial``: a recurrent part only (``state_get(partial=
        True)``), which replaces the sequence's recurrent state and leaves its cells alone."""
        # Point llama.cpp at the bytes object's own buffer (it only reads it): copying a
        # 40 MB state into a ctypes array first would cost as much as the restore itself.
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n = L.llama_state_seq_set_data_ext(self.ptr, _bytes_ptr(data), len(data), seq, flags)
        return n == len(data) and n > 0
