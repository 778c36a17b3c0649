"""Which of a model's layers attend over a KV cache and which keep a recurrent state, read from
the GGUF header before llama.cpp loads the model.

Hybrid models (LFM2, Granite 4.0-H, Nemotron-H, Qwen3.5, Jamba, ...) mix attention layers with
recurrent ones (short convolutions, Mamba mixers, linear attention); recurrent models (Mamba,
RWKV) have no attention at all. A recurrent layer keeps one fixed-size state per sequence
instead of one cell per token: it has no KV bytes per token, and its state cannot be cut back
or shifted. The rules are llama.cpp's own (src/models/*.cpp of the pinned build): a layer is
recurrent where the file lists it as such, where its KV head count is 0, or, on the Qwen3-Next
family, where it is not every ``full_attention_interval``-th layer. Nemotron-H also has
feed-forward-only layers (0 KV heads and a feed-forward length): neither kind.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from . import model_files as _mf

# llama.cpp's llm_arch_is_recurrent and llm_arch_is_hybrid (src/llama-arch.cpp), by GGUF name
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35",
    "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})
# what a recurrent layer is, in words, by architecture
_KIND = {"lfm2": "convolution", "lfm2moe": "convolution", "mamba": "Mamba", "jamba": "Mamba",
         "falcon-h1": "Mamba 2", "mamba2": "Mamba 2", "granitehybrid": "Mamba 2",
         "nemotron_h": "Mamba 2", "nemotron_h_moe": "Mamba 2", "plamo2": "Mamba",
         "rwkv6": "RWKV", "rwkv6qwen2": "RWKV", "rwkv7": "RWKV", "arwkv7": "RWKV",
         "qwen3next": "Gated DeltaNet", "qwen35": "Gated DeltaNet", "qwen35moe": "Gated DeltaNet"}
# architectures whose recurrent layers are all but every full_attention_interval-th (default 4)
_INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})


@dataclass(frozen=True)
class LayerKinds:
    architecture: str
    n_layer: int
    attention: int  # layers with KV cells per token
    recurrent: int  # layers with a recurrent state per sequence
    recurrent_kind: str = ""  # "convolution", "Mamba 2", "RWKV", "linear-attention", ...
    kv_heads: tuple[int, ...] = ()  # KV heads of each attention layer (empty: not known)

    @property
    def stateful(self) -> bool:
        """A sequence's state includes a recurrent part: it cannot be cut back or shifted."""
        return self.recurrent > 0

    def legend(self) -> str:
        """'1 attention layer, 3 convolution layers' (the recurrent layers only when any)."""
        if self.recurrent and self.attention == self.recurrent == self.n_layer:  # Falcon-H1
            return f"{_count(self.n_layer, 'layer')}, each attention beside a {self.recurrent_kind} mixer"
        parts = [_count(self.attention, "attention layer") if self.attention else "no attention"]
        if self.recurrent:
            parts.append(_count(self.recurrent, f"{self.recurrent_kind} layer"))
        other = self.n_layer - self.attention - self.recurrent
        if other > 0:
            parts.append(_count(other, "feed-forward layer"))
        return ", ".join(parts)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def architecture_is_stateful(arch: str) -> bool:
    return arch in RECURRENT_ARCHS or arch in HYBRID_ARCHS


def read_layer_kinds(path: str | os.PathLike) -> LayerKinds | None:
    """The layer kinds of the model file at ``path``; None if its header cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    # a real model's header holds its whole vocabulary: ~25 ms a walk, so once per file
    return _read_layer_kinds(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_layer_kinds(path: str, _size: int, _mtime_ns: int) -> LayerKinds | None:
    arch = _mf.read_header_values(path, ["general.architecture"]).get("general.architecture")
    if not isinstance(arch, str):
        return None
    keys = {name: f"{arch}.{name}" for name in (
        "block_count", "attention.head_count", "attention.head_count_kv", "feed_forward_length",
        "attention.recurrent_layers", "full_attention_interval", "nextn_predict_layers")}
    v = _mf.read_header_values(path, keys.values())
    get = lambda name: v.get(keys[name])  # noqa: E731
    n_all = get("block_count")
    if not isinstance(n_all, int):
        return None
    n_layer = n_all - (get("nextn_predict_layers") or 0)  # MTP draft layers are not run
    kv = _per_layer(get("attention.head_count_kv"), n_all)
    if kv is None:  # llama.cpp: KV heads default to the heads; none at all on Mamba or RWKV
        kv = _per_layer(get("attention.head_count"), n_all) or [0] * n_all
    ff = _per_layer(get("feed_forward_length"), n_all) or [0] * n_all
    kind = _KIND.get(arch, "linear-attention" if arch in HYBRID_ARCHS else "recurrent")
    if arch in RECURRENT_ARCHS:
        return LayerKinds(arch, n_layer, 0, n_layer, kind)
    recr = get("attention.recurrent_layers")
    if isinstance(recr, list) and len(recr) >= n_layer:
        is_recr = [bool(x) for x in recr[:n_layer]]
    elif arch in _INTERVAL_ARCHS:
        every = get("full_attention_interval") or 4
        is_recr = [(i + 1) % every != 0 for i in range(n_layer)]
    elif arch == "falcon-h1":  # every layer runs attention and a Mamba 2 mixer side by side
        heads = tuple(kv[:n_layer])
        return LayerKinds(arch, n_layer, n_layer, n_layer, kind, heads)
    elif arch in HYBRID_ARCHS:
        is_recr = [kv[i] == 0 and (ff[i] == 0 or not arch.startswith("nemotron_h"))
                   for i in range(n_layer)]
    else:
        is_recr = [False] * n_layer
    heads = tuple(kv[i] for i in range(n_layer) if not is_recr[i] and kv[i] > 0)
    return LayerKinds(arch, n_layer, len(heads), sum(is_recr), kind if any(is_recr) else "", heads)


def _per_layer(value, n: int) -> list[int] | None:
    """A per-layer key's value for each of ``n`` layers: a number for all, or a list."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return [value] * n
    if isinstance(value, list) and len(value) >= n and all(isinstance(x, int) for x in value):
        return [int(x) for x in value[:n]]
    return None
