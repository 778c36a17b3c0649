"""Reading llama.cpp's KV cell map from its debug log, and keeping the cell mirror up to date.

With ``LLAMA_KV_CACHE_DEBUG=3`` in the environment when a context is created, every find_slot
(one per ubatch placed, and one per state restore) logs, at debug level:

    find_slot: stream[0], n =    40, used =    40, head =    40, size =   512, n_swa =     0
    "\\n" + one character per cell ('.', the sequence id, or 'M' when shared), " *\\n" every 256 + "\\n"
    "\\n" + each cell's position or '.', left-aligned in 5 characters, 64 a line + "\\n"
    find_slot: stream[0] min[0] =     0, max[0] =    39      (one line per non-empty sequence)

That is the cache *before* the ubatch lands. ``TrackedContext`` applies every operation and
ubatch to the ``CellMirror`` itself, so the mirror is current after every call, and checks it
against the logged map (see TrackedContext._take_record). A sequence id above 9 takes two
characters and makes the map ambiguous: while such a sequence holds cells the map is not
read, and the mirror (which applies every operation itself) is shown unchecked. The log callback is process-wide, so a listener only
accepts lines logged on the thread of a call it is waiting for.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass

import numpy as np

from .kv_cells import DISAGREES, CellMirror, LoggedMap, agrees
from ..llama.native import ContextParams, NativeContext, NativeModel, add_log_listener, remove_log_listener
from ..files.hybrid_payload import attention_span

ENV = "LLAMA_KV_CACHE_DEBUG"
_HEADER = re.compile(r"find_slot: stream\[(\d+)\], n =\s*(\d+), used =\s*(\d+), head =\s*(\d+), "
                     r"size =\s*(\d+)")
_env_lock = threading.Lock()


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


def parse_cell_map(text: str, size: int) -> np.ndarray | None:
    """The per-cell owner from the character map: id, -1 empty, -2 shared; None if ambiguous."""
    body = text.encode("ascii", "replace").replace(b" *", b"").translate(None, b"\n")
    if len(body) != size:  # a sequence id above 9 (two characters), or another format
        return None
    raw = np.frombuffer(body, dtype=np.uint8)
    out = raw.astype(np.int16) - ord("0")
    out[raw == ord(".")] = -1
    out[raw == ord("M")] = -2
    if ((out < -2) | (out > 9)).any():
        return None
    return out


_TENS = 10 ** np.arange(5, dtype=np.int64)


def parse_pos_map(text: str, size: int) -> np.ndarray | None:
    """Each cell's position (-1 empty) from the 5-character-wide map; None if it does not fit."""
    body = text.encode("ascii", "replace").replace(b" *", b"").translate(None, b"\n")
    if len(body) != 5 * size:  # a position of 100,000 or more, or another format
        return None
    cells = np.frombuffer(body, dtype=np.uint8).reshape(size, 5)
    if (cells[:, 4] == 32).all():  # every number has at most 4 digits: numpy's text parser
        pos = np.fromstring(body.replace(b".", b"-1"), dtype=np.int64, sep=" ")
        if len(pos) == size:
            return pos
    # left-aligned numbers padded with spaces, 5-digit ones touching the next: read digits
    digit = (cells >= 48) & (cells <= 57)
    n = digit.sum(axis=1)
    empty = cells[:, 0] == ord(".")
    if not np.array_equal(digit, np.arange(5) < n[:, None]) or ((n == 0) != empty).any():
        return None
    exp = np.clip(n[:, None] - 1 - np.arange(5), 0, 4)
    pos = np.where(digit, (cells.astype(np.int64) - 48) * _TENS[exp], 0).sum(axis=1)
    pos[empty] = -1
    return pos


class KvDebugLog:
    """Collects the find_slot records logged during one call on one thread."""

    def __init__(self):
        self._thread: int | None = None
        self._lines: list[str] = []
        self.maps_seen = 0
        add_log_listener(self._on_log)

    def close(self) -> None:
        remove_log_listener(self._on_log)

    @contextlib.contextmanager
    def capture(self):
        self._lines = []
        self._thread = threading.get_ident()
        try:
            yield self
        finally:
            self._thread = None

    def _on_log(self, level: int, text: str) -> None:
        if self._thread is not None and threading.get_ident() == self._thread:
            self._lines.append(text)

    def last_record(self) -> RawRecord | None:
        """The last find_slot record captured (maps not parsed yet), or None."""
        lines = self._lines
        for i in range(len(lines) - 1, -1, -1):
            m = _HEADER.match(lines[i])
            if m:
                maps = lines[i + 1:i + 3]
                if len(maps) < 2 or not all(t.startswith("\n") for t in maps):
                    return None  # a header without the two maps: debug level below 3
                self.maps_seen += 1
                return RawRecord(int(m.group(4)), int(m.group(3)), int(m.group(5)), maps[0], maps[1])
        return None


@dataclass(frozen=True)
class RawRecord:
    head: int
    used: int
    size: int
    cell_text: str
    pos_text: str

    def parse(self, size: int) -> LoggedMap | None:
        if self.size != size:
            return None
        single = parse_cell_map(self.cell_text, size)
        pos = parse_pos_map(self.pos_text, size) if single is not None else None
        if single is None or pos is None:
            return None
        return LoggedMap(self.head, self.used, size, pos, single)


class TrackedContext(NativeContext):
    """A NativeContext that keeps a CellMirror in step with every KV operation."""

    def __init__(self, model: NativeModel, params: ContextParams, debug_log: bool = True):
        with debug_env(debug_log):
            super().__init__(model, params)
        self.debug_log = debug_log
        self.mirror = CellMirror(_cache_size(self))
        self.log = KvDebugLog()
        self._unchecked = None
        self.on_change = None  # called after every operation (the engine publishes views)
        if not debug_log:
            self.mirror.distrust("the KV debug log is off")

    def close(self) -> None:
        self.log.close()
        super().close()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # Parsing a map costs about a millisecond at 4,096 cells, more than a 1-token decode's
    # share allows. So while the record is trusted, only the last map is kept (with the record
    # as it was then) and checked when a view is built: the map is cumulative, so it catches
    # any earlier drift too. While it is not trusted, each map is read at once to regain trust.
    _NO_MAP = "llama.cpp logged no readable cell map (format changed, or a sequence id above 9)"

    def _take_record(self) -> RawRecord | None:
        rec = self.log.last_record()
        if rec is not None and _has_wide_ids(self.mirror.owners):
            # llama.cpp prints ids above 9 with two characters: its map cannot be read, but the
            # mirror, which applies every operation itself, stays as trustworthy as it was
            self._unchecked = None
            return rec
        if rec is None:
            if self.debug_log:
                self.mirror.distrust(self._NO_MAP)
            self._unchecked = None
        elif self.mirror.trusted:
            self._unchecked = (rec, self.mirror.pos.copy(), self.mirror.owners.copy())
        else:
            m = rec.parse(self.mirror.size)
            if m is None:
                self.mirror.distrust(self._NO_MAP)
            else:
                self.mirror.check(m)
            self._unchecked = None
        return rec

    def verify(self) -> None:
        """Check the record against the last map llama.cpp logged (see above)."""
        if self._unchecked is None:
            return
        rec, pos, owners = self._unchecked
        self._unchecked = None
        if _has_wide_ids(owners):
            return
        m = rec.parse(self.mirror.size)
        if m is None:
            self.mirror.distrust(self._NO_MAP)
        elif not agrees(pos, owners, m):
            self.mirror.distrust(DISAGREES)

    def decode(self, entries) -> None:
        with self.log.capture():
            super().decode(entries)  # raises on failure: llama.cpp then placed nothing
        rec = self._take_record()
        placed = [(pos, tuple(seqs)) for _tok, pos, seqs, _lg in entries]
        if rec is not None:
            self.mirror.place(placed, rec.head, rec.used)
        else:
            self.mirror.place(placed)
        self._changed()

    def state_set(self, data: bytes, seq: int, partial: bool = False) -> bool:
        if partial:  # a recurrent part only: no attention cell moves
            ok = super().state_set(data, seq, partial=True)
            self._changed()
            return ok
        with self.log.capture():
            ok = super().state_set(data, seq)
        if ok:
            self.mirror.seq_rm(seq)
            rec = self._take_record()
            # a hybrid's range is its recurrent record's too: read the cells' own positions
            span = None
            if self.model.family == "recurrent":
                span = (-1, -1)
            elif self.model.family == "hybrid":
                span = attention_span(data)
            lo, hi = span if span is not None else self.pos_range(seq)
            # our states hold positions lo..hi, one cell each, placed contiguously
            entries = [(p, (seq,)) for p in range(lo, hi + 1)] if lo >= 0 else []
            if rec is not None:
                self.mirror.place(entries, rec.head, rec.used, contiguous=True)
            else:
                self.mirror.place(entries, contiguous=True)
        self._changed()
        return ok

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        ok = super().seq_rm(seq, p0, p1)
        if ok:
            self.mirror.seq_rm(seq, p0, p1)
            self._changed()
        return ok

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        super().seq_cp(src, dst, p0, p1)
        self.mirror.seq_cp(src, dst, p0, p1)
        self._changed()

    def seq_keep(self, seq: int) -> None:
        super().seq_keep(seq)
        self.mirror.seq_keep(seq)
        self._changed()

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        super().seq_add(seq, p0, p1, delta)
        self.mirror.seq_add(seq, p0, p1, delta)
        self._changed()

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        super().seq_div(seq, p0, p1, d)
        self.mirror.seq_div(seq, p0, p1, d)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self.mirror.clear()
        if not self.debug_log:
            self.mirror.distrust("the KV debug log is off")
        self._changed()


def _has_wide_ids(owners: np.ndarray) -> bool:
    """Does any cell belong to a sequence above 9 (two characters in llama.cpp's map)?"""
    return bool(np.any(owners >> np.uint64(10)))


def _cache_size(ctx: NativeContext) -> int:
    """Cells in the (unified) KV cache: llama.cpp pads n_ctx, so ask for the context size."""
    return int(ctx.n_ctx)
