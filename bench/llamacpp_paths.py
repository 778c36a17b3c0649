"""llama-cpp-python as its users use it: ``llama_cpp.Llama`` with ``LlamaRAMCache`` or
``LlamaDiskCache``, and ``Llama``'s own reuse of what its context already holds.

The warm cache paths do what ``Llama.create_completion`` does before its first token
(llama_cpp/llama.py, ``_create_completion``): look the prompt up in the cache, ``load_state`` the
entry when it shares more tokens than the context does, then ``generate``, which keeps the
longest common prefix and evaluates the rest. We call those steps directly, with the same token
lists our engine evaluates, so that only the first token is timed (create_completion would also
save a new cache entry after the completion, a cost that comes after the first token).

Tokens evaluated are counted by wrapping ``Llama.eval``, through which ``generate`` evaluates.

``LlamaDiskCache.__getitem__`` pops the entry it returns (a second lookup misses). To keep
every repeat warm, the bench writes the same entry back after each timed lookup, untimed.

Both sides run the same CPU kernels: ``Llama`` loads with the extra-buffer-types setting
(AMX, repacked weights) that our engine uses for this model (app/engine/crash_probe.py), so an
AMX build that crashes is not run, and neither side gets kernels the other lacks.
"""
from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import numpy as np

import llama_cpp as L
from llama_cpp import Llama, LlamaDiskCache, LlamaRAMCache
from llama_cpp.llama import LlamaState

from app.engine.llama.crash_probe import checked_cpu_kernels
from app.engine.llama.ggml_types import KV_TYPES

from . import peer_child
from .kvprimer_paths import Sample
from .workload import RowTokens


class LlamaPaths:
    def __init__(self, model_path: str | Path, *, n_ctx: int, n_batch: int, n_threads: int,
                 cache_dir: Path, type_kv: str = "f16", use_extra_bufts: bool | None = None,
                 flash_attn: bool | None = True):
        # Same threads, batch = ubatch, KV type, CPU kernels and flash attention (the engine's
        # measured choice) as our engine's contexts: both sides run the same kernels.
        if use_extra_bufts is None:  # what our engine loads this model with (cached verdict)
            use_extra_bufts = checked_cpu_kernels(model_path).use_extra_bufts
        self.llm = peer_child.open_llama(model_path, n_ctx=n_ctx, n_batch=n_batch,
                                         n_threads=n_threads, flash_attn=bool(flash_attn),
                                         use_extra_bufts=use_extra_bufts,
                                         type_kv=KV_TYPES[type_kv].id)
        self.use_extra_bufts = use_extra_bufts
        self.counted = 0
        inner = self.llm.eval

        def counting_eval(tokens):
            self.counted += len(tokens)
            return inner(tokens)

        self.llm.eval = counting_eval  # generate() calls self.eval: this instance's attribute
        self.cache_dir = Path(cache_dir)
        self.ram = LlamaRAMCache(capacity_bytes=4 << 30)
        self.disk = LlamaDiskCache(cache_dir=str(self.cache_dir), capacity_bytes=4 << 30)
        self.entry: LlamaState | None = None
        self.key: tuple[int, ...] = ()
        self._gen = None

    def close(self) -> None:
        self._close_gen()
        self.disk.cache.close()
        self.llm.close()

    # ---- the cache entry for the prefix
    def prime(self, prefix: list[int]) -> LlamaState:
        """Evaluate the prefix from an empty context and save its state in both caches."""
        self.llm.reset()
        self.llm.eval(prefix)
        self.entry = self.llm.save_state()
        self.key = tuple(prefix)
        self.ram[self.key] = self.entry
        self._disk_put()
        return self.entry

    def _disk_put(self) -> None:
        with contextlib.redirect_stderr(io.StringIO()):  # __setitem__ prints progress lines
            self.disk[self.key] = self.entry

    def ram_entry_bytes(self) -> int:
        e = self.entry
        return int(e.llama_state_size) + e.scores.nbytes + e.input_ids.nbytes

    def disk_entry_bytes(self) -> int:
        """Bytes diskcache stores for the entry: its value file(s), not the index database."""
        return sum(p.stat().st_size for p in self.cache_dir.rglob("*.val"))

    # ---- timed paths
    def ram_warm(self, row: RowTokens, unrelated: list[int]) -> Sample:
        self._evaluate_unrelated(unrelated)
        return self._cached(self.ram, row)

    def disk_warm(self, row: RowTokens, unrelated: list[int]) -> Sample:
        if self.key not in self.disk.cache:  # the previous lookup popped it: write it back
            self._disk_put()
        self._evaluate_unrelated(unrelated)
        return self._cached(self.disk, row)

    def in_context(self, row: RowTokens, other_token: int) -> Sample:
        """The context holds the prefix and then a different token (as after a call with another
        suffix); generate() keeps the common prefix and evaluates the rest, nothing restored."""
        self._close_gen()
        llm = self.llm
        if llm._input_ids[:row.boundary].tolist() != row.tokens[:row.boundary]:
            raise RuntimeError("the Llama context does not hold the prefix; run a warm path first")
        llm.n_tokens = row.boundary  # eval() first removes the cells from n_tokens on
        llm.eval([other_token])
        t0 = time.perf_counter()
        return self._first(row, t0, 0.0)

    def _evaluate_unrelated(self, unrelated: list[int]) -> None:
        self._close_gen()
        self.llm.reset()
        self.llm.eval(unrelated)

    def _cached(self, cache, row: RowTokens) -> Sample:
        llm, tokens = self.llm, row.tokens
        t0 = time.perf_counter()
        item = cache[tokens]  # KeyError would mean the entry is missing: let it raise
        cache_len = Llama.longest_token_prefix(item.input_ids.tolist(), tokens)
        if cache_len > Llama.longest_token_prefix(llm._input_ids.tolist(), tokens):
            llm.load_state(item)
        load_ms = (time.perf_counter() - t0) * 1000
        return self._first(row, t0, load_ms)

    def _first(self, row: RowTokens, t0: float, load_ms: float) -> Sample:
        self.counted = 0
        self._gen = self.llm.generate(row.tokens, temp=0.0, repeat_penalty=1.0)
        tok = next(self._gen)
        ms = (time.perf_counter() - t0) * 1000
        return Sample(ms, self.counted, int(tok), self.last_logits(), load_ms=load_ms)

    def more_tokens(self, first: int, n: int) -> list[int]:
        """Continue the last path's generation greedily to ``n`` tokens (untimed)."""
        out = [first]
        while len(out) < n and not L.llama_vocab_is_eog(self.llm._model.vocab, out[-1]):
            out.append(int(next(self._gen)))
        return out

    def last_logits(self) -> np.ndarray:
        ptr = L.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).copy()

    def _close_gen(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None


def recurring_rows(llama: LlamaPaths, rows: list[list[int]], max_tokens: int,
                   prime: list[int] | None = None) -> list[dict]:
    """The recurring rows through this process's llama-cpp-python (peer_child.recurring_rows,
    the same loop a natively built one runs in its own process)."""
    llama._close_gen()
    return peer_child.recurring_rows(llama.llm, rows, max_tokens, prime)


def recurring_rows_one_by_one(llama: LlamaPaths, rows: list[list[int]], max_tokens: int):
    """The same rows, one per next() (peer_child.recurring_rows_one_by_one)."""
    llama._close_gen()
    yield from peer_child.recurring_rows_one_by_one(llama.llm, rows, max_tokens)
