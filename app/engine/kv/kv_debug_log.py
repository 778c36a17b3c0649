"""The cache's context: every KV operation kept in the cell ledger, and llama.cpp asked for its
own cell map when a view wants it.

llama.cpp logs its cell map (cell_report.py) at the start of every find_slot, that is *before*
a ubatch is placed: after the last decode the newest cells are in no record. So ``report()``
makes llama.cpp log its map as it is now, with a probe that changes nothing: a sequence state
of ``size`` cells (metadata only) restored into an empty sequence. llama.cpp
(llama-kv-cache.cpp, state_read_meta) removes that sequence's cells (it has none: nothing
changes, the head stays), logs the map in find_slot, finds no room for ``size`` cells while any
cell is used, and fails before it changes a cell, the head or any data (state_clear's seq_rm
again finds nothing). The probe is made only when that argument holds: a cell is used, an
empty sequence exists, and the first cache read is one without a sliding window (a windowed
cache may reuse masked cells). The errors it makes llama.cpp log are expected, not warnings.

The log callback is process-wide: a listener only takes lines logged on the thread of a call
it is waiting for.
"""
from __future__ import annotations

import contextlib
import os
import struct
import threading

import numpy as np

from ..errors import ContextError
from ..states.hybrid_payload import attention_span
from ..llama.llama_backend import expected_errors
from ..llama.native import ContextParams, NativeContext, NativeModel, add_log_listener, remove_log_listener
from .cell_ledger import CellLedger
from .cell_report import EMPTY, CellReport, last_report

ENV = "LLAMA_KV_CACHE_DEBUG"
_env_lock = threading.Lock()
_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic: the first bytes of a sequence state


@contextlib.contextmanager
def debug_env(on: bool):
    """Set (or unset) LLAMA_KV_CACHE_DEBUG while a context is created; llama.cpp reads it then."""
    with _env_lock:
        old = os.environ.get(ENV)
        if on:
            os.environ[ENV] = "3"
        else:
            os.environ.pop(ENV, None)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old


class KvDebugLog:
    """Collects the lines logged during one call on one thread."""

    def __init__(self):
        self._thread: int | None = None
        self.lines: list[str] = []
        add_log_listener(self._on_log)

    def close(self) -> None:
        remove_log_listener(self._on_log)

    @contextlib.contextmanager
    def capture(self):
        self.lines = []
        self._thread = threading.get_ident()
        try:
            yield self
        finally:
            self._thread = None

    def _on_log(self, level: int, text: str) -> None:
        if self._thread is not None and threading.get_ident() == self._thread:
            self.lines.append(text)


class TrackedContext(NativeContext):
    """The cache's context: a NativeContext whose KV operations also go to a CellLedger, and
    which can ask llama.cpp for its cell map. Only the sequence owner (sequence_ops.py) calls
    its operations."""

    def __init__(self, model: NativeModel, params: ContextParams, debug_log: bool = True,
                 windowed: bool = False, lazy: bool = False):
        """``lazy``: llama.cpp's context is created when a cell is first placed (or another
        call needs it); until then every sequence is empty and costs no memory."""
        self.debug_log = debug_log
        super().__init__(model, params, lazy=lazy)
        self.windowed = windowed  # sliding-window layers: a hybrid's may sit in the first cache
        self.ledger = CellLedger(int(self.n_ctx))
        self.log = KvDebugLog()
        self.probes = 0  # reports asked of llama.cpp (tests count them)
        self._report: CellReport | None = None  # llama.cpp's map since the last change
        self._ext: bool | None = None  # whether this model's state records a cell's ext fields
        # called after every operation (the engine publishes views): on_change(settled), settled
        # when a whole held operation ended (see held_changes), else after one llama.cpp call
        self.on_change = None
        self._holds = 0
        self._held_change = False

    def open(self) -> None:
        with debug_env(self.debug_log):  # llama.cpp reads it when it creates the context
            super().open()

    def close(self) -> None:
        self.log.close()
        super().close()

    def _changed(self) -> None:
        self._report = None
        if self._holds:
            self._held_change = True
        elif self.on_change is not None:
            self.on_change(False)

    @contextlib.contextmanager
    def held_changes(self, told: bool = False):
        """One change for a compound operation (clear and lay out again, snapshot and free…):
        views are told once it is over, never of its half-done cells; ``told``: even if no
        cell changed (the radix cache's nodes, hits or copies may have). Nests."""
        self._holds += 1
        self._held_change = self._held_change or told
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds and self._held_change:
                self._held_change = False
                if self.on_change is not None:
                    self.on_change(True)

    # ---- llama.cpp's report
    def report(self) -> tuple[CellReport | None, str]:
        """(llama.cpp's cell map now, "") or (None, why it cannot be had)."""
        if self._report is not None:
            return self._report, ""
        if not self.debug_log:
            return None, "the KV debug log is off"
        n_seq = self.params.n_seq_max
        ranges = {s: self.pos_range(s) for s in range(n_seq)}
        free = [s for s, (lo, hi) in ranges.items() if lo < 0 and hi < 0]
        if len(free) == n_seq:  # an empty cache: llama.cpp's ranges say all there is to say
            size = int(self.n_ctx)
            self._report = CellReport(0, 0, 0, size, np.full(size, -1, dtype=np.int64),
                                      np.full(size, EMPTY, dtype=np.int16), {})
            return self._report, ""
        if not free:
            return None, ("every sequence holds cells, so llama.cpp cannot be asked for its "
                          "cell map without changing one")
        if self.windowed and self.model.family != "attention":
            return None, "llama.cpp's cell map is not asked for on a hybrid with a sliding window"
        for ext in ((False, True) if self._ext is None else (self._ext,)):
            rep = self._probe(free[-1], ext)
            if rep is not None:
                self._ext, self._report = ext, rep
                return rep, ""
        return None, "llama.cpp logged no readable cell map (another format?)"

    def _probe(self, seq: int, ext: bool) -> CellReport | None:
        size = int(self.n_ctx)
        fields = [("pos", "<i4"), ("n_seq", "<u4")]
        fields += [("x", "<i4"), ("y", "<i4"), ("tok", "<i4")] if ext else []
        meta = np.zeros(size, dtype=fields + [("seq", "<i4")])
        meta["pos"] = np.arange(size)
        meta["n_seq"] = 1
        meta["seq"] = seq
        if ext:
            meta["tok"] = -1
        data = struct.pack("<IiII", _STATE_MAGIC, seq, 1, size) + meta.tobytes()
        self.probes += 1
        with self.log.capture(), expected_errors():
            placed = NativeContext.state_set(self, data, seq)
        if placed or self.pos_range(seq) != (-1, -1):  # cannot be (no room, no data): say so
            raise ContextError("llama.cpp took the KV report's probe as a state; clear the cache")
        return last_report(self.log.lines)

    def has_holes(self) -> bool:
        """Is a free cell followed by a used one? llama.cpp's report says; without one, any
        cell freed since the cache was empty may have left one."""
        rep, _why = self.report()
        return rep.has_holes if rep is not None else self.ledger.freed

    # ---- the operations, each also kept in the ledger
    def decode(self, entries) -> None:
        try:
            super().decode(entries)
        except ContextError:
            # llama.cpp keeps the ubatches placed before the one that failed
            top = {s: self.pos_range(s)[1] for s in {e[2][0] for e in entries}}
            self.ledger.add([(pos, tuple(seqs)) for _t, pos, seqs, _l in entries
                             if pos <= top[seqs[0]]])
            self._changed()
            raise
        self.ledger.add([(pos, tuple(seqs)) for _tok, pos, seqs, _lg in entries])
        self._changed()

    def state_set(self, data: bytes, seq: int, partial: bool = False) -> bool:
        ok = super().state_set(data, seq, partial=partial)
        if partial:  # a recurrent part only: no attention cell changes
            self._changed()
            return ok
        lo, hi = self.pos_range(seq)
        if ok or hi < 0:  # llama.cpp empties the sequence first, and again when it fails
            self.ledger.seq_rm(seq)
        if ok:
            # a hybrid's range is its recurrent record's too: read the cells' own positions
            span = None
            if self.model.family == "recurrent":
                span = (-1, -1)
            elif self.model.family == "hybrid":
                span = attention_span(data)
            lo, hi = span if span is not None else (lo, hi)
            # our states hold positions lo..hi, one cell each
            self.ledger.add([(p, (seq,)) for p in range(lo, hi + 1)] if lo >= 0 else [])
        self._changed()
        return ok

    # not open yet: every sequence is empty, so what changes cells changes nothing
    def pos_range(self, seq: int) -> tuple[int, int]:
        return super().pos_range(seq) if self.opened else (-1, -1)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        ok = super().seq_rm(seq, p0, p1) if self.opened else True
        if ok:
            self.ledger.seq_rm(seq, p0, p1)
            self._changed()
        return ok

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if self.opened:
            super().seq_cp(src, dst, p0, p1)
        self.ledger.seq_cp(src, dst, p0, p1)
        self._changed()

    def seq_keep(self, seq: int) -> None:
        if self.opened:
            super().seq_keep(seq)
        self.ledger.seq_keep(seq)
        self._changed()

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        if self.opened:
            super().seq_add(seq, p0, p1, delta)
        self.ledger.seq_add(seq, p0, p1, delta)
        self._changed()

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        if self.opened:
            super().seq_div(seq, p0, p1, d)
        self.ledger.seq_div(seq, p0, p1, d)
        self._changed()

    def clear(self) -> None:
        if self.opened:
            super().clear()
        self.ledger.clear()
        self._changed()
