"""A snapshot of the KV cache: every cell's position and owners, and a summary per sequence.

Two sources, and the view says which one it used:
- "debug-log": llama.cpp's own report of its cells (cell_report.py), asked for when the view is
  built (kv_debug_log.TrackedContext.report). Positions, which cells are used and every cell
  with one owner come from the report. A shared cell ("M" in llama.cpp's map) gets its owners
  from the cell ledger (cell_ledger.py: what the memory operations make every cell hold, not
  where it lies) when the ledger agrees with the report and names one owner set at that
  position, else from the report's ranges when exactly two sequences hold that position.
  A cell whose owners neither can tell is "owner not reported" (``cell_unreported``), never
  guessed.
- "ranges": only ``llama_memory_seq_pos_min/max`` per sequence, when llama.cpp cannot be asked
  (the debug log is off, every sequence holds cells, ...; ``note`` says why). Then there is no
  cell map (``cell_pos`` is None) and cells are counted from the position range; shared and
  used cells are unknown.

A hybrid or recurrent model also keeps one recurrent state per sequence, whatever its length:
the view has one slot per non-empty sequence, with the bytes llama.cpp would save of it and the
position it stands at. llama.cpp's position range of a hybrid's sequence is then the two parts'
overlap (pos_min is the recurrent state's, its last position); the report's ranges are the
attention cells' own. A recurrent model has no attention cells at all (source "recurrent").
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .cell_ledger import CellLedger, is_shared, lowest_bit
from .cell_report import SHARED, UNREPORTED, CellReport


@dataclass(frozen=True)
class SeqUsage:
    seq: int
    cells: int
    pos_min: int
    pos_max: int
    shared_cells: int | None  # None: unknown (ranges)
    exact_tokens: int = 0  # tokens the engine can reuse as-is (see Engine.seq_tokens)

    def as_dict(self) -> dict:
        return {"seq": self.seq, "cells": self.cells, "pos_min": self.pos_min,
                "pos_max": self.pos_max, "shared_cells": self.shared_cells}


@dataclass(frozen=True)
class RecurrentSlot:
    """A sequence's recurrent state: it has taken in every token up to ``pos``."""
    seq: int
    bytes: int
    pos: int

    def as_dict(self) -> dict:
        return {"seq": self.seq, "bytes": self.bytes, "pos": self.pos}


@dataclass(frozen=True)
class KvCacheView:
    n_cells: int
    used_cells: int | None  # None: unknown (ranges)
    source: str  # "debug-log" or "ranges"
    sequences: tuple[SeqUsage, ...]  # the non-empty sequences, by id
    kv_bytes_per_token: int
    n_seq_max: int
    note: str = ""  # why the source is "ranges", for the user
    cell_pos: np.ndarray | None = field(default=None, repr=False)  # int64 per cell, -1 empty
    cell_owners: np.ndarray | None = field(default=None, repr=False)  # uint64 bitmask per cell
    recurrent: tuple[RecurrentSlot, ...] = ()  # hybrid and recurrent models: one per sequence
    layers: str = ""  # which layers are which, on those models ("1 attention layer, ...")
    # bool per cell: used, but llama.cpp's report does not say by which sequences
    cell_unreported: np.ndarray | None = field(default=None, repr=False)
    # uint64 per cell: of an unreported shared cell, every sequence that may own it (the ledger's
    # owner sets at its position, one of which is its own); 0 where nothing is known
    cell_possible: np.ndarray | None = field(default=None, repr=False)

    @property
    def unreported_cells(self) -> int:
        return 0 if self.cell_unreported is None else int(np.count_nonzero(self.cell_unreported))

    @property
    def stateful(self) -> bool:
        return bool(self.layers)

    def slot(self, seq: int) -> RecurrentSlot | None:
        return next((r for r in self.recurrent if r.seq == seq), None)

    @property
    def has_cells(self) -> bool:
        return self.cell_pos is not None

    @property
    def used_bytes(self) -> int | None:
        return None if self.used_cells is None else self.used_cells * self.kv_bytes_per_token

    @property
    def total_bytes(self) -> int:
        return self.n_cells * self.kv_bytes_per_token

    def seq(self, seq: int) -> SeqUsage | None:
        return next((s for s in self.sequences if s.seq == seq), None)

    def owners(self, cell: int) -> list[int]:
        if self.cell_owners is None:
            return []
        m = int(self.cell_owners[cell])
        return [s for s in range(64) if m >> s & 1]

    def as_dict(self) -> dict:
        d = {"n_cells": self.n_cells, "used_cells": self.used_cells, "source": self.source,
             "sequences": [s.as_dict() for s in self.sequences]}
        if self.stateful:
            d.update(layers=self.layers, recurrent=[r.as_dict() for r in self.recurrent])
        return d


@dataclass(frozen=True)
class RecurrentLayers:
    """What a hybrid or recurrent model adds to the view: its layers in words, whether any of
    them attend (a recurrent model's do not), and ``state_bytes(seq)``, one sequence's
    recurrent state in bytes (asked of llama.cpp)."""
    layers: str
    attention: bool
    state_bytes: object  # callable: seq -> int

    @classmethod
    def of(cls, traits, ctx) -> "RecurrentLayers | None":
        """A model's (ModelTraits) recurrent layers in ``ctx``; None for an attention model."""
        if not (traits.recurrent or traits.hybrid):
            return None
        from ..llama.recurrent_state import recurrent_bytes

        return cls(traits.layers or "recurrent layers", not traits.recurrent,
                   lambda seq: recurrent_bytes(ctx, seq))


def build_view(report: CellReport | None, why: str, ledger: CellLedger, pos_range,
               n_seq_max: int, kv_bytes_per_token: int,
               exact_tokens: dict[int, int] | None = None,
               recurrent: RecurrentLayers | None = None) -> KvCacheView:
    """The view now: from llama.cpp's ``report`` (None: ``why`` not), the ledger for shared
    cells' owners, and ``pos_range(seq)`` (llama.cpp's). ``recurrent``: the model keeps a
    recurrent state per sequence (None: attention only)."""
    exact_tokens = exact_tokens or {}
    ranges = {s: tuple(pos_range(s)) for s in range(n_seq_max)}
    if recurrent is not None and not recurrent.attention:
        view = KvCacheView(0, 0, "recurrent", (), kv_bytes_per_token, n_seq_max,
                           "no attention layers: each sequence is one recurrent state")
    elif report is not None:
        view = _from_report(report, ledger, n_seq_max, kv_bytes_per_token, exact_tokens)
    elif recurrent is not None:
        # without the cell map the cells' first position is unknown (llama.cpp's is the
        # recurrent state's): runs on these models hold whole prompts, from position 0
        seqs = tuple(SeqUsage(s, hi + 1, 0, hi, None, exact_tokens.get(s, 0))
                     for s, (_lo, hi) in ranges.items() if hi >= 0)
        view = KvCacheView(ledger.size, None, "ranges", seqs, kv_bytes_per_token, n_seq_max,
                           why + "; attention cells counted from position 0")
    else:
        seqs = tuple(SeqUsage(s, hi - lo + 1, lo, hi, None, exact_tokens.get(s, 0))
                     for s, (lo, hi) in ranges.items() if lo >= 0)
        view = KvCacheView(ledger.size, None, "ranges", seqs, kv_bytes_per_token, n_seq_max, why)
    if recurrent is None:
        return view
    slots = tuple(RecurrentSlot(s, int(recurrent.state_bytes(s)), hi)
                  for s, (_lo, hi) in ranges.items() if hi >= 0)
    return replace(view, recurrent=slots, layers=recurrent.layers)


def _from_report(rep: CellReport, ledger: CellLedger, n_seq_max: int, kv_bytes_per_token: int,
                 exact_tokens: dict[int, int]) -> KvCacheView:
    pos, owner = rep.pos, rep.owner
    owners = np.zeros(len(pos), dtype=np.uint64)
    one = owner >= 0
    owners[one] = np.left_shift(np.uint64(1), owner[one].astype(np.uint64))
    lpos, lmask = ledger.cells()
    agrees = _ledger_agrees(rep, lpos, lmask)
    shared = owner == SHARED
    if shared.any():
        owners[shared] = _shared_owners(pos[shared], lpos, lmask, agrees, rep.ranges)
    unknown = (owner == UNREPORTED) | (shared & (owners == 0))
    if not unknown.any():
        seqs = _usage(pos, owners, n_seq_max, exact_tokens)
    elif agrees:  # the ledger holds what the report shows: its counts are exact
        seqs = _usage(lpos, lmask, n_seq_max, exact_tokens)
    else:
        seqs = tuple(SeqUsage(s, hi - lo + 1, lo, hi, None, exact_tokens.get(s, 0))
                     for s, (lo, hi) in sorted(rep.ranges.items()) if s < n_seq_max)
    n = int(np.count_nonzero(unknown))
    note = (f"{n:,} cell{'s' if n != 1 else ''}: owner not reported (llama.cpp's map runs "
            "sequence ids above 9 together and marks shared cells \"M\")") if n else ""
    possible = None
    if n and agrees:  # sibling prompts' shared cells at one position: which is which is not said
        possible = np.zeros(len(pos), dtype=np.uint64)
        multi = is_shared(lmask)
        for p_, m in zip(lpos[multi].tolist(), lmask[multi].tolist()):
            possible[(pos == p_) & unknown] |= np.uint64(m)
    return KvCacheView(rep.size, rep.used, "debug-log", seqs, kv_bytes_per_token, n_seq_max,
                       note, pos.copy(), owners, cell_unreported=unknown if n else None,
                       cell_possible=possible)


def _usage(pos: np.ndarray, owners: np.ndarray, n_seq_max: int,
           exact_tokens: dict[int, int]) -> tuple[SeqUsage, ...]:
    shared = is_shared(owners)
    seqs = []
    for s in range(n_seq_max):
        mine = (owners & np.uint64(1 << s)) != 0
        n = int(np.count_nonzero(mine))
        if n:
            p = pos[mine]
            seqs.append(SeqUsage(s, n, int(p.min()), int(p.max()),
                                 int(np.count_nonzero(mine & shared)), exact_tokens.get(s, 0)))
    return tuple(seqs)


def _ledger_agrees(rep: CellReport, lpos: np.ndarray, lmask: np.ndarray) -> bool:
    """Could the ledger's cells be the report's: same positions, every single owner the report
    names and every shared position among the ledger's?"""
    used = rep.owner != -1
    if len(lpos) != rep.used or int(np.count_nonzero(used)) != rep.used:
        return False
    if not np.array_equal(np.sort(lpos), np.sort(rep.pos[used])):
        return False
    multi = is_shared(lmask)
    one = rep.owner >= 0
    singles = lpos[~multi] * 64 + lowest_bit(lmask[~multi]) if (~multi).any() else lpos[:0]
    return (_within(rep.pos[one] * 64 + rep.owner[one], singles)
            and _within(rep.pos[rep.owner == SHARED], lpos[multi]))


def _within(a: np.ndarray, b: np.ndarray) -> bool:
    """Is multiset ``a`` contained in multiset ``b``?"""
    if not len(a):
        return True
    ua, ca = np.unique(a, return_counts=True)
    ub, cb = np.unique(b, return_counts=True)
    i = np.minimum(np.searchsorted(ub, ua), max(len(ub) - 1, 0))
    return bool(len(ub)) and bool(((ub[i] == ua) & (cb[i] >= ca)).all())


def _shared_owners(pos: np.ndarray, lpos: np.ndarray, lmask: np.ndarray, agrees: bool,
                   ranges: dict[int, tuple[int, int]]) -> np.ndarray:
    """Owner masks of shared cells at ``pos``; 0 where neither the ledger nor the ranges can
    tell (see module doc)."""
    out = np.zeros(len(pos), dtype=np.uint64)
    if agrees:
        multi = is_shared(lmask)
        pairs = np.unique(np.stack([lpos[multi], lmask[multi].view(np.int64)]), axis=1)
        p, c = np.unique(pairs[0], return_counts=True)
        only = p[c == 1]  # positions where every shared cell has the same owners
        keep = np.isin(pairs[0], only)
        known_p, known_m = pairs[0][keep], pairs[1][keep].view(np.uint64)
        if len(known_p):
            i = np.minimum(np.searchsorted(known_p, pos), len(known_p) - 1)
            hit = known_p[i] == pos
            out[hit] = known_m[i[hit]]
    # a shared cell has two owners at least, and each holds its position: where only two
    # sequences' ranges take in the position, they are its owners
    count = np.zeros(len(pos), dtype=np.int64)
    both = np.zeros(len(pos), dtype=np.uint64)
    for s, (lo, hi) in ranges.items():
        inside = (pos >= lo) & (pos <= hi)
        count += inside
        both[inside] |= np.uint64(1 << s)
    two = (out == 0) & (count == 2)
    out[two] = both[two]
    return out
