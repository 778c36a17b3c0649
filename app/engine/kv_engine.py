"""The engine: one model, one context with several sequences, and what each sequence holds.

Everything the CLI and the window do goes through ``Engine``. It keeps, for every sequence,
the exact token ids resident in the KV cache, so it can reuse a resident prefix, trim a
sequence before evaluating a different suffix, and say what a state contains.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Cancelled, ContextError, ContextOverflowError, KvPrimerError, StateFileError
from .model_files import check_gguf_file, default_model_path, model_fingerprint
from .native import (SEQ_STATE_VERSION, ContextParams, NativeContext, NativeModel,
                     kv_bytes_per_token)
from .prefix_state import PrefixState
from .prefix_store import PrefixStore
from .prompt_tokens import PromptTokenizer
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
    n_seq_max: int = 8
    store_bytes: int = 1 << 30


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class EvalStats:
    tokens: int = 0
    seconds: float = 0.0
    batches: list[int] = field(default_factory=list)


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig()):
        self.config = config
        path = check_gguf_file(config.model_path) if config.model_path else check_gguf_file(default_model_path())
        self.model = NativeModel(path)
        try:
            self.ctx = NativeContext(self.model, ContextParams(
                config.n_ctx, config.n_batch, config.n_threads, config.type_k, config.type_v,
                config.n_seq_max))
        except Exception:
            self.model.close()
            raise
        facts = self.model.facts()
        self.info = ModelInfo(
            path=str(path), sha256=model_fingerprint(path), n_ctx=self.ctx.n_ctx,
            n_batch=config.n_batch, n_seq_max=config.n_seq_max, type_k=config.type_k,
            type_v=config.type_v, kv_bytes_per_token=kv_bytes_per_token(facts, config.type_k, config.type_v),
            **{k: facts[k] for k in ("name", "architecture", "description", "n_layer", "n_head",
                                     "n_head_kv", "n_embd", "n_ctx_train", "n_vocab", "n_params",
                                     "file_bytes")})
        self.tokenizer = PromptTokenizer(self.model)
        self.store = PrefixStore(config.store_bytes)
        # token ids resident in each sequence, position i holding resident[seq][i]
        self.resident: dict[int, list[int]] = {s: [] for s in range(config.n_seq_max)}
        self.log_listeners = []

    # ---- lifetime
    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tokens
    def tokenize(self, prompt: FilledPrompt) -> list[int]:
        return self.tokenizer.tokenize(prompt)

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.model.piece(t) for t in tokens).decode("utf-8", "replace")

    def check_fits(self, n_tokens: int) -> None:
        if n_tokens >= self.ctx.n_ctx:
            raise ContextOverflowError(n_tokens, self.ctx.n_ctx)

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.config.n_seq_max:
            raise KvPrimerError(f"sequence {seq} does not exist; this context has sequences "
                                f"0 to {self.config.n_seq_max - 1}")

    # ---- evaluation
    def evaluate(self, tokens: list[int], seq: int = 0, task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, split_at: int | None = None):
        """Append ``tokens`` to sequence ``seq`` in batches of n_batch; return the last logits.

        ``split_at`` starts a new batch at that index, so that two runs can be given the same
        batch boundaries (llama.cpp's numerics depend on them). Cancelling between batches
        leaves the sequence holding exactly the tokens evaluated so far.
        """
        self._check_seq(seq)
        task = task or TaskState()
        start = len(self.resident[seq])
        self.check_fits(start + len(tokens))
        nb = self.config.n_batch
        cuts = sorted({0, len(tokens), *(range(0, len(tokens), nb) if split_at is None else
                                          [*range(0, split_at, nb), *range(split_at, len(tokens), nb)])})
        logits = None
        task.report(stage, 0, len(tokens))
        for a, b in zip(cuts, cuts[1:]):
            task.check(kept_tokens=len(self.resident[seq]))
            last = b == len(tokens) and want_logits
            entries = [(tokens[i], start + i, (seq,), last and i == b - 1) for i in range(a, b)]
            try:
                self.ctx.decode(entries)
            except ContextError:
                self._resync(seq)
                raise
            self.resident[seq].extend(tokens[a:b])
            task.report(stage, b, len(tokens))
        if want_logits and tokens:
            logits = self.ctx.logits(-1)
        return logits

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

    def clear_all(self) -> None:
        self.ctx.clear()
        for s in self.resident:
            self.resident[s] = []

    def trim(self, seq: int, keep: int) -> None:
        """Keep the first ``keep`` tokens of ``seq``, drop the rest."""
        self._check_seq(seq)
        if keep < len(self.resident[seq]):
            if not self.ctx.seq_rm(seq, keep, -1):
                raise ContextError("llama.cpp could not trim that sequence")
            self.resident[seq] = self.resident[seq][:keep]

    def fork(self, src: int, dst: int) -> None:
        """Make ``dst`` hold what ``src`` holds; the cells are shared, nothing is copied."""
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        self.clear_seq(dst)
        self.ctx.seq_cp(src, dst)
        self.resident[dst] = list(self.resident[src])

    # ---- states
    def snapshot(self, seq: int = 0, template: Template | None = None, text: str = "") -> PrefixState:
        """The state of one sequence (its KV cells only: no logits, no other sequences)."""
        self._check_seq(seq)
        if not self.resident[seq]:
            raise KvPrimerError(f"sequence {seq} is empty; prime it first")
        return PrefixState(
            tokens=tuple(self.resident[seq]), data=self.ctx.state_get(seq),
            model_sha256=self.info.sha256, model_name=self.info.name or Path(self.info.path).name,
            type_k=self.info.type_k, type_v=self.info.type_v, seq_state_version=SEQ_STATE_VERSION,
            template_sha256=template.sha256 if template else "", text=text)

    def check_state(self, state: PrefixState) -> None:
        state.check_compatible(self.info.sha256, self.info.type_k, self.info.type_v,
                               SEQ_STATE_VERSION, self.ctx.n_ctx)

    def restore(self, state: PrefixState, seq: int = 0) -> float:
        """Put a saved state into ``seq``; returns seconds taken. The context is unchanged on error."""
        self._check_seq(seq)
        self.check_state(state)
        t0 = time.perf_counter()
        self.ctx.seq_rm(seq)
        self.resident[seq] = []
        if not self.ctx.state_set(state.data, seq):
            self.ctx.seq_rm(seq)
            raise StateFileError("llama.cpp rejected the state's KV data (layer or row sizes differ); "
                                 "prime the prefix again with this model")
        self.resident[seq] = list(state.tokens)
        return time.perf_counter() - t0

    def load_state(self, path: str | Path) -> PrefixState:
        """Read and validate a .kvstate file against this model and context (does not restore)."""
        state = PrefixState.load(path)
        self.check_state(state)
        return state

    def prime(self, template: Template, seq: int = 0, task: TaskState | None = None,
              keep_in_store: bool = True) -> PrefixState:
        """Evaluate the template's static prefix into ``seq`` and snapshot it."""
        prompt = template.prefix_prompt()
        tokens = self.tokenize(prompt)
        if not tokens:
            raise KvPrimerError("the template has no static prefix (it starts with a placeholder); "
                                "nothing to prime")
        self.check_fits(len(tokens))
        common = _common_prefix(self.resident[seq], tokens)
        self.trim(seq, common)
        try:
            self.evaluate(tokens[common:], seq, task, stage="prime", want_logits=False)
        except Cancelled:
            raise
        state = self.snapshot(seq, template, template.static_prefix)
        if keep_in_store:
            self.store.put(state)
        return state


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


common_prefix = _common_prefix
