"""What a model's architecture means for caching its KV state.

Read once from the loaded model and context: the sliding-window size and which layers slide,
recurrent or hybrid layers, the RoPE kind (multi-axis RoPE cannot be shifted), and whether
llama.cpp can shift positions in this context. ``notes()`` says what follows for the user in
one line each.

What the notes claim was measured on this llama.cpp build (tests/engine/llama/test_model_arches.py checks it
on tiny models of each kind):
- a resident prefix forked with seq_cp, or kept and trimmed back with seq_rm, then a suffix:
  bit-identical to a cold run with the same batch boundaries, on every architecture;
- a prefix restored from a state, then a suffix: bit-identical without a window. With one,
  a state holds only the window's cells once the prefix is longer than the window, and they
  come back in other cells; suffix batches of 64 tokens or more (llama.cpp's other CPU path)
  then differ slightly, as runs at different places in the cache do;
- a restored state trimmed back to fewer tokens than it holds lacks window cells the shorter
  prefix needs: wrong, not noise (tiny model: 0.01-0.07 where noise is 1e-4);
- recurrent layers (hybrid models beside attention layers, recurrent models alone) keep one
  state per sequence, not cells per token: a sequence cannot be trimmed, and its cells cannot
  be shifted into place; llama.cpp saves and restores the state exactly, so the radix cache keeps
  it at every point a run may resume from. Its size is measured (recurrent_state.py), the
  attention layers' KV bytes per token computed (checked against a saved state's growth in
  tests/engine/llama/test_stateful_info.py); layer_kinds.py says which layers are which.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import llama_cpp as L

from . import model_files as _mf
from .ggml_types import kv_bytes_per_token
from .layer_kinds import read_layer_kinds
from .recurrent_state import measure_recurrent_bytes

# llama.cpp's own swa_type is not in its C API: the architectures whose windows are chunks
# (a token sees its own chunk only) or symmetric (encoders) are named here; others slide.
_SWA_KIND_BY_ARCH = {"llama4": "chunked", "gemma-embedding": "symmetric", "modern-bert": "symmetric"}

# When a file has no {arch}.attention.sliding_window_pattern, llama.cpp uses a built-in period
# (src/models/*.cpp): (period, dense first). Layer il slides when il % period < period - 1, or
# with dense first when il % period != 0.
_DEFAULT_SWA_PERIOD = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
    "gpt-oss": (2, False), "cohere2": (4, False), "cohere2moe": (4, True), "llama4": (4, False),
    "exaone4": (4, False), "exaone-moe": (4, False), "olmo2": (4, False), "plamo3": (8, False),
    "afmoe": (4, False), "mellum": (4, False), "smallthinker": (4, True), "laguna": (4, True),
    "muse-glimmer": (4, False),
}

_ROPE_TYPES = {L.LLAMA_ROPE_TYPE_NONE: "none", L.LLAMA_ROPE_TYPE_NORM: "norm",
               L.LLAMA_ROPE_TYPE_NEOX: "neox", L.LLAMA_ROPE_TYPE_MROPE: "mrope",
               L.LLAMA_ROPE_TYPE_IMROPE: "imrope", L.LLAMA_ROPE_TYPE_VISION: "vision"}
_MULTI_AXIS = ("mrope", "imrope", "vision")


@dataclass(frozen=True)
class ModelTraits:
    architecture: str
    n_layer: int
    n_swa: int = 0  # tokens in the sliding window; 0: no window
    swa_kind: str = "none"  # "none", "standard", "chunked" or "symmetric"
    swa_layers: int | None = 0  # layers that use the window; None: not known
    swa_pattern: str = ""  # one letter a layer, S windowed, F full; "" without window or unknown
    recurrent: bool = False
    hybrid: bool = False
    rope_type: str = "norm"
    mrope: bool = False  # multi-axis RoPE (several positions per token)
    can_shift: bool = True  # llama.cpp can shift positions (seq_add) in this context
    # hybrid and recurrent models: which layers are which, and the sizes of a sequence's state
    # (0 until with_context fills them in; left 0 on attention-only models)
    layers: str = ""  # "1 attention layer, 3 convolution layers"
    attention_layers: int | None = None  # None: not known
    recurrent_layers: int = 0
    attention_bytes_per_token: int = 0
    recurrent_state_bytes: int = 0  # one sequence's recurrent state, whatever its length

    @property
    def sliding(self) -> bool:
        """Some layers attend to a window of recent tokens only."""
        return self.n_swa > 0 and self.swa_layers != 0

    @property
    def restore_exact_tokens(self) -> int | None:
        """The longest prefix a restored state reproduces exactly; None: any length."""
        return self.n_swa if self.sliding else None

    @property
    def family(self) -> str:
        """What a sequence's state holds: "attention" (cells per token), "hybrid" (cells and a
        recurrent state) or "recurrent" (a recurrent state only)."""
        return "recurrent" if self.recurrent else "hybrid" if self.hybrid else "attention"

    @property
    def can_trim(self) -> bool:
        """A sequence can be cut back to a shorter prefix (recurrent states cannot)."""
        return not (self.recurrent or self.hybrid)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = self.notes()
        return d

    def notes(self) -> list[str]:
        """What the architecture means for caching, one user-facing line each."""
        if self.recurrent or self.hybrid:
            return self._stateful_notes()
        if self.sliding:
            out = ["warm runs from memory: exact (a forked resident prefix, in the cache's cells)"]
        else:
            out = ["warm runs: exact (cells copied or kept where a cold run puts them)"]
        if self.sliding:
            where = f"{self.swa_layers} of {self.n_layer} layers" if self.swa_layers else "some layers"
            window = "chunked" if self.swa_kind == "chunked" else "sliding-window"
            out.append(f"{window} attention: a window of {self.n_swa} tokens on {where}")
            out.append(f"restore from a file or RAM snapshot: approximate once the prefix is longer "
                       f"than the {self.n_swa}-token window (llama.cpp restores window cells out "
                       "of place)")
            out.append("a restored state cut back to a shorter prefix: wrong past the window (its "
                       "window cells are gone); restore or fork the exact prefix instead")
        else:
            out.append("restore from a file or RAM snapshot: exact")
        if not self.can_shift:
            why = "multi-axis RoPE" if self.mrope else "this architecture's KV cache"
            out.append(f"composed modules: unavailable (positions cannot shift: {why})")
        return out

    def _stateful_notes(self) -> list[str]:
        """Hybrid and recurrent models: the recurrent state is kept at every cut point."""
        kind = "hybrid" if self.hybrid else "recurrent"
        out = [f"warm runs: exact in prefix and chain modes (a {kind} model's recurrent state is "
               "kept at every point a run may resume from: the static prefix, each segment end, "
               "each saved state)"]
        if self.layers:
            out.append(f"layers: {self.layers}")
        state = f"{self.recurrent_state_bytes:,} bytes of recurrent state per sequence"
        if self.attention_bytes_per_token:
            out.append(f"cache size: {self.attention_bytes_per_token:,} bytes of K and V per token "
                       f"(attention layers only) + {state}")
        elif self.recurrent_state_bytes:
            out.append(f"cache size: no cells per token; {state}")
        out.append("a sequence cannot be cut back to a shorter prefix (its recurrent state has "
                   "taken in every token): runs resume only where a state was kept")
        out.append("compose mode: refused (a recurrent state cannot be shifted into place or "
                   "composed from modules)")
        out.append("forked batches: refused (forked rows would share one recurrent state in the "
                   "cache's cells)")
        return out


def with_context(traits: ModelTraits, ctx) -> ModelTraits:
    """The traits read before there was a context, completed with what only its memory knows."""
    from dataclasses import replace

    traits = replace(traits, can_shift=bool(L.llama_memory_can_shift(ctx.mem)))
    if traits.recurrent or traits.hybrid:
        # K and V rows of the attention layers only (a saved state grows by that plus each
        # cell's record per token: tests/engine/llama/test_stateful_info.py)
        per_token = kv_bytes_per_token(ctx.model.facts(), ctx.params.type_k, ctx.params.type_v)
        traits = replace(traits, attention_bytes_per_token=per_token,
                         recurrent_state_bytes=measure_recurrent_bytes(ctx.model, ctx.params))
    return traits


def read_traits(model, ctx, path: str | os.PathLike | None = None) -> ModelTraits:
    """The traits of a loaded NativeModel and its NativeContext (None: before there is one;
    ``can_shift`` is then False); ``path`` is the model file, read only when its sliding-window
    pattern is a per-layer list (llama.cpp does not expose list-valued metadata)."""
    arch = model.meta("general.architecture") or "unknown"
    n_layer = int(L.llama_model_n_layer(model.ptr))
    n_swa = max(int(L.llama_model_n_swa(model.ptr)), 0)
    rope = _ROPE_TYPES.get(int(L.llama_model_rope_type(model.ptr)), "other")
    pattern = _swa_pattern(model, arch, n_layer, path) if n_swa else None
    kinds = read_layer_kinds(path or model.path)
    if n_swa and pattern is not None and "S" not in pattern:
        n_swa = 0  # a window no layer uses
    return ModelTraits(
        architecture=arch, n_layer=n_layer, n_swa=n_swa,
        swa_kind=_SWA_KIND_BY_ARCH.get(arch, "standard") if n_swa else "none",
        swa_layers=(pattern.count("S") if pattern is not None else None) if n_swa else 0,
        swa_pattern=(pattern or "") if n_swa else "",
        layers=kinds.legend() if kinds is not None and kinds.stateful else "",
        attention_layers=kinds.attention if kinds is not None else None,
        recurrent_layers=kinds.recurrent if kinds is not None else 0,
        recurrent=bool(L.llama_model_is_recurrent(model.ptr)),
        hybrid=bool(L.llama_model_is_hybrid(model.ptr)),
        rope_type=rope, mrope=rope in _MULTI_AXIS,
        can_shift=bool(L.llama_memory_can_shift(ctx.mem)) if ctx is not None else False)


def _swa_pattern(model, arch: str, n_layer: int, path) -> str | None:
    """One letter a layer (S slides, F full), or None when it cannot be known."""
    key = f"{arch}.attention.sliding_window_pattern"
    period = model.meta(key)  # an integer key; a list is not in llama.cpp's metadata strings
    if period is not None:
        try:
            return _from_period(int(period), False, n_layer)
        except ValueError:
            return None
    flags = _gguf_bool_list(path, key) if path else None
    if flags is not None:
        return "".join("S" if f else "F" for f in flags[:n_layer])
    if arch in _DEFAULT_SWA_PERIOD:
        return _from_period(*_DEFAULT_SWA_PERIOD[arch], n_layer)
    return None


def _from_period(n: int, dense_first: bool, n_layer: int) -> str:
    if n <= 0:
        return "S" * n_layer
    slides = [(il % n != 0) if dense_first else (il % n < n - 1) for il in range(n_layer)]
    return "".join("S" if s else "F" for s in slides)


def _gguf_bool_list(path, key: str) -> list[bool] | None:
    """A list-of-booleans value from a GGUF header, or None (absent, another type, unreadable)."""
    flags = _mf.read_header_values(path, [key]).get(key)
    if isinstance(flags, list) and all(isinstance(f, bool) for f in flags):
        return flags
    return None
