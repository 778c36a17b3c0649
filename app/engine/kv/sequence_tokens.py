"""The token ids each sequence of the cache's context holds, and which sequences also hold
shifted cells: the engine's account of llama.cpp's cells, kept in one place.

Every operation on the cells (a decode, a fork, a trim, a shift, a restore, the cache laying
its cells out again) changes this account through one of the methods below, so the account
and the cells can only part ways where one of them is called wrongly. Reads return copies:
nobody outside changes the account behind its back.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


class SequenceTokens(Mapping):
    """``tokens[seq]``: the ids at positions 0.. of ``seq``, each what evaluating it there
    gives. A sequence is *moved* when it also holds shifted or divided cells beyond them
    (llama.cpp's seq_add/seq_div): those cells are not what evaluating their tokens gives."""

    def __init__(self, n_seq: int):
        self._tokens: dict[int, list[int]] = {s: [] for s in range(n_seq)}
        self._moved: set[int] = set()

    # ---- reads
    def __getitem__(self, seq: int) -> list[int]:
        return list(self._tokens[seq])

    def __iter__(self) -> Iterator[int]:
        return iter(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def count(self, seq: int) -> int:
        """How many tokens ``seq`` holds (without copying them: decode loops ask this)."""
        return len(self._tokens[seq])

    def counts(self) -> dict[int, int]:
        return {s: len(t) for s, t in self._tokens.items()}

    def is_moved(self, seq: int) -> bool:
        return seq in self._moved

    @property
    def moved(self) -> frozenset[int]:
        return frozenset(self._moved)

    # ---- changes, one per kind of operation on the cells
    def set(self, seq: int, tokens: Iterable[int], moved: bool = False) -> None:
        """``seq`` now holds exactly ``tokens`` (a restored state, cells put back)."""
        self._tokens[seq] = list(tokens)
        self._mark(seq, moved)

    def extend(self, seq: int, tokens: Iterable[int]) -> None:
        """Tokens evaluated or placed right after what ``seq`` holds."""
        self._tokens[seq].extend(tokens)

    def clear(self, seq: int) -> None:
        self.set(seq, [])

    def clear_all(self) -> None:
        for s in self._tokens:
            self._tokens[s] = []
        self._moved.clear()

    def keep_only(self, seq: int) -> None:
        for s in self._tokens:
            if s != seq:
                self.clear(s)

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first ``n`` tokens; the moved mark stays (cells beyond may remain)."""
        del self._tokens[seq][n:]

    def trim(self, seq: int, n: int) -> None:
        """Keep the first ``n`` tokens; every cell from ``n`` on is gone, moved ones too."""
        self.truncate(seq, n)
        self._moved.discard(seq)

    def copy(self, src: int, dst: int, upto: int | None = None) -> None:
        """``dst`` now holds what ``src`` holds (its first ``upto`` tokens), shared cells.
        A whole copy of a moved sequence holds its moved cells too."""
        whole = upto is None or upto >= len(self._tokens[src])
        self.set(dst, self._tokens[src][:upto], moved=whole and src in self._moved)

    def moved_from(self, seq: int, exact: int, holds_more: bool) -> None:
        """Positions of ``seq`` were shifted or divided: only its first ``exact`` tokens are
        still exact; ``holds_more`` says whether moved cells remain beyond them."""
        self.truncate(seq, exact)
        self._mark(seq, holds_more)

    def _mark(self, seq: int, moved: bool) -> None:
        if moved:
            self._moved.add(seq)
        else:
            self._moved.discard(seq)
