"""The engine's attention kernel over its life: the choice it opened with, the measurement that
may still be wanted, and the watch that compares runs with the measurement.

An engine must be usable as soon as its model is loaded. With flash attention "auto" and no
trusted measurement it opens on the safe default (or on a provisional measurement) and says so;
the measurement then runs in steps when the engine is idle (the window's worker runs
``Engine.measure_kernels`` as a job of its own between the user's jobs, and any job of the
user's stops it; it resumes where it stopped). A finished measurement that picks the other
kernel is applied by the engine between jobs.

The CLI's commands never wait for it: they run on the last choice or the safe default and say
which on stderr; `kvprimer info` measures in the foreground (a few seconds, the passes sized to
the model: kernel_passes.py), and so does a script's ``Engine(config)`` (the Python API).

A provisional measurement (a busy machine, unsettled figures) is wanted again only once it is
old enough (``KernelChoice.retry_wait_s``: ``RETRY_S``, doubling with each provisional one in a
row), so neither every command nor every start of the window on a busy machine measures again;
an engine that stays open tries again in idle time, ``MAX_RETRIES`` times at most.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .llama.kernel_choice import (RETRY_S, KernelChoice, age_words, distrust, finish_choice,
                                  new_measurement, start_choice)
from .llama.kernel_measure import KernelMeasurement
from .llama.kernel_watch import KernelWatch
from .llama.native import ContextParams, NativeModel
from .slot.run_slot import runs_forked

__all__ = ["RETRY_S", "MAX_RETRIES", "KernelStatus", "EngineKernels"]

MAX_RETRIES = 3  # idle-time measurements again of a provisional one, per engine


@dataclass(frozen=True)
class KernelStatus:
    """What front ends show about the attention-kernel measurement."""
    state: str  # "wanted" (runs when idle), "measuring", "done" (none wanted)
    flash_attn: bool | None  # the kernel in use now
    done: int = 0  # measurement steps done
    total: int = 0
    eta_s: float | None = None
    note: str = ""  # the latest news: why it measures, what the last measurement changed
    provisional: bool = False  # the choice in use is provisional
    how: str = ""  # how the choice in use was made (KernelChoice.how)

    @property
    def active(self) -> bool:
        return self.state != "done"

    def text(self) -> str:
        """One line for a status bar: "measuring attention kernels: 6 s left (flash attention
        off until measured)"."""
        kernel = {True: "on", False: "off", None: "not used"}[self.flash_attn]
        if self.state == "done":
            return self.note or f"flash attention {kernel}" + (" (provisional)" if self.provisional else "")
        if self.state == "measuring" and self.eta_s is not None:
            left = f"{self.eta_s:,.0f} s left" if self.eta_s >= 1 else "<1 s left"
        elif self.state == "measuring":
            left = f"{self.done}/{self.total}"
        else:
            left = "waiting for the engine to be idle"
        meanwhile = ("until measured" if self.how == "until measured" else
                     "provisional until measured" if self.provisional else "meanwhile")
        # why it measures, unless that is only the default's own reason
        why = f" — {self.note}" if self.note and not self.note.startswith("flash attention") else ""
        return f"measuring attention kernels: {left} (flash attention {kernel} {meanwhile}){why}"


class EngineKernels:
    """The choice (``choice``), a measurement still to run (``wanted``), and the watch."""

    def __init__(self, model: NativeModel, params: ContextParams, model_sha256: str, setting: str,
                 windowed: bool, quantized_v: bool, no_attention: bool, remeasure: bool):
        self.model, self.params, self.sha256 = model, params, model_sha256
        self.choice = start_choice(params, model_sha256, setting, windowed, quantized_v,
                                   no_attention)
        # "Measure again" keeps the cached choice in use until the new measurement ends
        self.asked = remeasure and self.choice.how in ("measured earlier", "not measured")
        self.wanted = self.choice.measuring_wanted or self.asked
        self.measurement: KernelMeasurement | None = None
        self.watch = KernelWatch(self.choice)
        self.note = self._start_note()
        self.retries = 0

    @property
    def urgent(self) -> bool:
        """A measurement is wanted now (none yet, asked for, or a provisional one old enough):
        a caller that cannot measure in idle time (a script's Engine) measures first."""
        return self.wanted

    def _start_note(self) -> str:
        if not self.wanted:
            return ""
        if self.choice.how == "until measured":
            return ""  # the status's own words say it
        if self.asked:
            return "measuring again as asked"
        why = self.choice.reason.partition("; provisional: ")[2]
        if self.choice.tries <= 0 and why:  # runs departed from it (kernel_watch.py)
            return why
        age = age_words(time.time() - self.choice.measured_at)
        return f"the last measurement is provisional and {age} old: measuring again"

    @classmethod
    def of(cls, model: NativeModel, config, model_sha256: str, traits) -> "EngineKernels":
        """For an engine with ``config`` (EngineConfig) on a model with ``traits``."""
        return cls(model, config.context_params(config.n_seq_max), model_sha256,
                   config.flash_attn, windowed=runs_forked(traits),
                   quantized_v=config.type_v not in ("f16", "f32", "bf16"),
                   no_attention=traits.recurrent and not traits.hybrid,
                   remeasure=config.remeasure_kernels)

    # ---- measuring
    def measure(self, check=lambda: False, on_step=None, task=None) -> KernelChoice | None:
        """Take measurement steps until it is finished (the new choice, cached) or ``check()``
        says stop (None; the steps taken are kept for the next call)."""
        if not self.wanted:
            return None
        if self.measurement is None:
            self.measurement = new_measurement(self.model, self.params, self.choice.mode)
        if not self.measurement.run(check, on_step, task):
            return None
        measured = self.measurement.result
        self.measurement = None
        old = self.choice
        self.choice = finish_choice(measured, self.params, self.sha256)
        self.wanted = self.asked = False
        self.watch = KernelWatch(self.choice)
        kernel = "on" if self.choice.flash_attn else "off"
        same = old.flash_attn == self.choice.flash_attn
        if self.choice.how == "not measured":
            self.note = (f"attention kernels not measured ({measured.skipped}); flash attention "
                         f"stays {kernel}")
        else:
            self.note = (f"attention kernels measured: flash attention {kernel}"
                         f"{' (provisional)' if self.choice.provisional else ''}"
                         f"{', as in use' if same else ''}")
        return self.choice

    def status(self) -> KernelStatus:
        if self._retry_due():
            self.wanted = True
            self.retries += 1
            self.note = (f"the last measurement is provisional and over "
                         f"{age_words(self.choice.retry_wait_s)} old: measuring again")
        p = self.measurement.progress() if self.measurement is not None else None
        state = "done" if not self.wanted else "measuring" if p is not None and p.done else "wanted"
        return KernelStatus(state, self.choice.flash_attn, p.done if p else 0, p.total if p else 0,
                            p.eta_s if p else None, self.note, self.choice.provisional,
                            self.choice.how)

    def switched(self, dropped: int, user_tokens: int) -> None:
        """The engine opened its contexts again with the new kernel: say so, and what went."""
        lost = [f"{dropped} cached prompt{'s' if dropped != 1 else ''}" if dropped else "",
                f"sequence 0's {user_tokens} tokens" if user_tokens else ""]
        lost = " and ".join(x for x in lost if x)
        self.note = (f"switched to flash attention {'on' if self.choice.flash_attn else 'off'} "
                     "(measured faster here)" + (f"; dropped {lost}: their cells have the other "
                                                 "kernel's V layout, prime again" if lost else ""))

    # ---- runs against the measurement
    def observe_warm(self, warm) -> str | None:
        """``observe_run`` for a warm run's PathResult (None: no warm run)."""
        if warm is None or warm.evaluated_tokens <= 0:
            return None
        batches = sum(1 for s in warm.starts if s >= warm.reused_tokens) or 1
        return self.observe_run(warm.evaluated_tokens, batches, warm.prompt_ms)

    def observe_run(self, evaluated: int, batches: int, prompt_ms: float) -> str | None:
        """Compare a warm run with the measurement; when runs keep departing from it, the cached
        measurement is marked provisional and a measurement is wanted (the message says so)."""
        if self.choice.how not in ("measured", "measured earlier") or self.wanted:
            return None
        msg = self.watch.observe(evaluated, batches, prompt_ms)
        if msg:
            self.choice = distrust(self.params, self.sha256, self.choice, msg)
            self.wanted = True
            self.note = msg
        return msg

    def _retry_due(self) -> bool:
        """A provisional measurement of this engine's, old enough to try again (a few times:
        a machine that stays busy gets no better answer)."""
        c = self.choice
        return (not self.wanted and c.provisional and self.retries < MAX_RETRIES
                and c.how in ("measured", "measured earlier", "not measured")
                and time.time() - c.measured_at > c.retry_wait_s)

    def give_up(self, why: str) -> None:
        """The measurement failed: keep the kernel in use, and say why (once, not in a loop)."""
        self.wanted = False
        if self.measurement is not None:
            self.measurement.close()
            self.measurement = None
        kernel = {True: "on", False: "off", None: "not used"}[self.choice.flash_attn]
        self.note = f"attention kernels not measured ({why}); flash attention stays {kernel}"

    def close(self) -> None:
        if self.measurement is not None:
            self.measurement.close()
