"""The work context: where warm runs evaluate, with their cells where a cold run puts them.

llama.cpp's arithmetic depends on where a sequence's cells lie, not only on what they hold:
without flash attention the softmax and the V product sum over cells in SIMD lanes grouped by
cell index, and flash attention's tiled path (ubatches of 64 tokens or more) walks the cache in
64-cell tiles counted from cell 0. A cold run in a fresh context puts position i in cell i. The
radix cache's own context (kv_engine.py) shares cells between many prompts, so a prompt's cells
lie wherever they were placed; evaluating there is exact only on the slowest kernel path.

So runs evaluate here instead: a context of its own holding one sequence whose position i is
always in cell i. It keeps what the last run left (like a llama-server slot): the next run keeps
the longest common prefix, trims the rest (freed cells at the end are the next ones filled),
and copies what it still needs from the radix cache — positions L..R as one block of cells,
which llama.cpp places in the first free run of cells, right after position L-1. Then the rest
is evaluated in plain batches with the fastest kernel. The cells' data was computed the same
way (every cached node comes from here), so with the same batch starts a cold run gives the same
bits, whichever kernel runs.

Sliding-window models do not use it: their window cells do not survive a trim or a restore
(llama.cpp issue 25295), so they keep forking resident sequences in the cache's context.

Hybrid and recurrent models (``stateful``) keep, besides attention cells, one recurrent state
per sequence that stands at the sequence's end and cannot be cut back (llama.cpp's seq_rm
refuses it). So the work context keeps what it holds only when that is exactly a prefix of the
next run's history; otherwise it keeps the shared attention cells, copies the missing ones, and
puts back the recurrent state of the reused depth: a snapshot (llama.cpp's partial state, the
recurrent part only) taken when a run passed that depth (``snapshots``, after the batch ending
there) and kept by the radix cache's node of that depth.
"""
from __future__ import annotations

from ..llama.batch_feed import feed_batches, feed_token
from ..llama.batch_policy import shared_history
from ..errors import ContextError, ContextOverflowError, KvPrimerError
from ..llama.native import ContextParams, NativeContext, NativeModel
from ..states.copied_cells import cells_state
from ..states.hybrid_payload import attention_span
from ..states.seq_payload import in_position_order
from ..task_state import TaskState

SEQ, STAGING = 0, 1  # the run's sequence; where copied cells land before they join it
# composed modules' cells, already moved to their places in the row, until the sequence reaches
# them (attention-only models: work_sequences in memory_budget.py)
HELD = 2


class WorkContext:
    def __init__(self, model: NativeModel, params: ContextParams, family: str = "attention",
                 grouping_exact=lambda: False):
        self._model, self._params = model, params  # the engine's model and context settings
        # asked of the engine each time (its kernel choice owns it): cells are alike in any
        # batches, so a history is shared up to any position, not only where a batch ended
        self.grouping_exact = grouping_exact
        self._ctx: NativeContext | None = None
        self.family = family  # "attention", "hybrid" or "recurrent" (no attention cells)
        self.stateful = family != "attention"  # a recurrent state at the end, not cut back
        self.tokens: list[int] = []  # position i holds tokens[i], in cell i
        self.cuts: list[int] = []  # batch starts of the history that computed those cells
        # compose: where the first cell placed out of context lies (shifted in from a module);
        # it and every later cell are not what a cold run computes, whatever their tokens
        self.composed_from: int | None = None
        # stateful: the recurrent part of the state at these depths (taken by ``evaluate``)
        self.snapshots: dict[int, bytes] = {}
        self._drop_held_marks()

    @property
    def ctx(self) -> NativeContext:
        if self._ctx is None:  # the run's sequence and the staging one
            self._ctx = NativeContext(self._model, self._params)
        return self._ctx

    @property
    def opened(self) -> bool:
        return self._ctx is not None

    @property
    def params(self) -> ContextParams:
        return self._params

    def reopen(self, params: ContextParams) -> None:
        """Hold nothing, and open the context with ``params`` when next used."""
        self.close()
        self._params = params

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        self.tokens, self.cuts = [], []
        self.snapshots, self.composed_from = {}, None
        self._drop_held_marks()

    def reset(self) -> None:
        if self._ctx is not None:
            # Attention cells are not zeroed: an empty cell is masked (weight exactly 0) and
            # holds finite values an earlier evaluation wrote, as other sequences' cells beside a
            # run always do, so results are bit for bit the same; llama.cpp zeroes the memory
            # never written when it creates the context. Zeroing cost ~23 ms per reset at 8k
            # cells and ~89 ms at 32k on the default model's shape. Recurrent states are zeroed.
            self._ctx.clear(data=self.stateful)
        self.tokens, self.cuts = [], []
        self.snapshots, self.composed_from = {}, None
        self._drop_held_marks()

    def _in_context(self, n: int) -> int:
        """``n``, or less where a composed module's cells begin (never shared as exact)."""
        return n if self.composed_from is None else min(n, self.composed_from)

    # ---- keeping and bringing cells
    def bring(self, tokens: list[int], reuse: int, cuts: list[int], fetch, snapshot=None) -> int:
        """Hold ``tokens[:reuse]``, computed in batches starting at ``cuts`` (and ending at
        ``reuse``): keep what this context shares of that history, copy the rest from the cache
        (``fetch(p0, p1)``: a state of those positions' cells). A stateful model then gets the
        recurrent state at ``reuse`` from ``snapshot()`` (unless it holds exactly that
        history). Returns the tokens copied."""
        keep = self._in_context(shared_history(self.tokens, self.cuts, tokens, cuts, reuse,
                                               self.grouping_exact()))
        if self.stateful and keep == len(self.tokens) == reuse:
            return 0  # its recurrent state stands at reuse already
        try:
            self.keep(keep)
            if keep < reuse and self.family == "recurrent":  # no cells: only the bookkeeping
                self.tokens.extend(tokens[keep:reuse])
                self.cuts.extend(c for c in cuts if keep <= c < reuse)
            elif keep < reuse:
                self.append_cells(fetch(keep, reuse), tokens[keep:reuse], cuts)
            if self.stateful and reuse:
                self.set_recurrent(snapshot(), reuse)
        except Exception:
            if self.stateful:  # a stale recurrent state must not pass for the kept prefix's
                self.reset()
            raise
        return reuse - keep

    def restore(self, data: bytes, tokens: list[int], cuts: list[int], reuse: int,
                recurrent: bytes | None = None) -> int:
        """Hold ``tokens[:reuse]`` from a saved state (cells of positions 0..n-1), unless this
        context already shares that much of its history; returns the tokens restored. (A
        stateful model's state stands at its end: ``reuse`` must be all of it; ``recurrent``:
        its recurrent part, when ``data`` holds the cells only.)"""
        if self.stateful and reuse != len(tokens):
            if reuse:
                raise ValueError("a recurrent state is reused whole or not at all")
            self.keep(0)
            return 0
        shared = self._in_context(shared_history(self.tokens, self.cuts, tokens, cuts,
                                                 len(tokens), self.grouping_exact()))
        if shared >= reuse and (not self.stateful or len(self.tokens) == reuse):
            self.keep(reuse)
            return 0
        self.reset()
        ctx = self.ctx
        # a hybrid's range starts at its recurrent record: only the end is the same
        ok = ctx.state_set(in_position_order(data), SEQ)
        if ok and recurrent is not None:
            ok = ctx.state_set(recurrent, SEQ, partial=True)
        lo, hi = ctx.pos_range(SEQ)
        if not ok or hi != len(tokens) - 1 or (lo != 0 and not self.stateful):
            self.reset()
            raise KvPrimerError("llama.cpp refused the saved state's cells; prime the prefix again")
        self.tokens, self.cuts = list(tokens), [c for c in cuts if c < len(tokens)]
        self.keep(reuse)
        return reuse

    def keep(self, n: int) -> None:
        """Keep the first ``n`` positions; the cells after them are freed (and filled next).
        A stateful model's recurrent state is then stale until ``set_recurrent``."""
        if n >= len(self.tokens):
            return
        ctx = self.ctx
        if not self.stateful:
            ctx.seq_rm(SEQ, n, -1)
        elif n == 0 or self.family == "recurrent":
            ctx.seq_rm(SEQ)
        else:
            # llama.cpp cannot cut a recurrent state back, and a hybrid's seq_rm refuses the
            # whole call: share the kept cells with staging, drop the sequence, take them back
            # (the cells stay where they are; only the sequence ids change)
            ctx.seq_rm(STAGING)
            ctx.seq_cp(SEQ, STAGING, 0, n)
            ctx.seq_rm(SEQ)
            ctx.seq_cp(STAGING, SEQ)
            ctx.seq_rm(STAGING)
        self.tokens = self.tokens[:n]
        self.cuts = [c for c in self.cuts if c < n]
        if self.composed_from is not None and n <= self.composed_from:
            self.composed_from = None
        self.snapshots = {p: d for p, d in self.snapshots.items() if p <= n}

    def set_recurrent(self, data: bytes, depth: int) -> None:
        """Put back the recurrent state at ``depth`` (a snapshot taken at that depth), over the
        sequence's stale one; the sequence holds exactly ``depth`` tokens."""
        ctx = self.ctx
        if not data or not ctx.state_set(data, SEQ, partial=True) \
                or ctx.pos_range(SEQ)[1] != depth - 1:
            self.reset()
            raise KvPrimerError("llama.cpp refused a cached recurrent state; clear the cache "
                                "and run again")
        self.snapshots[depth] = data

    def recurrent_state(self) -> bytes:
        """The recurrent part of the sequence's state, at its end (stateful models)."""
        return self.ctx.state_get(SEQ, partial=True)

    def append_cells(self, data: bytes, tokens: list[int], cuts: list[int], shift: int = 0) -> None:
        """Put a state of cells (positions in order, from ``cells_of``) right after what the
        sequence holds; ``shift`` moves them there from positions ``shift`` lower (llama.cpp's
        seq_add: the next decode re-rotates their K)."""
        if not tokens:
            return
        ctx = self.ctx
        start = len(self.tokens)
        lo, hi = self._stage(data)
        want = (start - shift, start - shift + len(tokens) - 1)
        if self.stateful:  # llama.cpp's range counts the stale recurrent record: read the cells'
            lo, hi = attention_span(data) or (lo, hi)
        if (lo, hi) != want:
            ctx.seq_rm(STAGING)
            raise KvPrimerError(f"cells copied from the cache hold positions {lo}..{hi}, not "
                                f"{want[0]}..{want[1]}; clear the cache and run again")
        if shift:
            ctx.seq_add(STAGING, lo, hi + 1, shift)
            if self.composed_from is None:
                self.composed_from = start
        ctx.seq_cp(STAGING, SEQ)
        ctx.seq_rm(STAGING)
        self.tokens.extend(tokens)
        self.cuts.extend(c for c in cuts if start <= c < start + len(tokens))

    def _stage(self, data: bytes) -> tuple[int, int]:
        """Load a state of cells into the staging sequence; the positions it holds."""
        ctx = self.ctx
        ctx.seq_rm(STAGING)
        if not ctx.state_set(data, STAGING):
            ctx.seq_rm(STAGING)
            raise KvPrimerError("llama.cpp refused cells copied from the cache; clear the cache "
                                "and run again")
        return ctx.pos_range(STAGING)

    # ---- composing: cells moved once, taken in turn
    @property
    def can_hold(self) -> bool:
        """Cells can wait in a sequence of their own (not on stateful models: their held
        sequence would carry a recurrent state too)."""
        return not self.stateful

    def hold(self, data: bytes, p0: int, p1: int, shift: int) -> None:
        """Hold a state of cells (positions p0..p1-1, in order, from ``cells_of``) moved by
        ``shift`` to where the row wants them, apart from the run's sequence until ``take_held``.
        Every move made before a decode is re-rotated by that one decode (llama.cpp re-rotates
        K across the whole cache once per decode that finds moved cells), so a row's modules
        held first cost one re-rotation, not one per placed part."""
        ctx = self.ctx
        lo, hi = self._stage(data)
        if (lo, hi) != (p0, p1 - 1):
            ctx.seq_rm(STAGING)
            raise KvPrimerError(f"cells copied from the cache hold positions {lo}..{hi}, not "
                                f"{p0}..{p1 - 1}; clear the cache and run again")
        if shift:
            ctx.seq_add(STAGING, p0, p1, shift)
        ctx.seq_cp(STAGING, HELD)  # the state set clears its sequence: held ones gather here
        ctx.seq_rm(STAGING)
        # unmoved cells held first lie right after the sequence, as a cold run's would (as
        # append_cells assumes); any other held cells take the cells later evaluations would
        if not shift and not self._held_any and p0 == len(self.tokens):
            self._held_in_place = (p0, p1)
        else:
            self._displaced = True
        self._held_any = True

    def take_held(self, tokens: list[int]) -> None:
        """Append the held cells of the next ``len(tokens)`` positions (shared, not copied);
        unless they were held in place, they and every later cell are not a cold run's."""
        if not tokens:
            return
        start, end = len(self.tokens), len(self.tokens) + len(tokens)
        self.ctx.seq_cp(HELD, SEQ, start, end)
        lo, hi = self._held_in_place or (0, 0)
        if self.composed_from is None and not lo <= start < end <= hi:
            self.composed_from = start
        self.tokens.extend(tokens)
        self.cuts.append(start)

    def drop_held(self) -> None:
        """Free the held cells the sequence did not take."""
        if self._ctx is not None and self._held_any:
            self._ctx.seq_rm(HELD)
        self._drop_held_marks()

    def _drop_held_marks(self) -> None:
        self._held_any = self._displaced = False
        self._held_in_place: tuple[int, int] | None = None

    def cells(self, p0: int, p1: int) -> bytes:
        """A state of the cells at positions p0..p1-1, in position order (for the cache)."""
        return cells_state(self.ctx, SEQ, p0, p1, STAGING)

    # ---- evaluating
    def evaluate(self, tokens: list[int], starts: list[int], task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, snap_at=()):
        """Append ``tokens`` in batches starting at the absolute positions ``starts``; return
        the last logits (or None). Cancelling between batches keeps what was evaluated. A
        stateful model keeps its recurrent state at every depth of ``snap_at`` a batch ends at
        (``snapshots``)."""
        if not tokens:
            return None
        start, end = len(self.tokens), len(self.tokens) + len(tokens)
        if end >= self.ctx.n_ctx:
            raise ContextOverflowError(end, self.ctx.n_ctx)
        held_after = self._held_in_place is not None and start < self._held_in_place[1]
        if (self._displaced or held_after) and self.composed_from is None:
            self.composed_from = start  # its cells land after held ones, out of position order

        def after(a: int, b: int) -> None:
            self.cuts.append(a)
            if self.stateful and b in snap_at:
                self.snapshots[b] = self.recurrent_state()

        feed_batches(self._decode, tokens, start, starts, SEQ, want_logits=want_logits,
                     task=task, stage=stage, after=after)
        return self.ctx.logits(-1) if want_logits else None

    def step(self, token: int) -> None:
        """One generated token."""
        self.cuts.append(len(self.tokens))
        feed_token(self._decode, token, len(self.tokens), SEQ)

    def _decode(self, entries) -> None:
        """One llama_decode of the run's sequence; what it holds grows by the batch."""
        try:
            self.ctx.decode(entries)
        except ContextError:
            self.reset()  # a failed decode may have placed part of the batch: start clean
            raise
        self.tokens.extend(e[0] for e in entries)

