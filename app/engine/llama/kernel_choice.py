"""Which attention kernel warm runs use on this machine and model: measured, not assumed.

llama.cpp's CPU backend has two attention paths (flash attention on or off), and which one is
faster depends on the CPU, the build and the model: on one AVX-512 Xeon a 75-token suffix after
a 1,761-token prefix took 125 ms without flash attention and 562 ms with it; on another CPU the
gap was small. Exactness no longer depends on the choice (warm runs lay their cells out as a
cold run does, work_context.py), so the engine takes the faster one.

The choice is made once per llama.cpp build, CPU, model and context settings, by timing both
kernels on the model, and cached in the user's cache folder. After a prefix, a suffix is timed
in the two batch plans warm runs use: one batch (prefix mode) and a batch per segment (chain
mode, here four of 16 tokens). Flash attention runs batches under 64 tokens on a slower path,
so a kernel that wins the one-batch suffix can lose the split one by more (seen on this
project's build: 634 against 645 ms in one batch, 1,074 against 689 ms in four); the kernel
with the smaller sum of the two wins. ``setting`` overrides it ("on"/"off"); "auto" measures, or
reads the cached measurement. Some cases leave no choice: a quantized V cache needs flash
attention, and sliding-window models keep evaluating in the cache's own cells, where only
flash attention's small-batch path is exact (batch_plan.py).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import KvPrimerError, ModelError
from .cpu_kernels import build_facts, cpu_facts
from .native import ContextParams, NativeContext, NativeModel
from ..files.user_files import atomic_write

FLASH_ATTN_SETTINGS = ("auto", "on", "off")
# tokens the timed suffix attends to (shorter for small contexts): flash attention's penalty on
# small batches grows with the context (seen: 1.16x at 512 tokens, 1.6x at 1,761), so a short
# prefix would favour it; cached prompts are long
CALIBRATION_PREFIX = 1024
CALIBRATION_SUFFIX = 64  # one batch: the size of a typical row's variable part
SPLIT = 4  # batches the same suffix is cut into, as a chain run cuts it at segments


@dataclass(frozen=True)
class KernelTiming:
    flash_attn: bool
    prefix_ms_per_token: float  # evaluating the prefix in n_batch batches
    suffix_ms: float  # CALIBRATION_SUFFIX tokens after the prefix in one batch (best of two)
    split_suffix_ms: float = 0.0  # the same tokens in SPLIT batches, one per segment
    suffix_tokens: int = CALIBRATION_SUFFIX

    @property
    def score(self) -> float:
        return self.suffix_ms + self.split_suffix_ms

    def describe(self) -> str:
        return (f"flash attention {'on' if self.flash_attn else 'off'}: a "
                f"{self.suffix_tokens}-token suffix {self.suffix_ms:.0f} ms in one batch, "
                f"{self.split_suffix_ms:.0f} ms in {SPLIT}; prefix "
                f"{self.prefix_ms_per_token:.2f} ms/token")


@dataclass(frozen=True)
class KernelChoice:
    flash_attn: bool | None  # None: llama.cpp decides (models without attention layers)
    how: str  # "measured", "measured earlier", "set", "required"
    reason: str  # one line for people
    timings: tuple[KernelTiming, ...] = ()
    calibration_ms: float = 0.0  # what measuring cost (0 when read from the cache)

    def describe(self) -> str:
        state = {True: "on", False: "off", None: "not used"}[self.flash_attn]
        return f"flash attention {state} ({self.how}): {self.reason}"

    def as_dict(self) -> dict:
        return {"flash_attn": self.flash_attn, "how": self.how, "reason": self.reason,
                "timings": [asdict(t) for t in self.timings],
                "calibration_ms": self.calibration_ms}


def check_setting(setting: str) -> str:
    if setting not in FLASH_ATTN_SETTINGS:
        raise KvPrimerError(f"flash attention must be one of {', '.join(FLASH_ATTN_SETTINGS)}, "
                            f"not '{setting}'")
    return setting


def choose_kernels(model: NativeModel, params: ContextParams, model_sha256: str, setting: str,
                   windowed: bool, quantized_v: bool, no_attention: bool = False,
                   remeasure: bool = False) -> KernelChoice:
    """The attention kernel for this model and context (see the module docstring)."""
    check_setting(setting)
    if no_attention:
        return KernelChoice(None, "required", "this model has no attention layers")
    if quantized_v:
        if setting == "off":
            raise KvPrimerError("a quantized V cache needs flash attention; use an f16 V cache "
                                "or turn flash attention on")
        return KernelChoice(True, "required", "a quantized V cache needs flash attention")
    if windowed:
        if setting == "off":
            raise KvPrimerError("sliding-window models are evaluated in the cache's shared cells, "
                                "where only flash attention keeps warm runs exact; turn it on or auto")
        return KernelChoice(True, "required", "sliding-window models run in the cache's shared "
                            "cells, exact only with flash attention in batches under 64 tokens")
    if setting != "auto":
        return KernelChoice(setting == "on", "set", "chosen in the settings")
    key = _key(params, model_sha256)
    if not remeasure:
        cached = _read_cache().get(key)
        if cached:
            try:
                timings = tuple(KernelTiming(**t) for t in cached["timings"])
                return _decide(timings, "measured earlier", 0.0)
            except (KeyError, TypeError, ValueError):
                pass  # an old or damaged entry: measure again
    t0 = time.perf_counter()
    timings = measure(model, params)
    choice = _decide(timings, "measured", (time.perf_counter() - t0) * 1000)
    _write_cache(key, choice)
    return choice


TIE = 0.05  # scores closer than this are a tie: the machine's noise can flip them


def _decide(timings: tuple[KernelTiming, ...], how: str, cost_ms: float) -> KernelChoice:
    best = min(timings, key=lambda t: (t.score, t.prefix_ms_per_token))
    other = next(t for t in timings if t is not best)
    if other.score <= best.score * (1 + TIE) and _batching_cost(other) < _batching_cost(best):
        # a tie: keep the kernel whose time depends less on how the suffix is batched (its
        # small-batch penalty grows with the context, which the measurement only samples)
        best, other = other, best
    ratio = other.score / best.score if best.score > 0 else 1.0
    verdict = (f"{ratio:.2f}x faster on suffixes in one batch and in {SPLIT} here" if ratio > 1 + TIE
               else f"as fast within {TIE:.0%} and less slowed by small batches")
    reason = f"{verdict} ({best.describe()}; {other.describe()})"
    return KernelChoice(best.flash_attn, how, reason, timings, cost_ms)


def _batching_cost(t: KernelTiming) -> float:
    """How much slower the split suffix is than the one-batch one (1.0: not at all)."""
    return t.split_suffix_ms / t.suffix_ms if t.suffix_ms > 0 else 1.0


def measure(model: NativeModel, params: ContextParams,
            kernels: tuple[bool, ...] = (False, True), rounds: int = 2) -> tuple[KernelTiming, ...]:
    """Time each kernel on this model: a prefix in n_batch batches, then a one-batch suffix,
    the suffixes of all kernels in alternation (best of ``rounds``), so that a load that comes
    and goes on the machine weighs on every kernel alike."""
    n_prefix = max(8, min(CALIBRATION_PREFIX, params.n_ctx // 2))
    n_suffix = min(CALIBRATION_SUFFIX, params.n_batch, n_prefix)
    n_ctx = n_prefix + n_suffix + 1
    # any ids will do for timing; spread over the vocabulary, never the same twice in a row
    tokens = [(7919 * i + 13) % model.n_vocab for i in range(n_prefix + n_suffix)]
    batch = min(params.n_batch, n_ctx)
    contexts: list[NativeContext] = []
    prefix_ms: list[float] = []
    suffix_ms = [float("inf")] * len(kernels)
    split_ms = [float("inf")] * len(kernels)
    step = max(1, n_suffix // SPLIT)
    plans = ((n_suffix,), tuple(min(step, n_suffix - a) for a in range(0, n_suffix, step)))
    try:
        for fa in kernels:
            ctx = NativeContext(model, replace(params, n_ctx=n_ctx, n_seq_max=1, flash_attn=fa))
            contexts.append(ctx)
            t0 = time.perf_counter()
            for a in range(0, n_prefix, batch):
                ctx.decode([(tokens[i], i, (0,), False) for i in range(a, min(a + batch, n_prefix))])
            prefix_ms.append((time.perf_counter() - t0) * 1000 / n_prefix)
        for _ in range(rounds):
            for k, ctx in enumerate(contexts):
                for plan, best in zip(plans, (suffix_ms, split_ms)):
                    ctx.seq_rm(0, n_prefix, -1)
                    t0 = time.perf_counter()
                    pos = n_prefix
                    for n in plan:
                        ctx.decode([(tokens[i], i, (0,), i == n_prefix + n_suffix - 1)
                                    for i in range(pos, pos + n)])
                        pos += n
                    ctx.logits(-1)
                    best[k] = min(best[k], (time.perf_counter() - t0) * 1000)
    finally:
        for ctx in contexts:
            ctx.close()
    return tuple(KernelTiming(fa, p, s, sp, n_suffix)
                 for fa, p, s, sp in zip(kernels, prefix_ms, suffix_ms, split_ms))


# ---- the cache of measurements


def _key(params: ContextParams, model_sha256: str) -> str:
    # the build (version and library files) and the CPU (model and flags) as the crash check
    # knows them
    parts = ["kernel-choice 4", build_facts().identity, cpu_facts().identity, model_sha256,
             params.type_k, params.type_v, str(params.n_batch), str(params.n_threads)]
    if params.n_ubatch:  # a micro-batch other than the batch (keys made before it stay valid)
        parts.append(f"ubatch {params.n_ubatch}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cache_path() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("kvprimer", appauthor=False) / "kernel-choices.json"


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, choice: KernelChoice) -> None:
    data = _read_cache()
    data[key] = {"timings": [asdict(t) for t in choice.timings], "at": time.time()}
    try:
        _cache_path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(_cache_path(), (json.dumps(data, indent=1).encode(),), ModelError,
                     "kernel measurement")
    except (OSError, ModelError):
        pass  # a cache we cannot write only costs the measurement again next time
