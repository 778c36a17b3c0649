"""llama.cpp's own report of its KV cells, read from its debug log.

With ``LLAMA_KV_CACHE_DEBUG=3`` in the environment when a context is created, every find_slot
(llama-kv-cache.cpp; one per ubatch placed, one per state restore) logs at debug level, before
it searches:

    find_slot: stream[0], n =    40, used =    40, head =    40, size =   512, n_swa =     0
    "\\n" + one token per cell ('.' empty, the owner's id, or 'M' when shared), " *\\n" after
          every 256 cells, + "\\n"
    "\\n" + each cell's position or '.', left-aligned in 5 characters, 64 a line + "\\n"
    find_slot: stream[0] min[0] =     0, max[0] =    39      (one line per non-empty sequence)

``n`` is one past the last used cell, so a free cell lies between used ones when n > used.

The position map is unambiguous and says which cells are used. The owner map is too while every
id has one digit; ids of two digits run together ("6262" is 62, 62 or 6, 2, 6, 2). They are
split here using what else the record says: the 256-cell groups, which cells are empty, which
sequences exist (the min/max lines) and each one's position range. A cell whose owner still
has two readings is marked UNREPORTED: never guessed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

EMPTY, SHARED, UNREPORTED = -1, -2, -3  # owner codes besides a sequence id
GROUP = 256  # cells per line of llama.cpp's owner map

HEADER = re.compile(r"find_slot: stream\[(\d+)\], n =\s*(\d+), used =\s*(\d+), head =\s*(\d+), "
                    r"size =\s*(\d+)")
_RANGE = re.compile(r"find_slot: stream\[\d+\] min\[(\d+)\] =\s*(-?\d+), max\[\d+\] =\s*(-?\d+)")


@dataclass(frozen=True)
class CellReport:
    """The cache as one find_slot record shows it."""
    n: int  # one past the last used cell
    used: int
    head: int
    size: int
    pos: np.ndarray  # int64 per cell, -1 empty
    owner: np.ndarray  # int16 per cell: the sequence id, EMPTY, SHARED or UNREPORTED
    ranges: dict[int, tuple[int, int]]  # (min, max) position of every non-empty sequence

    @property
    def has_holes(self) -> bool:
        """Is a free cell followed by a used one (llama.cpp would fill it next)?"""
        return self.n > self.used

    @property
    def unreported(self) -> int:
        return int(np.count_nonzero(self.owner == UNREPORTED))


def last_report(lines: list[str]) -> CellReport | None:
    """The last complete record among logged lines, read; None if there is none or it does
    not read as the format above (a debug level below 3, another llama.cpp)."""
    for i in range(len(lines) - 1, -1, -1):
        m = HEADER.match(lines[i])
        if not m:
            continue
        maps = lines[i + 1:i + 3]
        if len(maps) < 2 or not all(t.startswith("\n") for t in maps):
            return None
        ranges = {}
        for t in lines[i + 3:]:
            r = _RANGE.match(t)
            if not r:
                break
            ranges[int(r.group(1))] = (int(r.group(2)), int(r.group(3)))
        size = int(m.group(5))
        pos = parse_pos_map(maps[1], size)
        owner = parse_cell_map(maps[0], pos, ranges) if pos is not None else None
        if owner is None:
            return None
        return CellReport(int(m.group(2)), int(m.group(3)), int(m.group(4)), size, pos, owner,
                          ranges)
    return None


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


def parse_cell_map(text: str, pos: np.ndarray, ranges: dict[int, tuple[int, int]]
                   ) -> np.ndarray | None:
    """The owner code of every cell (see module doc); None if the map does not fit ``pos``."""
    size = len(pos)
    body = text[1:] if text.startswith("\n") else text
    body = body[:-1] if body.endswith("\n") else body
    out = np.full(size, EMPTY, dtype=np.int16)
    flat = body.replace(" *\n", "")
    if len(flat) == size:  # one character per cell (the usual case): read the map at once
        return out if _read_narrow(flat, pos, ranges, out) else None
    groups = body.split(" *\n")
    if size % GROUP == 0:
        if groups[-1] != "":
            return None
        groups.pop()
    if len(groups) != -(-size // GROUP):
        return None
    for g, line in enumerate(groups):
        a = g * GROUP
        if not _read_group(line, pos[a:a + GROUP], ranges, out[a:a + GROUP]):
            return None
    return out


def _read_group(line: str, pos: np.ndarray, ranges, out: np.ndarray) -> bool:
    if len(line) == len(pos):  # one character per cell (the usual case): read it at once
        return _read_narrow(line, pos, ranges, out)
    empty = np.flatnonzero(pos < 0)
    pieces = line.split(".")
    if len(pieces) != len(empty) + 1:
        return False
    bounds = [-1, *empty.tolist(), len(pos)]
    for k, piece in enumerate(pieces):  # the used cells between two empty ones
        a, b = bounds[k] + 1, bounds[k + 1]
        codes = _split(piece, pos[a:b], ranges)
        if codes is None:
            return False
        out[a:b] = codes
    return True


def _read_narrow(line: str, pos: np.ndarray, ranges, out: np.ndarray) -> bool:
    raw = np.frombuffer(line.encode("ascii", "replace"), dtype=np.uint8)
    dot, shared = raw == ord("."), raw == ord("M")
    digit = (raw >= 48) & (raw <= 57)
    if not np.array_equal(dot, pos < 0) or not (dot | shared | digit).all():
        return False
    ids = raw.astype(np.int16) - 48
    lo, hi = np.full(10, 1, dtype=np.int64), np.full(10, 0, dtype=np.int64)  # no such sequence
    for s, (a, b) in ranges.items():
        if s < 10:
            lo[s], hi[s] = a, b
    d = ids[digit]
    if ((pos[digit] < lo[d]) | (pos[digit] > hi[d])).any():
        return False
    out[:] = np.where(dot, EMPTY, np.where(shared, SHARED, ids))
    return True


def _split(s: str, pos: np.ndarray, ranges) -> list[int] | None:
    """Owner codes of len(pos) used cells whose tokens run together in ``s``."""
    k, n = len(pos), len(s)
    if n == k:  # one character per cell: nothing to split
        codes = [SHARED if c == "M" else _id(c, p, ranges) for c, p in zip(s, pos.tolist())]
        return None if any(c is None for c in codes) else codes
    if not k or not n:
        return None
    p = pos.tolist()
    # forward: the cell indices a reading of s[:i] can reach; tokens are "M", "d" or "dd"
    fwd: list[set[int]] = [set() for _ in range(n + 1)]
    fwd[0].add(0)
    steps: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (j, width, code)
    for i in range(n):
        for j in fwd[i]:
            if j >= k:
                continue
            for w in (1, 2):
                code = SHARED if s[i] == "M" and w == 1 else _id(s[i:i + w], p[j], ranges)
                if code is not None and i + w <= n:
                    steps[i].append((j, w, code))
                    fwd[i + w].add(j + 1)
    if k not in fwd[n]:
        return None
    # backward: keep the steps on a complete reading; a cell with two codes is unreported
    back: list[set[int]] = [set() for _ in range(n + 1)]
    back[n].add(k)
    seen: list[set[int]] = [set() for _ in range(k)]
    for i in range(n - 1, -1, -1):
        for j, w, code in steps[i]:
            if j + 1 in back[i + w]:
                back[i].add(j)
                seen[j].add(code)
    return [next(iter(c)) if len(c) == 1 else UNREPORTED for c in seen]


def _id(tok: str, pos: int, ranges) -> int | None:
    """The sequence id a token names, if that sequence exists and holds this position."""
    if not tok.isdigit() or (len(tok) > 1 and tok[0] == "0"):
        return None
    s = int(tok)
    r = ranges.get(s)
    return s if r is not None and r[0] <= pos <= r[1] else None
