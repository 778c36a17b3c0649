"""Where a filled prompt's pieces start, in tokens: the static prefix, then one segment per
placeholder (its value and the template text after it, up to the next placeholder).

The whole prompt is tokenized at once (tokens may merge across a value's edges), so a segment's
token boundary is where the tokens of the prompt cut just before that placeholder stop agreeing
with the whole prompt's: a merge across the boundary moves it back, never forward.
"""
from __future__ import annotations

from dataclasses import dataclass

from .prompt_tokens import common_prefix
from .template import FilledPrompt, Literal, Span, Template


@dataclass(frozen=True)
class Segment:
    start: int  # first token
    end: int  # one past the last token
    label: str  # "static prefix", or "<c1> = the value…"
    slot: str | None  # the placeholder's name (None for the static prefix)


def _label(name: str, value: str, width: int = 32) -> str:
    text = " ".join(value.split())
    return f"<{name}> = {text[:width]}{'…' if len(text) > width else ''}"


def prompt_segments(tokenize, template: Template, values: dict[str, str],
                    tokens: list[int]) -> list[Segment]:
    """The segments of ``tokens`` (the whole filled prompt's tokens), in order, covering it."""
    spans: list[Span] = []
    cuts: list[tuple[list[Span], str, str | None]] = []  # (spans before, label, slot)
    for part in template.parts:
        if isinstance(part, Literal):
            spans.append(Span(part.text, True))
        else:
            cuts.append((list(spans), _label(part.name, values.get(part.name, "")), part.name))
            spans.append(Span(str(values.get(part.name, "")), False))
    bounds = []
    for before, _label_, _slot in cuts:
        head = tokenize(FilledPrompt(tuple(s for s in before if s.text)))
        bounds.append(common_prefix(head, tokens))
    # labels: the static prefix ends where the first placeholder starts
    edges = [*bounds, len(tokens)]
    names = [("static prefix", None)] + [(lab, slot) for _b, lab, slot in cuts]
    out: list[Segment] = []
    start = 0
    for end, (label, slot) in zip(edges, names):
        end = max(end, start)
        out.append(Segment(start, end, label, slot))
        start = end
    return [s for s in out if s.end > s.start or s.slot is None]

