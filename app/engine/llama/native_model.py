"""llama.cpp's model through llama-cpp-python's ctypes bindings: loading a GGUF, its metadata,
tokens and pieces (the context is in native.py, which re-exports these names).

Not thread-safe: one worker thread owns a model and its contexts.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as L

from ..errors import ContextError, ModelError
from .layer_kinds import read_layer_kinds
from .llama_backend import add_log_listener, ensure_backend, last_problem, remove_log_listener



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
