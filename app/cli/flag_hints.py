"""The CLI's own layer over engine messages: engine messages name concepts ("raise the context
size", "clear the cache"); here each concept gets the `kvprimer` option or command that acts on
it, so a user at a terminal reads which flag to change."""
from __future__ import annotations

# a phrase an engine message may use -> what does it on the command line
HINTS: tuple[tuple[str, str], ...] = (
    ("context size", "-c/--ctx-size"),
    ("clear the cache", "kvprimer cache --clear; each kvprimer command also starts with an "
                        "empty cache"),
    ("give each placeholder a value", "--set NAME=VALUE or --set-file NAME=PATH"),
    ("model file", "-m/--model PATH"),
    ("reuse mode", "--reuse"),
    ("KV cache types", "-ctk/-ctv"),
    ("GPU layers", "-ngl"),
    ("batch threads", "-tb/--threads-batch"),
    ("generation threads", "-t/--threads"),
    ("micro-batch size", "-ub/--ubatch-size"),
    ("repeat count", "--repeat"),
    ("new tokens", "-n/--n-predict"),
    ("recompute k", "--recompute"),
    ("recompute share", "--recompute"),
    ("recompute takes", "--recompute"),
    ("rows per batch", "--fork K"),
    ("forks of the static prefix", "--fork K"),
)


def with_flags(message: str) -> str:
    """``message`` with the options that act on what it names, in brackets at its end."""
    flags = [flag for phrase, flag in HINTS if phrase in message and flag not in message]
    return f"{message} ({'; '.join(flags)})" if flags else message
