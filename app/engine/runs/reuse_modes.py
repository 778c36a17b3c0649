"""Which reuse modes a run or a benchmark may take: the one check of the names asked for, and
the refusals that follow from the model (compose shifts cached modules' cells into place, which
a recurrent state cannot be)."""
from __future__ import annotations

from pathlib import Path

from ..errors import KvPrimerError
from ..llama.layer_kinds import read_layer_kinds
from .recompute_choice import Recompute, parse_recompute

REUSE_MODES = ("prefix", "chain", "compose")
EXACT_REUSE_MODES = ("prefix", "chain")  # compose is approximate by design

def check_reuse_modes(modes, *, one: bool = False, model=None) -> tuple[str, ...]:
    """The one check of reuse modes asked for: a name, a comma list ("prefix,chain") or names.
    Returns them known, in order, each once; ``one``: exactly one is allowed. ``model``: the
    model file the modes will run on, read (its header only, before it loads) to refuse compose
    on a hybrid or recurrent model."""
    if isinstance(modes, str):
        modes = modes.split(",")
    asked = tuple(dict.fromkeys(str(m).strip() for m in modes if str(m).strip()))
    bad = [m for m in asked if m not in REUSE_MODES]
    if bad or not asked:
        how = "one of" if one else "one or more of"
        raise KvPrimerError(f"unknown reuse mode {', '.join(repr(m) for m in bad) or '(none)'}; "
                            f"use {how} {', '.join(REUSE_MODES)}"
                            + ("" if one else ", comma-separated"))
    if one and len(asked) > 1:
        raise KvPrimerError(f"a run uses one reuse mode, not {len(asked)} "
                            f"({', '.join(asked)}); a benchmark compares several")
    if "compose" in asked and model is not None:
        refuse_compose_on_file(model)
    return asked


def refuse_compose_on_file(path) -> None:
    """Compose shifts cached modules' cells into place; a recurrent state has none to shift."""
    kinds = read_layer_kinds(path)
    if kinds is not None and kinds.stateful:
        raise KvPrimerError(f"compose mode cannot run on {Path(path).name}: its recurrent layers "
                            f"({kinds.legend()}) keep one state per sequence, which cannot be "
                            "shifted into place or composed from modules; use prefix or chain")


def check_recompute(recompute) -> Recompute:
    """Compose's recompute setting, checked: a count of first tokens (8) or a share (15%)."""
    return parse_recompute(recompute)


def refuse_compose(engine) -> None:
    """Compose shifts modules' cells into place: a recurrent state has no cells to shift."""
    engine.refuse_stateful("compose mode", "hold one state per sequence, which cannot be "
                           "shifted into place or composed from modules")
