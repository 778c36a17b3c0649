"""llama.cpp's context, through llama-cpp-python's ctypes bindings (the model is in
native_model.py and re-exported here; the sampler is in sampler.py, a failed decode's meaning in
decode_problem.py, the batch threads in thread_fit.py).

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
from typing import Sequence

import numpy as np

import llama_cpp as L

from ..errors import ContextError
from .ggml_types import KV_TYPES
from .decode_problem import decode_problem
from .llama_backend import add_log_listener, ensure_backend, last_problem, remove_log_listener, versions
from .native_model import GPU_OFFLOAD_MISSING, NativeModel, check_gpu_layers, gpu_offload_supported
from .sampler import NativeSampler
from .thread_count import llama_default_threads
from .thread_fit import ThreadReading, shared_fit

__all__ = ["ContextParams", "NativeContext", "NativeModel", "NativeSampler", "SEQ_STATE_VERSION",
           "add_log_listener", "check_gpu_layers", "ensure_backend", "last_problem",
           "remove_log_listener", "versions", "GPU_OFFLOAD_MISSING", "gpu_offload_supported"]

# bytes of a given size, not initialised, for a C call to fill before anyone else sees them
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]



def new_bytes(n: int) -> tuple[bytes, memoryview]:
    """A new bytes object of ``n`` bytes, not initialised, and a writable view of its buffer,
    for a reader to fill before anyone else sees the object (then drop the view): a file read
    straight into the bytes that are kept, with no second copy."""
    if n <= 0:
        return b"", memoryview(bytearray())
    data = _new_bytes(None, n)
    addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    return data, memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def _bytes_ptr(data):
    """A uint8 pointer to ``data``'s own buffer, no copy: a bytes object, or any contiguous
    buffer (a state file's read-only mapping: mapped_state.py); ``data`` must outlive the call."""
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
    return ctypes.cast(np.frombuffer(data, np.uint8).ctypes.data, ctypes.POINTER(ctypes.c_uint8))


SEQ_STATE_VERSION = int(L.LLAMA_STATE_SEQ_VERSION)

# ---- context --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextParams:
    """A context's settings. These defaults are the app's own (EngineConfig, the CLI's options
    and the window take them from here)."""
    n_ctx: int = 4096
    n_batch: int = 256  # tokens per llama_decode call (llama.cpp's -b)
    n_threads: int = 0  # threads for batches (llama.cpp's -tb); 0: auto (thread_fit.py)
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 8
    # threads for one-token decodes, i.e. generation (llama.cpp's -t); 0: as n_threads. With
    # flash attention a one-token decode over 512 cells or more splits the cache by thread count,
    # so it is exact against a cold run only where the cells and the cache's extent are the cold
    # run's: the work context's (tests/engine/llama/test_generation_threads.py), and only on the same count:
    # with auto batch threads the count is taken when a run starts and held (ThreadFit.pinned).
    # Sliding-window models generate in the cache's shared cells: EngineConfig.for_model gives
    # them one thread
    n_threads_gen: int = 0
    # flash attention: True/False, or None for llama.cpp's AUTO (on where supported). The
    # engine decides it by measurement (kernel_choice.py); a quantized V cache needs it on.
    flash_attn: bool | None = None
    # tokens per physical batch inside a decode call (llama.cpp's -ub); 0: the batch size. Warm
    # and cold runs share it, so it never makes them differ
    n_ubatch: int = 0


MAX_THREADS = 512  # GGML_MAX_N_THREADS


def check_context_params(params: ContextParams) -> None:
    """Raise ContextError, in one line, for settings llama.cpp would take wrongly or die on;
    checked before anything is planned or allocated for them (memory_budget.py too)."""
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


# llama.cpp's handles of an open context: a context made with ``lazy`` opens on the first use of one
_HANDLES = frozenset({"ptr", "mem", "batch", "_batch_cap", "_outputs_cap"})


CELL_PAD = 256  # llama.cpp rounds a context up to a multiple of 256 cells


def context_cells(n_ctx: int) -> int:
    """The cells llama.cpp gives a context asked for ``n_ctx``."""
    return -(-n_ctx // CELL_PAD) * CELL_PAD


class NativeContext:
    def __init__(self, model: NativeModel, params: ContextParams, *, lazy: bool = False):
        """A llama.cpp context; ``lazy``: created (its KV cells allocated and cleared, so in
        resident memory) on the first call that needs llama.cpp, not now."""
        check_context_params(params)
        self.model = model
        self.params = params
        threads = params.n_threads or llama_default_threads()
        # llama.cpp caps its batch at n_ctx; our batch buffer must not be bigger either (a
        # batch of a billion tokens would allocate a billion seq-id arrays)
        self._n_batch = n_batch = min(params.n_batch, params.n_ctx)
        # auto: each batch gets the cores other programs leave, up to ``threads`` (thread_fit.py)
        self._fit = shared_fit() if params.n_threads == 0 else None
        self._cap = threads
        self._threads = (min(params.n_threads_gen, threads) if params.n_threads_gen > 0
                         else threads, threads)
        # as llama.cpp takes them (llama-context.cpp); read back from it once open
        self.n_ctx = context_cells(params.n_ctx)
        self.n_ubatch = min(params.n_ubatch, n_batch) if params.n_ubatch else n_batch
        self._empty_recurrent: bytes | None = None  # see empty_recurrent_state
        if not lazy:
            self.open()

    @property
    def opened(self) -> bool:
        """llama.cpp's context was created (it may have been closed since)."""
        return "ptr" in self.__dict__

    def open(self) -> None:
        """Create llama.cpp's context, if not done yet."""
        if self.opened:
            return
        params = self.params
        p = L.llama_context_default_params()
        p.n_ctx = params.n_ctx
        p.n_batch = self._n_batch
        p.n_ubatch = self.n_ubatch
        p.n_seq_max = params.n_seq_max
        # the outputs a decode may ask for: one per sequence (every batch asks for its last
        # token's logits only; a decode of several sequences for each one's last). llama.cpp
        # sizes its compute buffer for that many rows of logits, so n_batch (its default)
        # would hold n_batch × the vocabulary in floats for nothing (on a 1B model with a
        # 128k vocabulary: 130 MB per context at n_batch 256); it needs at least n_seq_max
        p.n_outputs_max = max(1, params.n_seq_max)
        p.n_threads, p.n_threads_batch = self._threads
        p.type_k = KV_TYPES[params.type_k].id
        p.type_v = KV_TYPES[params.type_v].id
        p.flash_attn_type = {None: L.LLAMA_FLASH_ATTN_TYPE_AUTO, True: L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                             False: L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[params.flash_attn]
        p.kv_unified = True  # one cell pool shared by all sequences, so seq_cp shares cells
        p.no_perf = True
        last_problem()
        ptr = L.llama_init_from_model(self.model.ptr, p)
        if not ptr:
            raise ContextError(
                f"llama.cpp could not create a context (n_ctx={params.n_ctx}, KV "
                f"{params.type_k}/{params.type_v}){last_problem()}; try a smaller context size or "
                "f16 KV types"
            )
        mem = L.llama_get_memory(ptr)
        if not mem:  # an encoder-only (embedding) model has no KV cache to prime
            L.llama_free(ptr)
            raise ContextError(f"{self.model.meta('general.name') or 'this model'} has no KV "
                               "cache (an embedding or encoder-only model?); load a text "
                               "generation model")
        self.n_ctx = L.llama_n_ctx(ptr)
        self.n_ubatch = L.llama_n_ubatch(ptr)  # as llama.cpp took it
        self.mem = mem
        self.batch = L.llama_batch_init(self._n_batch, 0, params.n_seq_max)
        self._batch_cap = self._n_batch
        self._outputs_cap = p.n_outputs_max  # llama.cpp aborts on a batch asking for more
        self.ptr = ptr  # last: ``opened``

    def __getattr__(self, name: str):
        # reached only for an attribute not set: a handle of a lazy context not yet open
        if name in _HANDLES and "params" in self.__dict__ and not self.opened:
            self.open()
            return self.__dict__[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def close(self) -> None:
        if self.opened and self.ptr:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ptr)
        self.ptr = None  # closed: a lazy context never opened stays unopened

    # -- evaluation
    def decode(self, entries: Sequence[tuple[int, int, Sequence[int], bool]]) -> None:
        """One llama_decode of (token, position, seq ids, wants logits) entries."""
        n = len(entries)
        if not 0 < n <= self._batch_cap:
            raise ContextError(f"a batch holds 1 to {self._batch_cap} tokens, not {n}")
        outputs = sum(1 for e in entries if e[3])
        if outputs > self._outputs_cap:
            raise ContextError(f"a batch asks for {outputs} tokens' logits, more than the "
                               f"{self._outputs_cap} this context was made for")
        b = self.batch
        for i, (tok, pos, seqs, logits) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
            b.logits[i] = logits
        b.n_tokens = n
        if self._fit is not None:  # llama.cpp runs a one-token decode on the generation threads
            gen, batch = self._threads
            if n > 1:
                batch = min(self._cap, self._fit.threads())
            elif self.params.n_threads_gen == 0:  # as the batch threads: held for a whole run
                gen = min(self._cap, self._fit.generation_threads())
            self._set_threads(gen, batch)
        rc = L.llama_decode(self.ptr, b)
        if rc != 0:
            raise ContextError(decode_problem(self, rc, entries))

    def _set_threads(self, gen: int, batch: int) -> None:
        if (gen, batch) != self._threads:
            L.llama_set_n_threads(self.ptr, gen, batch)
            self._threads = (gen, batch)

    @property
    def batch_threads(self) -> int:
        """The threads the last batch decode ran with."""
        return self._threads[1]

    def thread_reading(self) -> ThreadReading:
        """How batch threads are chosen here, and the figure behind the last choice."""
        if self._fit is not None:
            return self._fit.reading()
        return ThreadReading(None, self._threads[1], self._threads[1], False)

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

    def clear(self, data: bool = True) -> None:
        """Empty every sequence; ``data``: zero the buffers too (a recurrent model's states need
        it; attention cells do not, see WorkContext.reset)."""
        L.llama_memory_clear(self.mem, data)

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

    def empty_recurrent_state(self, scratch: int) -> bytes:
        """What llama.cpp writes for a sequence without a recurrent state (``scratch``, which
        must be empty): the record's layout with no rows. Read once per context."""
        if self._empty_recurrent is None:
            self._empty_recurrent = self.state_get(scratch, partial=True)
        return self._empty_recurrent

    def state_set(self, data: bytes, seq: int, partial: bool = False) -> bool:
        """Put a state into ``seq``; ``partial``: a recurrent part only (``state_get(partial=
        True)``), which replaces the sequence's recurrent state and leaves its cells alone."""
        # Point llama.cpp at the bytes object's own buffer (it only reads it): copying a
        # 40 MB state into a ctypes array first would cost as much as the restore itself.
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n = L.llama_state_seq_set_data_ext(self.ptr, _bytes_ptr(data), len(data), seq, flags)
        return n == len(data) and n > 0
