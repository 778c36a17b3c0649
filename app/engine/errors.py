"""Engine exceptions. Every message is written for the user: what is wrong and what to do.

Messages name concepts (the context size, the cache, a placeholder's value), never the controls
of one front end: the window shows them as they are, and the CLI prints them on one line with
its own option names added (app/cli/flag_hints.py).
"""
from __future__ import annotations


class KvPrimerError(Exception):
    """Base class of every error the engine raises on purpose."""


class TemplateError(KvPrimerError):
    """A template has a syntax error, or its values are missing or unknown."""


class TemplateSyntaxError(TemplateError):
    def __init__(self, message: str, line: int, column: int, source_name: str = "template"):
        self.message = message
        self.line = line
        self.column = column
        super().__init__(f"{source_name} line {line}, column {column}: {message}")


class ChatTemplateError(TemplateError):
    """A chat template file (messages) is malformed, or the model's chat template cannot render
    it."""


class MissingValuesError(TemplateError):
    def __init__(self, missing: list[str], unknown: list[str], row: int | None = None):
        self.missing = missing
        self.unknown = unknown
        self.row = row  # the row whose values these are, numbered as the user sees it
        parts = []
        if missing:
            parts.append("missing values for " + ", ".join(f"<{n}>" for n in missing))
        if unknown:
            parts.append("unknown names " + ", ".join(unknown) + " (not placeholders of this template)")
        where = f"row {row}: " if row is not None else ""
        super().__init__(where + "; ".join(parts) + "; give each placeholder a value")


class ModelError(KvPrimerError):
    """A model file is missing, not GGUF, truncated, or llama.cpp refused it."""


class ContextError(KvPrimerError):
    """llama.cpp could not create a context, or a decode failed."""


class ContextOverflowError(ContextError):
    def __init__(self, n_tokens: int, n_ctx: int):
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the prompt has {n_tokens} tokens but the context holds {n_ctx}; "
            f"raise the context size to at least {n_tokens + 1} or shorten the prompt"
        )


def context_size_for(cells: int) -> int:
    """The smallest context size that holds ``cells`` KV cells and one more token: llama.cpp
    rounds a context up to a multiple of 256 cells."""
    return -(-(cells + 1) // 256) * 256


class MemoryBudgetError(ContextError):
    """What the engine would allocate exceeds the memory available (memory_budget.py)."""


class StateFileError(KvPrimerError):
    """A .kvstate file is corrupt, truncated, or was made for another model or KV type."""


class StateFitError(StateFileError):
    """A saved state needs more KV cells than the context has, or can free for it."""

    def __init__(self, needed: int, n_ctx: int, free: int | None = None, held_by: str = ""):
        self.needed = needed
        self.n_ctx = n_ctx
        self.free = free
        fit = context_size_for(needed)
        if free is None or needed >= n_ctx:
            super().__init__(f"the saved state needs {needed:,} KV cells but the context has "
                             f"{n_ctx:,} cells; raise the context size to {fit:,} or more")
        else:  # it would fit an empty context: cells the cache cannot evict are in the way
            super().__init__(
                f"the saved state needs {needed:,} KV cells but only {free:,} of the context's "
                f"{n_ctx:,} can be freed ({held_by}); {_free_what(held_by)}or raise the context "
                f"size to {context_size_for(needed + n_ctx - free):,}")


def _free_what(held_by: str) -> str:
    parts = (["clear sequence 0"] if "sequence 0" in held_by else []) + (
        ["unpin cached prompts"] if "pinned" in held_by else [])
    return ", ".join(parts) + ", " if parts else ""


class StoreError(KvPrimerError):
    """The in-memory prefix store cannot hold an entry."""


class CacheError(KvPrimerError):
    """The radix cache cannot hold, find or restore a cached prompt."""


class RowsError(KvPrimerError):
    """A CSV or JSONL file of rows is unreadable or does not fit the template."""


class Cancelled(KvPrimerError):
    """A job was cancelled between batches; the sequence is left at a known length."""

    def __init__(self, message: str = "cancelled", kept_tokens: int = 0):
        self.kept_tokens = kept_tokens
        super().__init__(message)
