"""A model's chat format: the Jinja chat template in its GGUF and the tokens llama-server
gives that template (bos_token, eos_token), read as llama-server reads them.

From a loaded model, or from a model file without loading its weights (llama.cpp's
vocab-only load, a fraction of a second), so that a chat template can be rendered before a
run loads the model.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as L

from ..errors import ModelError
from ..llama.llama_backend import ensure_backend, last_problem

# llama-server's template for a model that has none: ChatML
CHATML_SOURCE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}")


@dataclass(frozen=True)
class ChatFormat:
    source: str  # the Jinja template rendered (ChatML when the model has none)
    bos_token: str
    eos_token: str
    add_bos: bool  # the tokenizer adds BOS: a rendering that starts with it loses that copy
    add_eos: bool
    fallback: bool = False  # the model has no chat template of its own
    tool_use_source: str = ""  # the model's separate template for requests with tools
    model_name: str = ""

    @property
    def note(self) -> str:
        """One line when the rendering is not the model's own template, else ''."""
        if not self.fallback:
            return ""
        who = self.model_name or "this model"
        return (f"{who} has no chat template of its own; the messages are rendered as ChatML, "
                "as llama-server does")

    def source_for(self, with_tools: bool) -> str:
        return self.tool_use_source if with_tools and self.tool_use_source else self.source


def chat_format_of(model_ptr, vocab_ptr, name: str = "") -> ChatFormat:
    """The chat format of a loaded llama.cpp model (its model and vocab pointers)."""
    default = _template(model_ptr, None)
    tool_use = _template(model_ptr, b"tool_use")
    fallback = not default and not tool_use
    source = default or tool_use or CHATML_SOURCE
    if source == "chatml":
        source, fallback = CHATML_SOURCE, False
    return ChatFormat(source=source,
                      bos_token=_piece(vocab_ptr, L.llama_vocab_bos(vocab_ptr)),
                      eos_token=_piece(vocab_ptr, L.llama_vocab_eos(vocab_ptr)),
                      add_bos=bool(L.llama_vocab_get_add_bos(vocab_ptr)),
                      add_eos=bool(L.llama_vocab_get_add_eos(vocab_ptr)),
                      fallback=fallback, tool_use_source=tool_use or "", model_name=name)


def read_chat_format(path: str | os.PathLike) -> ChatFormat:
    """The chat format of a model file, read without loading its weights."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"no model file at {p}; choose a .gguf model file")
    ensure_backend()
    params = L.llama_model_default_params()
    params.vocab_only = True
    last_problem()
    ptr = L.llama_model_load_from_file(str(p).encode("utf-8"), params)
    if not ptr:
        raise ModelError(f"llama.cpp could not read {p.name}'s vocabulary: the file is "
                         f"truncated, corrupt or not a model{last_problem()}")
    try:
        return chat_format_of(ptr, L.llama_model_get_vocab(ptr), _model_name(ptr) or p.name)
    finally:
        L.llama_model_free(ptr)


def _template(model_ptr, name: bytes | None) -> str:
    raw = L.llama_model_chat_template(model_ptr, name)
    return raw.decode("utf-8", "replace") if raw else ""


def _model_name(model_ptr) -> str:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_model_meta_val_str(model_ptr, b"general.name", buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


def _piece(vocab_ptr, token: int) -> str:
    """The token's text with special tokens written out, as llama-server gives it to the
    template; '' for a vocabulary without that token."""
    if token < 0:
        return ""
    buf = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab_ptr, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = L.llama_token_to_piece(vocab_ptr, token, buf, len(buf), 0, True)
    return buf.raw[:max(n, 0)].decode("utf-8", "replace")
