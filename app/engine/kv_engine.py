"""The engine: one model, one context with several sequences, and what each sequence holds.

Everything the CLI and the window do goes through ``Engine``. It keeps, for every sequence,
the exact token ids resident in the KV cache; the radix cache (``engine.cache``) keeps what was
primed or run in those sequences, and the cold reference (``engine.cold``) evaluates prompts
from scratch in a context of its own, to prove warm runs equal.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .batch_plan import EXACT_CHUNK, batch_starts, batches
from .cold_reference import ColdReference
from .errors import ContextError, ContextOverflowError, KvPrimerError, StateFileError
from .model_files import check_gguf_file, default_model_path, model_fingerprint
from .model_traits import ModelTraits, read_traits
from .kv_debug_log import TrackedContext
from .kv_view import KvCacheView, build_view
from .llama_state_file import check_rows_fit, read_any_state
from .native import SEQ_STATE_VERSION, ContextParams, NativeModel, kv_bytes_per_token
from .prefix_state import PrefixState
from .radix_cache import CacheLimits, RadixCache
from .radix_tree import RadixNode
from .prompt_tokens import PromptTokenizer
from .seq_payload import in_position_order
from .task_state import TaskState
from .template import FilledPrompt, Template


@dataclass(frozen=True)
class EngineConfig:
    model_path: str | None = None  # None: the default model
    n_ctx: int = 4096
    n_batch: int = 256
    n_threads: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 64  # sequence 0 is the user's, the radix cache uses the rest
    cache: CacheLimits = CacheLimits()
    kv_debug_log: bool = True  # LLAMA_KV_CACHE_DEBUG=3: the cell map behind the KV view
    n_gpu_layers: int = 0  # layers offloaded to a GPU (llama.cpp's -ngl); -1: all of them


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    architecture: str
    description: str
    sha256: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    n_ctx_train: int
    n_vocab: int
    n_params: int
    file_bytes: int
    n_ctx: int
    n_batch: int
    n_seq_max: int
    type_k: str
    type_v: str
    kv_bytes_per_token: int
    traits: ModelTraits  # what the architecture means for caching

    def as_dict(self) -> dict:
        return {**self.__dict__, "traits": self.traits.as_dict()}


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig()):
        self.config = config
        path = check_gguf_file(config.model_path) if config.model_path else check_gguf_file(default_model_path())
        self.model = NativeModel(path, config.n_gpu_layers)
        try:
            self.ctx = TrackedContext(self.model, ContextParams(
                config.n_ctx, config.n_batch, config.n_threads, config.type_k, config.type_v,
                config.n_seq_max), config.kv_debug_log)
        except Exception:
            self.model.close()
            raise
        facts = self.model.facts()
        self.info = ModelInfo(
            path=str(path), sha256=model_fingerprint(path), n_ctx=self.ctx.n_ctx,
            n_batch=config.n_batch, n_seq_max=config.n_seq_max, type_k=config.type_k,
            type_v=config.type_v, kv_bytes_per_token=kv_bytes_per_token(facts, config.type_k, config.type_v),
            traits=read_traits(self.model, self.ctx, path),
            **{k: facts[k] for k in ("name", "architecture", "description", "n_layer", "n_head",
                                     "n_head_kv", "n_embd", "n_ctx_train", "n_vocab", "n_params",
                                     "file_bytes")})
        self.tokenizer = PromptTokenizer(self.model)
        # token ids resident in each sequence, position i holding resident[seq][i]
        self.resident: dict[int, list[int]] = {s: [] for s in range(config.n_seq_max)}
        # sequences that also hold shifted or divided cells beyond resident[seq] (see shift())
        self.moved: set[int] = set()
        self._kv_listeners: list = []
        self._kv_published = 0.0
        self.ctx.on_change = self._kv_changed
        self.cold = ColdReference(self)
        self.cache = RadixCache(self, config.cache)

    # ---- lifetime
    def close(self) -> None:
        self.cache.close()
        self.cold.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tokens
    def tokenize(self, prompt: FilledPrompt) -> list[int]:
        return self.tokenizer.tokenize(prompt)

    @property
    def n_swa(self) -> int:
        """The sliding-window size (0: every layer attends to the whole context)."""
        return self.info.traits.n_swa

    def check_fits(self, n_tokens: int) -> None:
        if n_tokens >= self.ctx.n_ctx:
            raise ContextOverflowError(n_tokens, self.ctx.n_ctx)

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.config.n_seq_max:
            raise KvPrimerError(f"sequence {seq} does not exist; this context has sequences "
                                f"0 to {self.config.n_seq_max - 1}")

    # ---- evaluation
    def evaluate(self, tokens: list[int], seq: int = 0, task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, chunk: int | None = None,
                 marks: list[int] = (), at_mark=None):
        """Append ``tokens`` to sequence ``seq``; return the last logits (or None).

        Batches hold at most ``chunk`` tokens (default n_batch) and also start at every
        absolute position in ``marks``, where ``at_mark(position)`` is called once the tokens
        before it are in (the radix cache forks nodes there). The batch starts used are left
        in ``self.last_starts``. Cancelling between batches leaves the sequence holding
        exactly the tokens evaluated so far.
        """
        self._check_seq(seq)
        if seq in self.moved:
            raise KvPrimerError(f"sequence {seq} holds shifted or divided positions; trim it to "
                                f"{len(self.resident[seq])} tokens or clear it before evaluating")
        task = task or TaskState()
        start = len(self.resident[seq])
        end = start + len(tokens)
        self.check_fits(end)
        starts = batch_starts(start, end, min(chunk or self.config.n_batch, self.config.n_batch),
                              marks)
        self.last_starts = starts
        task.report(stage, 0, len(tokens))
        for a, b in batches(starts, end):
            task.check(kept_tokens=len(self.resident[seq]))
            if at_mark is not None and a in marks:
                at_mark(a)
            self.decode([(tokens[i - start], i, (seq,), want_logits and i == end - 1)
                         for i in range(a, b)])
            task.report(stage, b - start, len(tokens))
        if at_mark is not None and end in marks:
            at_mark(end)
        return self.ctx.logits(-1) if want_logits and tokens else None

    def decode(self, entries: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """One llama_decode of (token, position, (seq,), wants logits) entries, possibly for
        several sequences, each entry appending its token to its sequence's resident tokens."""
        try:
            self.ctx.decode(entries)
        except ContextError:
            for seq in {e[2][0] for e in entries}:
                self._resync(seq)
            raise
        for tok, _pos, seqs, _logits in entries:
            self.resident[seqs[0]].append(tok)

    def _resync(self, seq: int) -> None:
        """After a failed decode, trust llama.cpp's own position range."""
        lo, hi = self.ctx.pos_range(seq)
        n = hi + 1 if lo == 0 else 0
        if lo != 0:
            self.ctx.seq_rm(seq)
        self.resident[seq] = self.resident[seq][:n]

    # ---- sequence operations
    def clear_seq(self, seq: int) -> None:
        self._check_seq(seq)
        self.ctx.seq_rm(seq)
        self.resident[seq] = []
        self.moved.discard(seq)

    def clear_all(self) -> None:
        self.ctx.clear()
        for s in self.resident:
            self.resident[s] = []
        self.moved.clear()

    def trim(self, seq: int, keep: int) -> None:
        """Keep the first ``keep`` tokens of ``seq``, drop the rest."""
        self._check_seq(seq)
        if keep < len(self.resident[seq]) or (seq in self.moved and keep <= len(self.resident[seq])):
            if not self.ctx.seq_rm(seq, keep, -1):
                raise ContextError("llama.cpp could not trim that sequence")
            self.resident[seq] = self.resident[seq][:keep]
            self.moved.discard(seq)

    def fork(self, src: int, dst: int, upto: int | None = None) -> None:
        """Make ``dst`` hold what ``src`` holds (its first ``upto`` tokens); the cells are
        shared, nothing is copied."""
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        self.clear_seq(dst)
        if upto is None or upto >= len(self.resident[src]):
            self.ctx.seq_cp(src, dst)
            self.resident[dst] = list(self.resident[src])
            if src in self.moved:
                self.moved.add(dst)
        elif upto > 0:
            self.ctx.seq_cp(src, dst, 0, upto)
            self.resident[dst] = self.resident[src][:upto]

    def cells_of(self, seq: int, p0: int, p1: int, scratch: int) -> bytes:
        """A state of only the cells of ``seq`` at positions p0..p1-1 (through ``scratch``)."""
        self.ctx.seq_rm(scratch)
        self.ctx.seq_cp(seq, scratch, p0, p1)
        try:
            return in_position_order(self.ctx.state_get(scratch))
        finally:
            self.ctx.seq_rm(scratch)

    def add_cells(self, data: bytes, seq: int, scratch: int, tokens: list[int]) -> bool:
        """Put a state of cells (from ``cells_of``) into ``seq`` beside what it holds, which
        then holds ``tokens``. False when llama.cpp refuses the state."""
        self.ctx.seq_rm(scratch)
        if not self.ctx.state_set(data, scratch):
            self.ctx.seq_rm(scratch)
            return False
        self.ctx.seq_cp(scratch, seq)
        self.ctx.seq_rm(scratch)
        self.resident[seq] = list(tokens)
        return True

    def place_cells(self, src: int, p0: int, p1: int, dst: int, delta: int, scratch: int,
                    tokens: list[int]) -> None:
        """Append the cells of ``src`` at positions p0..p1-1 to ``dst``, moved by ``delta``
        (shared when not moved; otherwise copied through ``scratch``, then seq_add, which makes
        the next decode re-rotate their K). ``tokens`` are the tokens they hold."""
        if len(self.resident[dst]) != p0 + delta:
            raise KvPrimerError("cells must be placed right after what the sequence holds")
        if delta == 0:
            self.ctx.seq_cp(src, dst, p0, p1)
        else:
            data = self.cells_of(src, p0, p1, scratch)
            if not self.ctx.state_set(data, scratch):
                self.ctx.seq_rm(scratch)
                raise ContextError("llama.cpp refused a module's cells; clear the cache")
            self.ctx.seq_add(scratch, p0, p1, delta)
            self.ctx.seq_cp(scratch, dst)
            self.ctx.seq_rm(scratch)
        self.resident[dst].extend(tokens)

    def used_cells(self) -> int:
        """Cells holding some sequence's tokens, by the engine's own account of every operation."""
        return self.ctx.mirror.used

    def keep_only(self, seq: int) -> None:
        """Drop every other sequence; cells ``seq`` shared with them become its own."""
        self._check_seq(seq)
        self.ctx.seq_keep(seq)
        for s in self.resident:
            if s != seq:
                self.resident[s] = []
                self.moved.discard(s)

    def shift(self, seq: int, p0: int, delta: int) -> None:
        """Add ``delta`` to the positions of ``seq`` from ``p0`` on (llama.cpp's seq_add).

        The moved cells keep K/V computed at their old positions (K is re-roped), so they are no
        longer what evaluating those tokens would give: ``resident[seq]`` keeps only the tokens
        below the moved range, and the sequence is marked moved until trimmed back to them.
        Cells shifted below position 0 are freed.
        """
        self._check_seq(seq)
        if delta == 0:
            return
        self._check_unshared(seq, p0, "shift")
        self.ctx.seq_add(seq, p0, -1, delta)
        self._after_move(seq, max(0, min(p0, p0 + delta)))

    def divide(self, seq: int, p0: int, d: int) -> None:
        """Integer-divide the positions of ``seq`` from ``p0`` on by ``d`` (llama.cpp's seq_div)."""
        self._check_seq(seq)
        if d < 1:
            raise KvPrimerError(f"divide positions by 1 or more, not {d}")
        if d == 1:
            return
        self._check_unshared(seq, p0, "divide")
        self.ctx.seq_div(seq, p0, -1, d)
        self._after_move(seq, max(0, p0 // d))

    def _check_unshared(self, seq: int, p0: int, verb: str) -> None:
        # a cell has one position for all its owners: moving a shared cell moves it for all
        view = self.kv_view()
        if view.has_cells:
            o = view.cell_owners
            mine = ((o & (1 << seq)) != 0) & (view.cell_pos >= max(p0, 0))
            together = int(np.bitwise_or.reduce(o[mine])) if mine.any() else 0
            others = [s for s in range(64) if together >> s & 1 and s != seq]
        else:
            lo = max(p0, 0)
            others = [u.seq for u in view.sequences if u.seq != seq and u.pos_max >= lo]
        if others:
            raise KvPrimerError(
                f"sequence {seq} may share cells with sequence {', '.join(map(str, others))} from "
                f"position {p0}; a {verb} would move them there too; clear those sequences or "
                f"evaluate this one on its own first")

    def _after_move(self, seq: int, exact: int) -> None:
        self.resident[seq] = self.resident[seq][:exact]
        lo, hi = self.ctx.pos_range(seq)
        if hi >= len(self.resident[seq]):
            self.moved.add(seq)
        else:
            self.moved.discard(seq)

    # ---- the KV cache view
    def kv_view(self) -> KvCacheView:
        """Every cell's position and owners, and a summary per sequence (see kv_view.py)."""
        self.ctx.verify()
        return build_view(self.ctx.mirror, self.ctx.pos_range, self.config.n_seq_max,
                          self.info.kv_bytes_per_token,
                          {s: len(t) for s, t in self.resident.items()})

    def add_kv_listener(self, fn, min_interval_s: float = 0.05) -> None:
        """Call ``fn(view)`` on this (the engine's) thread after KV changes, at most every
        ``min_interval_s``; the caller must publish a final view itself when a job ends."""
        self._kv_listeners.append((fn, min_interval_s))

    def remove_kv_listener(self, fn) -> None:
        self._kv_listeners = [(f, i) for f, i in self._kv_listeners if f != fn]

    def _kv_changed(self) -> None:
        if not self._kv_listeners:
            return
        now = time.perf_counter()
        if now - self._kv_published < min(i for _f, i in self._kv_listeners):
            return
        self._kv_published = now
        view = self.kv_view()
        for fn, _i in list(self._kv_listeners):
            fn(view)

    # ---- states
    def snapshot(self, seq: int = 0, template: Template | None = None, text: str = "") -> PrefixState:
        """The state of one sequence (its KV cells only: no logits, no other sequences)."""
        self._check_seq(seq)
        if not self.resident[seq]:
            raise KvPrimerError(f"sequence {seq} is empty; prime it first")
        if seq in self.moved:
            raise KvPrimerError(f"sequence {seq} holds shifted or divided positions, which a "
                                f"state cannot describe; trim it to {len(self.resident[seq])} tokens first")
        return PrefixState(
            tokens=tuple(self.resident[seq]), data=in_position_order(self.ctx.state_get(seq)),
            model_sha256=self.info.sha256, model_name=self.info.name or Path(self.info.path).name,
            type_k=self.info.type_k, type_v=self.info.type_v, seq_state_version=SEQ_STATE_VERSION,
            template_sha256=template.sha256 if template else "", text=text)

    def check_state(self, state: PrefixState) -> None:
        state.check_compatible(self.info.sha256, self.info.type_k, self.info.type_v,
                               SEQ_STATE_VERSION, self.ctx.n_ctx)
        state.check_payload(self.info.n_vocab)
        if state.origin == "llama.cpp":  # no model identity: at least the rows must fit
            check_rows_fit(state, self.info.n_layer, self.info.kv_bytes_per_token)

    def restore(self, state: PrefixState, seq: int = 0) -> float:
        """Put a saved state into ``seq``; returns seconds taken. The context is unchanged on error."""
        self._check_seq(seq)
        self.check_state(state)
        t0 = time.perf_counter()
        # llama.cpp clears the sequence before it finds a layer/row/V-layout mismatch; keep a
        # copy to put back (run paths restore into an empty sequence, so this costs them nothing)
        old, was_moved = self.resident[seq], seq in self.moved
        backup = self.ctx.state_get(seq) if old else None
        self.ctx.seq_rm(seq)
        self.resident[seq] = []
        self.moved.discard(seq)
        if not self.ctx.state_set(state.data, seq):
            self.ctx.seq_rm(seq)
            if backup and self.ctx.state_set(backup, seq):
                self.resident[seq] = old
                if was_moved:
                    self.moved.add(seq)
            raise StateFileError("llama.cpp rejected the state's KV data (layer or row sizes differ); "
                                 "prime the prefix again with this model")
        self.resident[seq] = list(state.tokens)
        return time.perf_counter() - t0

    def load_state(self, path: str | Path) -> PrefixState:
        """Read and validate a .kvstate file against this model and context (does not restore)."""
        state = read_any_state(path)  # ours or llama.cpp's sequence-state file
        self.check_state(state)
        return state

    def prime_node(self, template: Template, task: TaskState | None = None) -> RadixNode:
        """The radix cache's node holding the template's static prefix, evaluated if needed.

        Into an empty cache the prefix goes in plain n_batch batches from cell 0, as a cold
        run places it; otherwise in small batches, whose results do not depend on where the
        cells land (batch_plan.py).
        """
        tokens = self.tokenize(template.prefix_prompt())
        if not tokens:
            raise KvPrimerError("the template has no static prefix (it starts with a placeholder); "
                                "nothing to prime")
        self.check_fits(len(tokens))
        hit = self.cache.lookup(tokens)
        if hit.reused == len(tokens) and hit.node.depth == len(tokens):
            self.cache.touch(hit.node)
            return hit.node
        chunk = None if self.used_cells() == 0 else EXACT_CHUNK
        self.cache.ensure_free_cells(len(tokens) - hit.reused)
        work = self.cache.take_work_seq()
        try:
            self.cache.fork_into(hit, work)
            self.evaluate(tokens[hit.reused:], work, task, stage="prime", want_logits=False,
                          chunk=chunk)
            starts = [*(hit.node.all_cuts() if hit.node else []), *self.last_starts]
            return self.cache.add(work, "static prefix", starts, template.sha256, hit.approx)
        finally:
            self.cache.give_back(work)

    def prime(self, template: Template, task: TaskState | None = None) -> PrefixState:
        """Prime the template's static prefix into the radix cache and return its state (to
        save to a file)."""
        node = self.prime_node(template, task)
        return self.snapshot(node.seq, template, template.static_prefix)


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


common_prefix = _common_prefix
