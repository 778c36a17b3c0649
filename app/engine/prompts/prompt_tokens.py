"""Tokenizing a filled prompt so that template text and values are treated as they should be.

The template's own text may contain control tokens (``<|im_start|>``) which must become those
tokens; a value must stay plain text even when it contains the same characters. We do what
llama.cpp's ``parse_special`` does (split the text at control-token texts, then tokenize each
piece of plain text as a whole), except that only control-token texts standing in template
text split. Plain text that spans template text and values is tokenized in one piece, so the
tokens at a value's edges merge exactly as in the whole prompt: a warm run therefore evaluates
exactly the tokens a cold run would.
"""
from __future__ import annotations

from ..llama.native import NativeModel
from .template import FilledPrompt


def common_prefix(a, b) -> int:
    """How many leading tokens two token sequences share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptTokenizer:
    def __init__(self, model: NativeModel):
        self.model = model
        self._specials = model.control_tokens()
        bos = model.bos()
        self._bos = [bos] if bos is not None else []

    def fragments(self, prompt: FilledPrompt) -> list[str | int]:
        """Plain-text pieces (str) and control tokens (int), in order."""
        out: list[str | int] = []
        plain: list[str] = []
        for span in prompt.spans:
            if not span.from_template:
                plain.append(span.text)
                continue
            for piece in self._split_specials(span.text):
                if isinstance(piece, int):
                    if plain:
                        out.append("".join(plain))
                        plain = []
                    out.append(piece)
                else:
                    plain.append(piece)
        if plain:
            out.append("".join(plain))
        return [p for p in out if p != ""]

    def tokenize(self, prompt: FilledPrompt) -> list[int]:
        tokens = list(self._bos)
        for frag in self.fragments(prompt):
            if isinstance(frag, int):
                tokens.append(frag)
            else:
                tokens.extend(self.model.tokenize(frag, add_special=False, parse_special=False))
        return tokens

    def _split_specials(self, text: str) -> list[str | int]:
        pieces: list[str | int] = [text]
        # Longest texts first, as llama.cpp does, so '<|im_start|>' wins over any shorter match.
        for special, tok in self._specials:
            if not any(isinstance(p, str) and special in p for p in pieces):
                continue
            nxt: list[str | int] = []
            for p in pieces:
                if isinstance(p, int) or special not in p:
                    nxt.append(p)
                    continue
                parts = p.split(special)
                for k, part in enumerate(parts):
                    if k:
                        nxt.append(tok)
                    if part:
                        nxt.append(part)
            pieces = nxt
        return pieces
