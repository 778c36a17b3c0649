"""The one owner of what the cache context's sequences hold: every change of their cells goes
through here, and each keeps the engine's account of the tokens (``engine.seq_tokens``,
sequence_tokens.py) and the cell ledger (cell_ledger.py, kept by the context) in step with
llama.cpp's cells.

``engine.seqs``: decodes (the engine's evaluation hands its batches here), clear, trim, fork,
shift, divide, moving cells between sequences, restoring states, and the radix cache's own
moves (holding an evicted node's cells, laying the cache out again). Nothing else calls the
cache context's seq_* / state_set / clear / decode or changes ``seq_tokens``
(tests/project/test_architecture.py checks it). The radix cache learns which nodes lost cells from its
own callers (``Engine.clear_all``, ``Engine.keep_only``).
"""
from __future__ import annotations

import numpy as np

from ..errors import ContextError, KvPrimerError
from ..states.copied_cells import cells_state
from .cell_report import CellReport
from .sequence_tokens import SequenceTokens


class SequenceOps:
    def __init__(self, ctx, tokens: SequenceTokens, n_seq: int, kv_view):
        self._ctx = ctx  # the cache's context (kv_debug_log.TrackedContext)
        self._tokens = tokens  # the engine's account of what each sequence holds
        self._n_seq = n_seq
        self._kv_view = kv_view  # the engine's, to see which cells are shared before a move

    def check(self, seq: int) -> None:
        if not 0 <= seq < self._n_seq:
            raise KvPrimerError(f"sequence {seq} does not exist; this context has sequences "
                                f"0 to {self._n_seq - 1}")

    def clear(self, seq: int) -> None:
        self.check(seq)
        self._ctx.seq_rm(seq)
        self._tokens.clear(seq)

    def clear_all(self) -> None:
        """Empty every sequence."""
        self._ctx.clear()
        self._tokens.clear_all()

    def keep_only(self, seq: int) -> None:
        """Drop every other sequence; cells ``seq`` shared with them become its own."""
        self.check(seq)
        self._ctx.seq_keep(seq)
        self._tokens.keep_only(seq)

    # ---- evaluation's writes
    def decode(self, entries: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """One llama_decode of (token, position, (seq,), wants logits) entries, possibly for
        several sequences, each entry appending its token to its sequence's tokens."""
        try:
            self._ctx.decode(entries)
        except ContextError:
            for seq in {e[2][0] for e in entries}:
                self._resync(seq)
            raise
        for tok, _pos, seqs, _logits in entries:
            self._tokens.extend(seqs[0], (tok,))

    def _resync(self, seq: int) -> None:
        """After a failed decode, trust llama.cpp's own position range."""
        lo, hi = self._ctx.pos_range(seq)
        if lo != 0:
            self._ctx.seq_rm(seq)
            self._tokens.clear(seq)
        else:
            self._tokens.truncate(seq, hi + 1)

    # ---- states
    def restore(self, seq: int, data: bytes, tokens) -> bool:
        """Put a state holding ``tokens`` into ``seq``. False when llama.cpp rejects it; the
        sequence then holds what it held before."""
        self.check(seq)
        # llama.cpp clears the sequence before it finds a layer/row/V-layout mismatch; keep a
        # copy to put back (run paths restore into an empty sequence, so this costs them nothing)
        old = self.take_out(seq)
        self._ctx.seq_rm(seq)
        self._tokens.clear(seq)
        if not self._ctx.state_set(data, seq):
            self._ctx.seq_rm(seq)
            self.put_back(seq, old)
            return False
        self._tokens.set(seq, tokens)
        return True

    def take_out(self, seq: int) -> tuple[list[int], bool, bytes]:
        """What ``seq`` holds, to ``put_back`` after the cache was cleared (b"": nothing)."""
        tokens, moved = self._tokens[seq], self._tokens.is_moved(seq)
        return tokens, moved, self._ctx.state_get(seq) if tokens or moved else b""

    def put_back(self, seq: int, held: tuple[list[int], bool, bytes]) -> bool:
        """Put back what ``take_out`` took into an empty ``seq``; False if llama.cpp refuses."""
        tokens, moved, data = held
        if not data:
            return True
        if not self._ctx.state_set(data, seq):
            return False
        self._tokens.set(seq, tokens, moved=moved)
        return True

    def set_recurrent(self, seq: int, data: bytes) -> bool:
        """Replace the recurrent state of ``seq`` (a hybrid's or recurrent model's), leaving
        its cells alone; False if llama.cpp refuses it."""
        return self._ctx.state_set(data, seq, partial=True)

    def hold(self, seq: int, holding: int) -> None:
        """Move the cells of ``seq`` into ``holding`` (they stay where they lie) and empty it."""
        self._ctx.seq_cp(seq, holding)
        self.clear(seq)

    def trim(self, seq: int, keep: int) -> None:
        """Keep the first ``keep`` tokens of ``seq``, drop the rest."""
        self.check(seq)
        n = self._tokens.count(seq)
        if keep < n or (self._tokens.is_moved(seq) and keep <= n):
            if not self._ctx.seq_rm(seq, keep, -1):
                raise ContextError("llama.cpp could not trim that sequence")
            self._tokens.trim(seq, keep)

    def fork(self, src: int, dst: int, upto: int | None = None) -> None:
        """Make ``dst`` hold what ``src`` holds (its first ``upto`` tokens); the cells are
        shared, nothing is copied."""
        self.check(src)
        self.check(dst)
        if src == dst:
            return
        self.clear(dst)
        if upto is None or upto >= self._tokens.count(src):
            self._ctx.seq_cp(src, dst)
        elif upto > 0:
            self._ctx.seq_cp(src, dst, 0, upto)
        self._tokens.copy(src, dst, upto)

    def fork_into_user_sequence(self, src: int) -> None:
        """Fork ``src`` into sequence 0, the user's, which must be empty: a fork replaces what
        the destination holds, and the user's sequence is theirs to clear."""
        if self._tokens.count(0) or self._tokens.is_moved(0):
            raise KvPrimerError("sequence 0 is in use: clear it first, then fork into it")
        self.fork(src, 0)

    def cells_of(self, seq: int, p0: int, p1: int, scratch: int) -> bytes:
        """A state of only the cells of ``seq`` at positions p0..p1-1 (through ``scratch``)."""
        return cells_state(self._ctx, seq, p0, p1, scratch)

    def add_cells(self, data: bytes, seq: int, scratch: int, tokens: list[int]) -> bool:
        """Put a state of cells (from ``cells_of``) into ``seq`` beside what it holds, which
        then holds ``tokens``. False when llama.cpp refuses the state."""
        self._ctx.seq_rm(scratch)
        if not self._ctx.state_set(data, scratch):
            self._ctx.seq_rm(scratch)
            return False
        self._ctx.seq_cp(scratch, seq)
        self._ctx.seq_rm(scratch)
        self._tokens.set(seq, tokens)
        return True

    def place_cells(self, src: int, p0: int, p1: int, dst: int, delta: int, scratch: int,
                    tokens: list[int]) -> None:
        """Append the cells of ``src`` at positions p0..p1-1 to ``dst``, moved by ``delta``
        (shared when not moved; otherwise copied through ``scratch``, then seq_add, which makes
        the next decode re-rotate their K). ``tokens`` are the tokens they hold."""
        if self._tokens.count(dst) != p0 + delta:
            raise KvPrimerError("cells must be placed right after what the sequence holds")
        if delta == 0:
            self._ctx.seq_cp(src, dst, p0, p1)
        else:
            data = self.cells_of(src, p0, p1, scratch)
            if not self._ctx.state_set(data, scratch):
                self._ctx.seq_rm(scratch)
                raise ContextError("llama.cpp refused a module's cells; clear the cache")
            self._ctx.seq_add(scratch, p0, p1, delta)
            self._ctx.seq_cp(scratch, dst)
            self._ctx.seq_rm(scratch)
        self._tokens.extend(dst, tokens)

    def used_cells(self, ignoring: int | None = None) -> int:
        """Cells holding some sequence's tokens (besides sequence ``ignoring``'s), by the
        cell ledger (what the operations make cells hold: no placement involved)."""
        return self._ctx.ledger.used(ignoring)

    def has_holes(self) -> bool:
        """Is a free cell followed by a used one (llama.cpp would fill it next)? llama.cpp's
        report says (kv_debug_log.py); without one, whether any cell was freed."""
        return self._ctx.has_holes()

    def report(self) -> tuple[CellReport | None, str]:
        """llama.cpp's own cell map now, or None and why not (kv_debug_log.py)."""
        return self._ctx.report()

    def shift(self, seq: int, p0: int, delta: int) -> None:
        """Add ``delta`` to the positions of ``seq`` from ``p0`` on (llama.cpp's seq_add).

        The moved cells keep K/V computed at their old positions (K is re-roped), so they are no
        longer what evaluating those tokens would give: ``seq_tokens[seq]`` keeps only the tokens
        below the moved range, and the sequence is marked moved until trimmed back to them.
        Cells shifted below position 0 are freed.
        """
        self.check(seq)
        if delta == 0:
            return
        self._check_unshared(seq, p0, "shift")
        self._ctx.seq_add(seq, p0, -1, delta)
        self._after_move(seq, max(0, min(p0, p0 + delta)))

    def divide(self, seq: int, p0: int, d: int) -> None:
        """Integer-divide the positions of ``seq`` from ``p0`` on by ``d`` (llama.cpp's seq_div)."""
        self.check(seq)
        if d < 1:
            raise KvPrimerError(f"divide positions by 1 or more, not {d}")
        if d == 1:
            return
        self._check_unshared(seq, p0, "divide")
        self._ctx.seq_div(seq, p0, -1, d)
        self._after_move(seq, max(0, p0 // d))

    def _check_unshared(self, seq: int, p0: int, verb: str) -> None:
        # a cell has one position for all its owners: moving a shared cell moves it for all
        view = self._kv_view()
        if view.has_cells and not view.unreported_cells:
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
        _lo, hi = self._ctx.pos_range(seq)
        self._tokens.moved_from(seq, exact, holds_more=hi >= min(exact, self._tokens.count(seq)))

