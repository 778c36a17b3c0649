"""Our rendering of a chat template's rows against the server's, before any row runs.

A prefix primed here is reused by the server only if the server renders the same messages
into the same text: one differing character (a date, a default system message, a space)
moves every token after it. llama-server's ``/apply-template`` renders without running, so
each row's messages are rendered there and compared with ours; the first difference is named
by character and by token, in one line.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

CONTEXT = 12  # characters shown on each side of a difference


@dataclass(frozen=True)
class RenderCheck:
    same: bool | None  # None: the server cannot render without running (not llama-server)
    rows: int  # renderings compared
    row: int | None = None  # the first row whose renderings differ (its number in the file)
    char: int | None = None  # where they first differ, in characters
    ours: str = ""  # the text from there, a few characters
    theirs: str = ""
    token: int | None = None  # where their tokens first differ
    our_token: str = ""
    their_token: str = ""

    def describe(self) -> str:
        if self.same is None:
            return ("the server cannot render messages without running them (no "
                    "/apply-template); our rendering was not compared with its own")
        if self.same:
            return (f"the server renders the messages as we do, byte for byte "
                    f"({self.rows} row{'s' if self.rows != 1 else ''} compared)")
        which = "the messages" if self.row is None else f"row {self.row}"
        return (f"the server renders {which} otherwise than we do: from character "
                f"{self.char:,} ours reads {self.ours!r} and the server's {self.theirs!r}; "
                f"token {self.token:,} is {self.our_token!r} here and {self.their_token!r} there, "
                "so the server cannot reuse the primed prefix past it")

    def as_dict(self) -> dict:
        return {**asdict(self), "describe": self.describe()}


def first_difference(a, b) -> int | None:
    """The first index where two sequences differ (the shorter one's length when one starts
    the other); None when they are equal."""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return None if i == n and len(a) == len(b) else i


def compare(row: int | None, ours: str, theirs: str, tokenize: Callable[[str], list[int]],
            piece: Callable[[int], str]) -> RenderCheck | None:
    """The difference between two renderings of one row, or None when they are equal."""
    at = first_difference(ours, theirs)
    if at is None:
        return None
    a, b = tokenize(ours), tokenize(theirs)
    t = first_difference(a, b)
    t = min(len(a), len(b)) if t is None else t  # equal tokens, other text: cannot happen
    return RenderCheck(False, 1, row, at, ours[at:at + CONTEXT], theirs[at:at + CONTEXT], t,
                       piece(a[t]) if t < len(a) else "", piece(b[t]) if t < len(b) else "")


def check_rendering(render_ours: Callable[[dict], str],
                    render_theirs: Callable[[dict], str | None], rows,
                    tokenize: Callable[[str], list[int]],
                    piece: Callable[[int], str]) -> RenderCheck:
    """Each row's rendering here (``render_ours(values)``) against the server's; stops at the
    first row that differs. ``render_theirs`` returns None when the server cannot render."""
    for n, row in enumerate(rows, 1):
        theirs = render_theirs(row.values)
        if theirs is None:
            return RenderCheck(None, 0)
        diff = compare(row.number, render_ours(row.values), theirs, tokenize, piece)
        if diff is not None:
            return RenderCheck(False, n, diff.row, diff.char, diff.ours, diff.theirs,
                               diff.token, diff.our_token, diff.their_token)
    return RenderCheck(True, len(rows))


__all__ = ["RenderCheck", "check_rendering", "compare", "first_difference"]
