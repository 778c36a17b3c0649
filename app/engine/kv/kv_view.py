"""A snapshot of the KV cache: every cell's position and owners, and a summary per sequence.

Two sources, and the view says which one it used:
- "debug-log": the cell mirror (kv_cells), checked against llama.cpp's logged cell maps and,
  when the view is built, against llama.cpp's own position range of every sequence.
- "ranges": only ``llama_memory_seq_pos_min/max`` per sequence. Used when the debug log is off,
  logs no readable map, or disagrees with the mirror. Then there is no cell map (``cell_pos`` is
  None) and cells are counted from the position range; shared and used cells are unknown.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
        return {"n_cells": self.n_cells, "used_cells": self.used_cells, "source": self.source,
                "sequences": [s.as_dict() for s in self.sequences]}


def build_view(mirror: CellMirror, pos_range, n_seq_max: int, kv_bytes_per_token: int,
               exact_tokens: dict[int, int] | None = None) -> KvCacheView:
    """The view now. ``pos_range(seq)`` asks llama.cpp; the mirror is used only if it agrees."""
    exact_tokens = exact_tokens or {}
    ranges = {s: tuple(pos_range(s)) for s in range(n_seq_max)}
    note = mirror.problem if not mirror.trusted else ""
    if mirror.trusted:
        for s, r in ranges.items():
            if mirror.seq_range(s) != r:
                note = (f"the cell record disagrees with llama.cpp's positions of sequence {s}; "
                        "showing position ranges only")
                break
    if mirror.trusted and not note:
        return _from_mirror(mirror, n_seq_max, kv_bytes_per_token, exact_tokens)
    seqs = tuple(SeqUsage(s, hi - lo + 1, lo, hi, None, exact_tokens.get(s, 0))
                 for s, (lo, hi) in ranges.items() if lo >= 0)
    return KvCacheView(mirror.size, None, "ranges", seqs, kv_bytes_per_token, n_seq_max,
                       note or "no cell map")


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
