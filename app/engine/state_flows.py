"""Prefix states in the session, written once: loading a state file, and the rule that a state
belongs to the model it was made with.

Loading is one behaviour for the window (Load state) and the CLI (``--state``): read either
format, check it against the loaded model and context (a llama.cpp file, which names no model,
against the template's static prefix too), then adopt it into the radix cache, so that runs of
a template whose prefix it holds fork it from there.

"A state belongs to its model" is checked here and applied by the session (``Session.set_state``
refuses a state of another model, ``Session.set_model`` drops one when another model loads):
a state of one model restored into another would be garbage, and saving it again would pass it
on.
"""
from __future__ import annotations

import os

from .errors import StateFileError
from .states.llama_state_file import load_any_state
from .states.prefix_state import PrefixState
from .llama.native import SEQ_STATE_VERSION
from .prompts.template import Template


def load_state(engine, path: str | os.PathLike, template: Template | None = None) -> PrefixState:
    """Read, check and adopt a state file (engine thread); ``state.warning`` says how little a
    llama.cpp file could be checked."""
    state = load_any_state(engine, path, template)
    engine.adopt(state)
    return state


def check_belongs(state: PrefixState, info, checked_on: str = "") -> None:
    """Raise StateFileError unless ``state`` belongs to the model ``info`` (a ModelInfo) and
    fits its context. A llama.cpp state carries no model fingerprint: ``checked_on``, the
    fingerprint of the model it was checked against when it was loaded, stands in for it."""
    if state.origin == "llama.cpp" and checked_on and checked_on != info.sha256:
        raise StateFileError("this llama.cpp state was loaded for another model; load its file "
                             "again with this model, or prime the prefix again")
    state.check_compatible(info.sha256, info.type_k, info.type_v, SEQ_STATE_VERSION, info.n_ctx)


def state_problem(state: PrefixState | None, info, checked_on: str = "") -> str:
    """Why ``state`` does not belong to ``info``'s model ("" when it does, or there is none)."""
    if state is None:
        return ""
    try:
        check_belongs(state, info, checked_on)
    except StateFileError as e:
        return str(e)
    return ""
