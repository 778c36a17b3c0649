"""A snapshot of the KV cache: every cell's position and owners, and a summary per sequence.

Two sources, and the view says which one it used:
- "debug-log": the cell mirror (kv_cells), checked against llama.cpp's logged cell maps and,
  when the view is built, against llama.cpp's own position range of every sequence.
- "ranges": only ``llama_memory_seq_pos_min/max`` per sequence. Used when the debug log is off,
  logs no readable map, or disagrees with the mirror. Then there is no cell map (``cell_pos`` is
  None) and cells are counted from the position range; shared and used cells are unknown.

A hybrid or recurrent model also keeps one recurrent state per sequence, whatever its length:
the view has one slot per non-empty sequence, with the bytes llama.cpp would save of it and the
position it stands at. llama.cpp's position range of a hybrid's sequence is then the two parts'
overlap (pos_min is the recurrent state's, its last position), so only pos_max checks the cell
map. A recurrent model has no attention cells at all (source "recurrent").
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .kv_cells import CellMirror


@dataclass(frozen=True)
class SeqUsage:
    seq: int
    cells: int
    pos_min: int
    pos_max: int
    shared_cells: int | None  # None: unknown (ranges)
    exact_tokens: int = 0  # tokens the engine can reuse as-is (see Engine.resident)

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


def build_view(mirror: CellMirror, pos_range, n_seq_max: int, kv_bytes_per_token: int,
               exact_tokens: dict[int, int] | None = None,
               recurrent: RecurrentLayers | None = None) -> KvCacheView:
    """The view now. ``pos_range(seq)`` asks llama.cpp; the mirror is used only if it agrees.
    ``recurrent``: the model keeps a recurrent state per sequence (None: attention only)."""
    exact_tokens = exact_tokens or {}
    ranges = {s: tuple(pos_range(s)) for s in range(n_seq_max)}
    if recurrent is not None:
        view = _stateful_view(mirror, ranges, n_seq_max, kv_bytes_per_token, exact_tokens,
                              recurrent)
        slots = tuple(RecurrentSlot(s, int(recurrent.state_bytes(s)), hi)
                      for s, (_lo, hi) in ranges.items() if hi >= 0)
        return replace(view, recurrent=slots, layers=recurrent.layers)
    note = mirror.problem if not mirror.trusted else ""
    if mirror.trusted:
        for s, r in ranges.items():
            if mirror.seq_range(s) != r:
                note = _disagrees(s)
                break
    if mirror.trusted and not note:
        return _from_mirror(mirror, n_seq_max, kv_bytes_per_token, exact_tokens)
    seqs = tuple(SeqUsage(s, hi - lo + 1, lo, hi, None, exact_tokens.get(s, 0))
                 for s, (lo, hi) in ranges.items() if lo >= 0)
    return KvCacheView(mirror.size, None, "ranges", seqs, kv_bytes_per_token, n_seq_max,
                       note or "no cell map")


def _disagrees(seq: int) -> str:
    return (f"the cell record disagrees with llama.cpp's positions of sequence {seq}; showing "
            "position ranges only")


def _stateful_view(mirror: CellMirror, ranges: dict, n_seq_max: int, kv_bytes_per_token: int,
                   exact_tokens: dict[int, int], recurrent: RecurrentLayers) -> KvCacheView:
    """The attention cells of a hybrid (none for a recurrent model), checked by pos_max only."""
    if not recurrent.attention:
        return KvCacheView(0, 0, "recurrent", (), kv_bytes_per_token, n_seq_max,
                           "no attention layers: each sequence is one recurrent state")
    note = mirror.problem if not mirror.trusted else ""
    if mirror.trusted:
        for s, (_lo, hi) in ranges.items():
            if mirror.seq_range(s)[1] != hi:
                note = _disagrees(s)
                break
    if mirror.trusted and not note:
        return _from_mirror(mirror, n_seq_max, kv_bytes_per_token, exact_tokens)
    # without the cell map the cells' first position is unknown (llama.cpp's is the recurrent
    # state's): runs on these models hold whole prompts, from position 0
    seqs = tuple(SeqUsage(s, hi + 1, 0, hi, None, exact_tokens.get(s, 0))
                 for s, (_lo, hi) in ranges.items() if hi >= 0)
    return KvCacheView(mirror.size, None, "ranges", seqs, kv_bytes_per_token, n_seq_max,
                       (note or "no cell map") + "; attention cells counted from position 0")


def _from_mirror(mirror: CellMirror, n_seq_max: int, kv_bytes_per_token: int,
                 exact_tokens: dict[int, int]) -> KvCacheView:
    owners = mirror.owners.copy()
    pos = mirror.pos.copy()
    used = owners != 0
    shared = used & ((owners & (owners - np.uint64(1))) != 0)
    seqs = []
    for s in range(n_seq_max):
        mine = (owners & np.uint64(1 << s)) != 0
        n = int(np.count_nonzero(mine))
        if n:
            p = pos[mine]
            seqs.append(SeqUsage(s, n, int(p.min()), int(p.max()),
                                 int(np.count_nonzero(mine & shared)), exact_tokens.get(s, 0)))
    return KvCacheView(mirror.size, int(np.count_nonzero(used)), "debug-log", tuple(seqs),
                       kv_bytes_per_token, n_seq_max, "", pos, owners)
