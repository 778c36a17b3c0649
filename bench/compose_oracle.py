"""Composed caches with a chosen set of tokens recomputed, next to the cold run, in one context.

What the compose-oracle section measures (compose_oracle_run.py) is built here on llama.cpp's
low-level API (through the engine's NativeContext), apart from the engine's own compose mode, so
that any set of tokens can be recomputed and every token's K and V read back:

- sequence 0 holds the static prefix; a row's runs happen in sequence 1;
- a module (one segment of the prompt after the static prefix) is evaluated once right after
  the prefix, and its cells are kept as state bytes;
- ``cold``: the prefix's cells, then every later segment evaluated in its own batches;
- ``compose``: the sequence built left to right, as the design of selective recompute needs
  (llama.cpp takes a sequence's batch only at its end): for each module, its cached cells up to
  the next chosen run (copied through sequence 2, then shifted with seq_add to their place),
  the run evaluated in context, and so on; then the last segment is evaluated. With nothing
  chosen it is plain compose; with every module token chosen it is the cold run's computation,
  in the cold run's cells and batches;
- ``prefix_mode``: the prefix's cells, then the whole rest in n_batch batches (the app's prefix
  reuse mode), timed as the reference for the warm-time ratios.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from app.engine.states.copied_cells import cells_state
from app.engine.states.seq_state_layout import KvBlock, SeqState, Stream, parse
from app.engine.llama.native import SEQ_STATE_VERSION, ContextParams, NativeContext, NativeModel

PREFIX, WORK, SCRATCH, BUILD = 0, 1, 2, 3
SHIFTED = 4  # and up: each module's cells already at the row's positions (shift_once)
MAX_MODULES = 4
F16 = 1  # ggml's type id of f16


@dataclass(frozen=True)
class RowPlan:
    """A row's tokens and where its parts lie: the static prefix (tokens[:prefix_len]), the
    modules (tokens[start:end] each, back to back) and the last segment after them."""
    number: int
    tokens: list[int]
    prefix_len: int
    modules: tuple[tuple[int, int], ...]

    @property
    def tail_start(self) -> int:
        return self.modules[-1][1] if self.modules else self.prefix_len

    @property
    def module_tokens(self) -> int:
        return sum(e - s for s, e in self.modules)

    def positions(self, indices) -> list[int]:
        """Absolute positions of module-token indices (0 .. module_tokens-1, modules in order)."""
        flat = np.concatenate([np.arange(s, e) for s, e in self.modules]) if self.modules \
            else np.zeros(0, dtype=int)
        return [int(flat[i]) for i in indices]


@dataclass
class Run:
    ms: float  # from the empty work sequence to the first token's logits
    tokens: list[int]  # greedy tokens generated
    logits: list[np.ndarray]  # the logits each generated token was taken from
    runs: int = 0  # decode runs of recomputed tokens
    recomputed: int = 0
    state: SeqState | None = None  # the module tokens' cells, when asked for
    first_logits: np.ndarray | None = field(default=None, repr=False)


class OracleContext:
    """One context holding the static prefix, with the row runs above."""

    def __init__(self, model: NativeModel, n_ctx: int = 4096, n_batch: int = 256,
                 n_threads: int = 1, flash_attn: bool | None = False):
        self.model = model
        self.n_batch = n_batch
        self.ctx = NativeContext(model, ContextParams(
            n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_threads_gen=1,
            n_seq_max=SHIFTED + MAX_MODULES,
            flash_attn=flash_attn))
        self.prefix: tuple[int, ...] = ()
        self._modules: dict[tuple[int, ...], SeqState] = {}

    def close(self) -> None:
        self.ctx.close()

    # -- the static prefix and the modules
    def prime(self, prefix: list[int]) -> None:
        """The static prefix in sequence 0 (the cache of modules goes with the old one)."""
        if tuple(prefix) == self.prefix:
            return
        self.ctx.clear()
        self._modules.clear()
        self._decode(PREFIX, prefix, 0, False)
        self.prefix = tuple(prefix)

    def module(self, toks: list[int]) -> SeqState:
        """The cells of ``toks`` evaluated right after the static prefix (cached)."""
        key = tuple(toks)
        if key not in self._modules:
            p = len(self.prefix)
            self.ctx.seq_rm(BUILD)
            self.ctx.seq_cp(PREFIX, BUILD)
            self._decode(BUILD, list(toks), p, False)
            data = cells_state(self.ctx, BUILD, p, p + len(toks), SCRATCH)
            self.ctx.seq_rm(BUILD)
            self._modules[key] = parse(data, SEQ_STATE_VERSION, "attention")
        return self._modules[key]

    # -- the runs
    def cold(self, plan: RowPlan, max_tokens: int, want_state: bool = True) -> Run:
        """Every segment after the prefix evaluated in context, each starting a batch."""
        self._check(plan)
        t0 = self._reset()
        for s, e in plan.modules:
            self._decode(WORK, plan.tokens[s:e], s, False)
        return self._finish(plan, t0, max_tokens, want_state)

    def prefix_mode(self, plan: RowPlan) -> float:
        """Milliseconds to the first token's logits reusing the static prefix only."""
        self._check(plan)
        t0 = self._reset()
        self._decode(WORK, plan.tokens[plan.prefix_len:], plan.prefix_len, True)
        return (time.perf_counter() - t0) * 1000

    def compose(self, plan: RowPlan, positions, max_tokens: int, want_state: bool = False,
                shift_once: bool = False) -> Run:
        """The modules' cached cells, except at ``positions`` (absolute), which are evaluated
        in context, in runs of consecutive positions, left to right. A placed part that moved
        makes the next decode re-rotate K in every cell of the cache; ``shift_once`` first puts
        every module's cells at the row's positions in sequences of their own (one re-rotation
        for the row), then shares the parts from there."""
        self._check(plan)
        chosen = sorted(set(int(x) for x in positions))
        states = [self.module(plan.tokens[s:e]) for s, e in plan.modules]
        if shift_once and len(states) > MAX_MODULES:
            raise ValueError(f"shift_once takes up to {MAX_MODULES} modules")
        p = plan.prefix_len
        t0 = self._reset()
        if shift_once:
            for i, ((s, e), state) in enumerate(zip(plan.modules, states)):
                self._put(state, 0, e - s, s, p, SHIFTED + i)
        n_runs = 0
        for i, ((s, e), state) in enumerate(zip(plan.modules, states)):
            at = s
            for a, b in runs_of([x for x in chosen if s <= x < e]):
                if a > at:
                    self._take(state, at - s, a - s, at, p, shift_once and SHIFTED + i)
                self._decode(WORK, plan.tokens[a:b], a, False)
                n_runs += 1
                at = b
            if at < e:
                self._take(state, at - s, e - s, at, p, shift_once and SHIFTED + i)
        for i in range(len(states) if shift_once else 0):
            self.ctx.seq_rm(SHIFTED + i)
        run = self._finish(plan, t0, max_tokens, want_state)
        run.runs, run.recomputed = n_runs, len(chosen)
        return run

    # -- the parts
    def _check(self, plan: RowPlan) -> None:
        if tuple(plan.tokens[:plan.prefix_len]) != self.prefix:
            raise ValueError(f"row {plan.number} does not start with the primed static prefix")

    def _reset(self) -> float:
        for seq in (WORK, SCRATCH, *range(SHIFTED, SHIFTED + MAX_MODULES)):
            self.ctx.seq_rm(seq)
        t0 = time.perf_counter()
        self.ctx.seq_cp(PREFIX, WORK)
        return t0

    def _take(self, state: SeqState, i0: int, i1: int, at: int, p: int, shifted) -> None:
        """Cells i0..i1-1 of a module (made at positions p+i0..) appended at position ``at``:
        shared from sequence ``shifted`` when it holds them there already."""
        if shifted:
            self.ctx.seq_cp(shifted, WORK, at, at + i1 - i0)
            return
        self._put(state, i0, i1, at, p, SCRATCH)
        self.ctx.seq_cp(SCRATCH, WORK)
        self.ctx.seq_rm(SCRATCH)

    def _put(self, state: SeqState, i0: int, i1: int, at: int, p: int, seq: int) -> None:
        """Cells i0..i1-1 of a module into ``seq``, moved to start at position ``at``."""
        if not self.ctx.state_set(_cells(state, i0, i1), seq):
            raise RuntimeError("llama.cpp refused a module's cells")
        if at != p + i0:
            self.ctx.seq_add(seq, p + i0, p + i1, at - (p + i0))

    def _decode(self, seq: int, toks: list[int], pos: int, logits_last: bool) -> None:
        for i in range(0, len(toks), self.n_batch):
            part = toks[i:i + self.n_batch]
            last = i + len(part) == len(toks)
            self.ctx.decode([(t, pos + i + j, (seq,), logits_last and last and j == len(part) - 1)
                             for j, t in enumerate(part)])

    def _finish(self, plan: RowPlan, t0: float, max_tokens: int, want_state: bool) -> Run:
        tail = plan.tail_start
        self._decode(WORK, plan.tokens[tail:], tail, True)
        logits = self.ctx.logits(-1)
        ms = (time.perf_counter() - t0) * 1000
        state = None
        if want_state and plan.modules:
            data = cells_state(self.ctx, WORK, plan.modules[0][0], tail, SCRATCH)
            state = parse(data, SEQ_STATE_VERSION, "attention")
        first = logits
        toks, seen = [], []
        pos = len(plan.tokens)
        for _ in range(max_tokens):
            tok = int(np.argmax(logits))
            toks.append(tok)
            seen.append(logits)
            if self.model.is_eog(tok) or len(toks) == max_tokens:
                break
            self.ctx.decode([(tok, pos, (WORK,), True)])
            pos += 1
            logits = self.ctx.logits(-1)
        return Run(ms, toks, seen, state=state, first_logits=first)


def runs_of(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions as [start, end) runs of consecutive ones."""
    out: list[tuple[int, int]] = []
    for x in positions:
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0], x + 1)
        else:
            out.append((x, x + 1))
    return out


def _cells(state: SeqState, i0: int, i1: int) -> bytes:
    s = state.first_stream
    part = s.reordered(np.arange(i0, i1))
    return replace(state, kv=(KvBlock((part,)),)).to_bytes()


# ---- reading K and V ----------------------------------------------------------------------


def layer_rows(stream: Stream, layer: int, which: str) -> np.ndarray:
    """(cells, width) float32 rows of one layer's K or V (f16 caches only)."""
    rows = (stream.k if which == "k" else stream.v)[layer]
    if rows.type_id != F16:
        raise ValueError("the oracle reads f16 K and V only")
    if rows.transposed:
        return rows.data.view("<f2").T.astype(np.float32)
    return rows.data.view("<f2").astype(np.float32)


@dataclass(frozen=True)
class Deviation:
    """Squared distance of every module token's K and V from the cold run's, per layer
    (arrays of layers x tokens), with the cold run's mean squared norm per layer."""
    k: np.ndarray
    v: np.ndarray
    k_norm: np.ndarray
    v_norm: np.ndarray

    def oracle(self) -> np.ndarray:
        """Per token: the deviation over all layers, K and V, each layer's scaled by the cold
        run's mean squared norm there (so no layer dominates by its scale alone)."""
        return (self.k / self.k_norm[:, None] + self.v / self.v_norm[:, None]).sum(axis=0)

    def layer_v(self, layer: int = 1) -> np.ndarray:
        """CacheBlend's signal: the V deviation at one early layer."""
        return self.v[min(layer, len(self.v) - 1)]


def deviation(cold: SeqState, composed: SeqState, plan: RowPlan) -> Deviation:
    """The deviation of the module tokens (the cells both states hold at the modules'
    positions, which each state holds in position order)."""
    want = np.asarray(plan.positions(range(plan.module_tokens)))
    a, b = cold.first_stream, composed.first_stream
    ia, ib = _index(a, want), _index(b, want)
    n_layer = len(a.k)
    out = {w: np.zeros((n_layer, len(want))) for w in ("k", "v")}
    norm = {w: np.zeros(n_layer) for w in ("k", "v")}
    for layer in range(n_layer):
        for w in ("k", "v"):
            ra, rb = layer_rows(a, layer, w)[ia], layer_rows(b, layer, w)[ib]
            out[w][layer] = ((ra - rb) ** 2).sum(axis=1)
            norm[w][layer] = max(float((ra ** 2).sum(axis=1).mean()), 1e-30)
    return Deviation(out["k"], out["v"], norm["k"], norm["v"])


def _index(stream: Stream, positions: np.ndarray) -> np.ndarray:
    where = {int(p): i for i, p in enumerate(stream.positions)}
    return np.asarray([where[int(p)] for p in positions], dtype=int)
