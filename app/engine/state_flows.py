"""Prefix states in the session, written once: loading a state file, and the rule that a state
belongs to the model it was made with.

Saving for llama.cpp is one behaviour too (``for_llama_file``): V laid out for the kernel of
the context that will read the file.

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

from .errors import KvPrimerError, StateFileError
from .states.llama_state_file import load_any_state
from .states.mapped_state import mapped_state_file, prefetch
from .states.prefix_state import PrefixState
from .states.seq_payload import in_position_order
from .states.v_layout import for_flash_attn, resolve_for_fa
from .llama.native import SEQ_STATE_VERSION
from .prompts.template import Template


def prefetch_state(path: str | os.PathLike) -> None:
    """Start reading a state file into the page cache in the background, before the engine
    that will load it is ready (mapped_state.prefetch)."""
    prefetch(path)


def load_state(engine, path: str | os.PathLike, template: Template | None = None) -> PrefixState:
    """Read, check and adopt a state file (engine thread); ``state.warning`` says how little a
    llama.cpp file could be checked. A .kvstate in the page cache goes straight into the work
    context's cells on the way (``placed_state``), so the run that follows copies nothing; its
    prime's timing, taken on this machine, is the next cold run's estimate."""
    state = placed_state(engine, path) or load_any_state(engine, path, template)
    engine.adopt(state)
    engine.cold.take_timing(state.prime_timing)  # the next cold run's estimate, if it applies
    return state


def placed_state(engine, path: str | os.PathLike) -> PrefixState | None:
    """A .kvstate wholly in the page cache, checked as ``Engine.load_state`` checks it, its
    cells copied by llama.cpp from the cached pages straight into the work context while the
    file is copied into the state's own bytes and checksummed (states/mapped_state.py). None
    where that does not apply: the file is then read as usual. It applies to models with
    attention layers only that run in the work context, and to a state whose cells are in
    position order and whose V layout is this context's (else the bytes change on the way)."""
    if engine.family != "attention" or not engine.runs_in_work_context:
        return None
    with mapped_state_file(path) as mapped:
        if mapped is None:
            return None
        try:  # V primed with the other kernel: rewritten by the read path, not twice
            view = engine.checked_state(mapped.view_state(), rewrite=False)
        except StateFileError:
            # checked before its checksum: the read path checks the sum first, so a corrupt
            # file is called corrupt, not "of another model", whether cached or not
            return None
        if view is None or in_position_order(view.data) is not view.data:
            return None
        data = view.data
        slot = engine.work_slot

        def place() -> bool:
            try:
                slot.restore(data, list(view.tokens), view.n_tokens)
            except KvPrimerError:  # llama.cpp would not take the cells: read as before
                return False
            return True
        return mapped.copy_checked(view, place, slot.reset)


def for_llama_file(engine, state: PrefixState, for_fa: str = "auto") -> tuple[PrefixState, bool]:
    """``state`` laid out for the context that will read it as llama.cpp's file (engine
    thread): V as a context with flash attention ``for_fa`` stores it ("auto": what llama.cpp's
    default context picks on this machine, as llama-server's ``-fa auto``; "on"; "off", as
    llama-cpp-python's ``Llama()``). Returns the state and whether that is flash attention on.
    `prime --format llama --for-fa` and the window's Save state for llama.cpp both call this."""
    fa = resolve_for_fa(for_fa, engine.model)
    return for_flash_attn(state, fa), fa


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
