"""Prompt templates with ``<placeholders>``.

Syntax: ``<name>`` with a name matching ``[A-Za-z_][A-Za-z0-9_-]*`` is a placeholder; every
other angle bracket (``<|im_start|>``, ``</s>``, ``a < b``, ``<3``) is literal text. ``\\<``
writes a literal ``<`` (so ``\\<name>`` is the text ``<name>``). A placeholder may repeat; each
occurrence takes the same value. The static prefix is the text before the first placeholder.

A ``<name`` that runs into the end of a line is reported as a syntax error, because it is far
more often a forgotten ``>`` than literal text.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MissingValuesError, TemplateError, TemplateSyntaxError
from ..user_files import read_user_text

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# A whole placeholder, unless a backslash escapes its '<': finds exactly the placeholders the
# parser reads. The pattern is also valid for Qt's QRegularExpression, so the editor highlights
# with it instead of keeping its own copy of the rule.
PLACEHOLDER_RE = re.compile(rf"(?<!\\)<({NAME_RE.pattern})>")
_PLACEHOLDER_AT = re.compile(rf"<({NAME_RE.pattern})(>?)")


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Placeholder:
    name: str
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)


Part = Literal | Placeholder


@dataclass(frozen=True)
class Span:
    """A piece of a filled prompt: template text (special tokens parsed) or a value (plain)."""

    text: str
    from_template: bool


@dataclass(frozen=True)
class FilledPrompt:
    spans: tuple[Span, ...]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.spans)


@dataclass(frozen=True)
class Template:
    source: str
    parts: tuple[Part, ...] = field(repr=False)

    @classmethod
    def parse(cls, source: str) -> "Template":
        return cls(source, tuple(_parse(source)))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Template":
        """Read and parse a template file; errors name the file."""
        p = Path(path)
        source = read_user_text(p, TemplateError, "template file")
        try:
            return cls.parse(source)
        except TemplateSyntaxError as e:
            raise TemplateSyntaxError(e.message, e.line, e.column, p.name) from None

    @property
    def placeholders(self) -> list[str]:
        """Placeholder names in order of first appearance, each once."""
        seen: dict[str, None] = {}
        for p in self.parts:
            if isinstance(p, Placeholder):
                seen.setdefault(p.name, None)
        return list(seen)

    @property
    def static_prefix(self) -> str:
        out = []
        for p in self.parts:
            if isinstance(p, Placeholder):
                break
            out.append(p.text)
        return "".join(out)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def fill(self, values: dict[str, str]) -> FilledPrompt:
        names = set(self.placeholders)
        missing = [n for n in self.placeholders if n not in values]
        unknown = sorted(k for k in values if k not in names)
        if missing or unknown:
            raise MissingValuesError(missing, unknown)
        spans: list[Span] = []
        for p in self.parts:
            if isinstance(p, Literal):
                spans.append(Span(p.text, True))
            else:
                spans.append(Span(str(values[p.name]), False))
        return FilledPrompt(tuple(s for s in spans if s.text))

    def blank(self, values: dict[str, str]) -> list[str]:
        """Placeholders whose value is missing or only white space: a row not filled in yet
        (``fill`` accepts an empty value, which a program may mean)."""
        return [n for n in self.placeholders if not str(values.get(n, "")).strip()]

    def prefix_prompt(self) -> FilledPrompt:
        """The static prefix alone, as a prompt to prime."""
        text = self.static_prefix
        return FilledPrompt((Span(text, True),) if text else ())

    def render(self) -> str:
        """Source text that parses back to the same parts."""
        return render_parts(self.parts)


def _line_col(source: str, index: int) -> tuple[int, int]:
    line = source.count("\n", 0, index) + 1
    col = index - (source.rfind("\n", 0, index) + 1) + 1
    return line, col


def _parse(source: str) -> list[Part]:
    parts: list[Part] = []
    buf: list[str] = []
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch == "\\" and i + 1 < n and source[i + 1] == "<":
            buf.append("<")
            i += 2
            continue
        if ch == "<":
            m = _PLACEHOLDER_AT.match(source, i)
            if m:
                if m.group(2):
                    if buf:
                        parts.append(Literal("".join(buf)))
                        buf = []
                    line, col = _line_col(source, i)
                    parts.append(Placeholder(m.group(1), line, col))
                    i = m.end()
                    continue
                end = m.end()
                if end == n or source[end] in "\r\n":
                    line, col = _line_col(source, i)
                    raise TemplateSyntaxError(
                        f"placeholder <{m.group(1)} is not closed; add '>' or write \\< for a literal '<'",
                        line, col,
                    )
        buf.append(ch)
        i += 1
    if buf:
        parts.append(Literal("".join(buf)))
    return parts


def render_parts(parts: tuple[Part, ...] | list[Part]) -> str:
    merged: list[Part] = []
    for p in parts:  # adjacent literals read back as one; escape them as one
        if isinstance(p, Literal) and merged and isinstance(merged[-1], Literal):
            merged[-1] = Literal(merged[-1].text + p.text)
        else:
            merged.append(p)
    parts = merged
    out: list[str] = []
    for k, p in enumerate(parts):
        if isinstance(p, Placeholder):
            out.append(f"<{p.name}>")
            continue
        text, is_last = p.text, k == len(parts) - 1
        for j, ch in enumerate(text):
            if ch == "<" and _needs_escape(text, j, is_last):
                out.append("\\<")
            else:
                out.append(ch)
    return "".join(out)


def _needs_escape(text: str, j: int, is_last: bool) -> bool:
    """Would this literal '<' read back as something else?"""
    if j > 0 and text[j - 1] == "\\":
        return True  # '\<' would read as an escaped '<' and drop the backslash
    m = _PLACEHOLDER_AT.match(text, j)
    if not m:
        return False
    if m.group(2):
        return True  # '<name>' would become a placeholder
    end = m.end()
    return (end == len(text) and is_last) or (end < len(text) and text[end] in "\r\n")
