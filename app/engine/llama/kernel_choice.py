"""Which attention kernel warm runs use on this machine and model: measured, not assumed.

llama.cpp's CPU backend has two attention paths (flash attention on or off), and which one is
faster depends on the CPU, the build and the model: on one AVX-512 Xeon a 75-token suffix after
a 1,761-token prefix took 125 ms without flash attention and 562 ms with it; on another CPU the
gap was small. Exactness no longer depends on the choice (warm runs lay their cells out as a
cold run does, work_context.py), so the engine takes the faster one.

kernel_measure.py times both kernels on the model until the figures are stable, noting the
machine's load, and probes whether each computes cells alike however tokens are batched. The
choice weighs the two batch plans by the reuse mode runs use: chain (the default) cuts a row's
variable part at every segment unless the kernel is grouping-exact, so its split plan weighs
most on a kernel that is not; flash
attention runs batches under 64 tokens on a slower path, so a kernel that wins the one-batch
suffix can lose the split one by more (seen on this project's build: 634 against 645 ms in one
batch, 1,074 against 689 ms in four). ``setting`` overrides it ("on"/"off"); "auto" measures,
or reads the cached measurement.

A measurement is cached per llama.cpp build, CPU, model and context settings. One made on a busy
machine, or whose figures did not settle, is *provisional*: it is used until it is measured
again, never trusted for good, but not on every start: once it is ``RETRY_S`` old, and each
provisional one in a row doubles the wait (up to ``RETRY_MAX_S``), so a machine that stays busy
does not pay a measurement at every start. A model too slow to time in a few seconds
(kernel_passes.py) keeps the safe default, "not measured", and says why. Until the first
measurement of a model ends the engine runs ``SAFE_DEFAULT`` (flash attention off, llama.cpp's
long-standing default and the one whose speed does not depend on batch sizes). Some cases
leave no choice: a quantized V cache needs flash attention, and sliding-window models keep
evaluating in the cache's own cells, where only flash attention's small-batch path is exact
(batch_policy.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import KvPrimerError, ModelError
from .cpu_kernels import build_facts, cpu_facts
from .kernel_measure import (CALIBRATION_PREFIX, CALIBRATION_SUFFIX, SPLIT, KernelMeasurement,
                             KernelTiming, Measured)
from .machine_load import MachineLoad
from .native import ContextParams, NativeModel
from ..user_files import atomic_write

__all__ = ["CALIBRATION_PREFIX", "CALIBRATION_SUFFIX", "SPLIT", "KernelTiming", "KernelChoice",
           "start_choice", "finish_choice"]

FLASH_ATTN_SETTINGS = ("auto", "on", "off")
SAFE_DEFAULT = False  # the kernel used until a measurement says otherwise
# how much each batch plan (one batch, one per segment) counts, by the reuse mode runs use:
# chain cuts a row's variable part at its segments; prefix and compose evaluate it in one batch
PLAN_WEIGHTS = {"chain": (0.25, 0.75), "prefix": (1.0, 0.0), "compose": (1.0, 0.0)}
DEFAULT_MODE = "chain"
RETRY_S = 15 * 60  # a provisional measurement is measured again once this old...
RETRY_MAX_S = 24 * 3600  # ...the wait doubling with each provisional one in a row, up to a day


@dataclass(frozen=True)
class KernelChoice:
    flash_attn: bool | None  # None: llama.cpp decides (models without attention layers)
    # "measured", "measured earlier", "set", "required", "until measured", "not measured"
    how: str
    reason: str  # one line for people
    timings: tuple[KernelTiming, ...] = ()
    calibration_ms: float = 0.0  # what measuring cost (0 when read from the cache)
    provisional: bool = False  # measured on a busy machine or unsettled: measure again
    load: MachineLoad | None = None  # other processes' CPU use while it was measured
    measured_at: float = 0.0  # time.time() of the measurement
    rounds: int = 0
    mode: str = DEFAULT_MODE  # the reuse mode whose batch plans weighed the choice
    # provisional measurements in a row (0 with provisional: distrusted after runs, wanted now)
    tries: int = 0

    @property
    def timing(self) -> KernelTiming | None:
        """The measurement of the kernel in use (None: not measured, as a kernel set by hand)."""
        return next((t for t in self.timings if t.flash_attn == self.flash_attn), None)

    @property
    def grouping_exact(self) -> bool:
        """The kernel in use was measured to compute every cell alike however the tokens are
        grouped into batches (kernel_measure.py); False when not measured."""
        return any(t.flash_attn == self.flash_attn and t.grouping_exact for t in self.timings)

    @property
    def retry_wait_s(self) -> float:
        """How long a provisional measurement is used before it is measured again."""
        if not self.provisional:
            return math.inf
        return 0.0 if self.tries <= 0 else min(RETRY_MAX_S, RETRY_S * 2 ** (self.tries - 1))

    @property
    def measuring_wanted(self) -> bool:
        """A measurement should run: none yet, or the last one is provisional and old enough
        to try again (``retry_wait_s``)."""
        return self.how == "until measured" or (
            self.provisional and time.time() - self.measured_at >= self.retry_wait_s)

    def describe(self) -> str:
        state = {True: "on", False: "off", None: "not used"}[self.flash_attn]
        how = f"{self.how}, provisional" if self.provisional else self.how
        return f"flash attention {state} ({how}): {self.reason}"

    def figure_lines(self) -> list[str]:
        """The figures behind a measured choice, one line each: timings and their spread, the
        machine's load, when it was measured and whether it is provisional."""
        if not self.timings:
            return ["provisional: the machine was busy; measured again later"] \
                if self.provisional else []
        lines = [t.describe() for t in self.timings]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_at)) \
            if self.measured_at else "at an unknown time"
        lines.append(f"measured {when}, {self.rounds} round{'s' if self.rounds != 1 else ''}, "
                     f"weighed for {self.mode} mode; "
                     f"{self.load.describe() if self.load else 'machine load unknown'}")
        if self.provisional:
            wait = self.retry_wait_s
            when = "now" if wait <= 0 else f"once {age_words(wait)} old"
            lines.append(f"provisional: it will be measured again {when} (`kvprimer info`, or the "
                         "window when the engine is idle)")
        return lines

    def as_dict(self) -> dict:
        return {"flash_attn": self.flash_attn, "how": self.how, "reason": self.reason,
                "timings": [asdict(t) for t in self.timings],
                "calibration_ms": self.calibration_ms, "provisional": self.provisional,
                "load": self.load.as_dict() if self.load else None,
                "measured_at": self.measured_at, "rounds": self.rounds, "mode": self.mode,
                "tries": self.tries, "figures": self.figure_lines()}


def age_words(s: float) -> str:
    """"15 minutes", "2 hours": how old a measurement is, or how long it waits."""
    return f"{s / 3600:.0f} hours" if s >= 90 * 60 else f"{s / 60:.0f} minutes"


def check_setting(setting: str) -> str:
    if setting not in FLASH_ATTN_SETTINGS:
        raise KvPrimerError(f"flash attention must be one of {', '.join(FLASH_ATTN_SETTINGS)}, "
                            f"not '{setting}'")
    return setting


def start_choice(params: ContextParams, model_sha256: str, setting: str, windowed: bool,
                 quantized_v: bool, no_attention: bool = False,
                 remeasure: bool = False) -> KernelChoice:
    """The kernel to open the contexts with now: set, required, a cached measurement, or
    ``SAFE_DEFAULT`` until measured (``measuring_wanted`` then says a measurement should run)."""
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
    cached = None if remeasure else _cached(_key(params, model_sha256))
    if cached is not None:
        return cached
    return KernelChoice(SAFE_DEFAULT, "until measured",
                        "the safe default until the attention kernels are measured on this model")


def new_measurement(model: NativeModel, params: ContextParams,
                    mode: str = DEFAULT_MODE) -> KernelMeasurement:
    return KernelMeasurement(model, params, weights=PLAN_WEIGHTS[mode])


def finish_choice(measured: Measured, params: ContextParams, model_sha256: str,
                  mode: str = DEFAULT_MODE) -> KernelChoice:
    """The choice a finished measurement makes; cached (provisional ones too: they are used
    until measured again, later each time one comes out provisional again)."""
    key = _key(params, model_sha256)
    before = _read_cache().get(key) or {}
    tries = int(before.get("tries", 1)) + 1 if before.get("provisional") else 1
    if measured.skipped:
        choice = KernelChoice(SAFE_DEFAULT, "not measured", f"{measured.skipped}; the safe "
                              "default (-fa on|off sets one)", calibration_ms=measured.cost_ms)
    else:
        choice = _decide(measured.timings, "measured", measured.cost_ms, mode)
    choice = replace(choice, provisional=measured.provisional, load=measured.load,
                     measured_at=measured.at, rounds=measured.rounds,
                     tries=tries if measured.provisional else 0)
    if measured.provisional:
        choice = replace(choice, reason=f"{choice.reason}; provisional: {measured.why_provisional()}")
    _write_cache(key, choice)
    return choice


TIE = 0.05  # scores closer than this are a tie: the machine's noise can flip them


def score(t: KernelTiming, mode: str = DEFAULT_MODE) -> float:
    """The suffix time the mode's runs would see: its plans weighed; a kernel whose cells come
    out alike in any batches lets chain evaluate in plain batches (kernel_measure.py)."""
    w_one, w_split = PLAN_WEIGHTS[mode]
    split = t.suffix_ms if t.grouping_exact else t.split_suffix_ms
    return w_one * t.suffix_ms + w_split * split


def _decide(timings: tuple[KernelTiming, ...], how: str, cost_ms: float,
            mode: str = DEFAULT_MODE) -> KernelChoice:
    best = min(timings, key=lambda t: (score(t, mode), t.prefix_ms_per_token))
    other = next(t for t in timings if t is not best)
    if score(other, mode) <= score(best, mode) * (1 + TIE) \
            and _batching_cost(other) < _batching_cost(best):
        # a tie: keep the kernel whose time depends less on how the suffix is batched (its
        # small-batch penalty grows with the context, which the measurement only samples)
        best, other = other, best
    ratio = score(other, mode) / score(best, mode) if score(best, mode) > 0 else 1.0
    verdict = (f"{ratio:.2f}x faster on suffixes as {mode} mode batches them here"
               if ratio > 1 + TIE else f"as fast within {TIE:.0%} and less slowed by small batches")
    reason = verdict  # the timings themselves: figure_lines
    return KernelChoice(best.flash_attn, how, reason, timings, cost_ms, mode=mode)


def _batching_cost(t: KernelTiming) -> float:
    """How much slower the split suffix is than the one-batch one (1.0: not at all, or never
    split: a grouping-exact kernel's chain runs batch plainly)."""
    if t.grouping_exact:
        return 1.0
    return t.split_suffix_ms / t.suffix_ms if t.suffix_ms > 0 else 1.0


# ---- the cache of measurements


def _key(params: ContextParams, model_sha256: str) -> str:
    # the build (version and library files) and the CPU (model and flags) as the crash check
    # knows them; version 6 added the batch-grouping probe (older entries are measured again)
    parts = ["kernel-choice 6", build_facts().identity, cpu_facts().identity, model_sha256,
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


def _cached(key: str) -> KernelChoice | None:
    """The cached measurement for ``key`` as a choice ("measured earlier"), or None."""
    entry = _read_cache().get(key)
    if not entry:
        return None
    try:
        load = MachineLoad(**entry["load"]) if entry.get("load") else None
        if entry.get("skipped"):  # too slow to time: the safe default, and why
            choice = KernelChoice(SAFE_DEFAULT, "not measured", f"{entry['skipped']}; the safe "
                                  "default (-fa on|off sets one)")
        else:
            timings = tuple(KernelTiming(**t) for t in entry["timings"])
            choice = _decide(timings, "measured earlier", 0.0, entry.get("mode", DEFAULT_MODE))
        provisional = bool(entry.get("provisional"))
        # entries from before the count: one try
        tries = int(entry.get("tries", 1 if provisional else 0))
    except (KeyError, TypeError, ValueError, StopIteration):
        return None  # an old or damaged entry: measure again
    why = entry.get("why", "")
    return replace(choice, provisional=provisional, load=load, tries=tries,
                   measured_at=float(entry.get("at", 0.0)), rounds=int(entry.get("rounds", 0)),
                   reason=f"{choice.reason}; provisional: {why}" if why else choice.reason)


def _write_cache(key: str, choice: KernelChoice, why: str = "") -> None:
    data = _read_cache()
    why = why or (choice.reason.partition("; provisional: ")[2] if choice.provisional else "")
    data[key] = {"timings": [asdict(t) for t in choice.timings], "at": choice.measured_at or time.time(),
                 "load": choice.load.as_dict() if choice.load else None, "rounds": choice.rounds,
                 "mode": choice.mode, "provisional": choice.provisional, "why": why,
                 "tries": choice.tries}
    if choice.how == "not measured":
        data[key]["skipped"] = choice.reason.partition("; the safe default")[0]
    try:
        _cache_path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(_cache_path(), (json.dumps(data, indent=1).encode(),), ModelError,
                     "kernel measurement")
    except (OSError, ModelError):
        pass  # a cache we cannot write only costs the measurement again next time


def distrust(params: ContextParams, model_sha256: str, choice: KernelChoice, why: str) -> KernelChoice:
    """Mark a cached measurement provisional (runs departed from it): the next start, or the
    engine's next idle time, measures again (at once: no tries to wait for)."""
    choice = replace(choice, provisional=True, tries=0,
                     reason=f"{choice.reason.partition('; provisional: ')[0]}; provisional: {why}")
    if choice.timings:
        _write_cache(_key(params, model_sha256), choice, why)
    return choice
