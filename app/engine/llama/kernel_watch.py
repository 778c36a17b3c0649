"""Checks the kernel choice against what runs actually take.

A measurement is a sample: the machine may have been busier or quieter than it is now, or the
model's real prompts may behave otherwise. After every warm run the engine hands its evaluation
time here; when the time per evaluated token departs from what the measurement predicts for the
kernel in use by more than ``MARGIN`` (either way) ``STRIKES`` runs in a row, the watch says so
once, and the engine measures again when idle.

Only runs like the measured suffix are compared: between a quarter and four times its tokens, in
the batch plan they resemble (one batch, or small batches as chain mode cuts them). Deeper
contexts cost more per token than the measured one, hence the wide margin.
"""
from __future__ import annotations

from .kernel_choice import KernelChoice
from .kernel_measure import KernelTiming

MARGIN = 2.0  # a run taking over 2x, or under 1/2x, the predicted time per token departs
STRIKES = 3  # departures in a row before measuring again
SMALL_BATCH = 64  # flash attention's tiled path starts here (LLAMA_FACTS.md)


class KernelWatch:
    def __init__(self, choice: KernelChoice):
        self.timing: KernelTiming | None = choice.timing
        self.strikes = 0
        self.last_ratio: float | None = None
        self.fired = False

    def expected_ms_per_token(self, evaluated: int, batches: int) -> float | None:
        """What the measurement predicts for a run evaluating ``evaluated`` tokens in
        ``batches`` batches; None when the run is unlike the measured suffix."""
        t = self.timing
        if t is None or t.suffix_tokens <= 0 or batches < 1:
            return None
        if not t.suffix_tokens / 4 <= evaluated <= t.suffix_tokens * 4:
            return None
        split = batches > 1 and evaluated / batches < SMALL_BATCH
        return (t.split_suffix_ms if split else t.suffix_ms) / t.suffix_tokens

    def observe(self, evaluated: int, batches: int, prompt_ms: float) -> str | None:
        """Note one warm run's evaluation; a message (once) when the runs have departed from
        the measurement ``STRIKES`` times in a row."""
        if self.fired:
            return None
        expected = self.expected_ms_per_token(evaluated, batches)
        if expected is None or expected <= 0 or prompt_ms <= 0:
            return None
        ratio = prompt_ms / evaluated / expected
        self.last_ratio = ratio
        if 1 / MARGIN <= ratio <= MARGIN:
            self.strikes = 0
            return None
        self.strikes += 1
        if self.strikes < STRIKES:
            return None
        self.fired = True
        way = f"{ratio:.1f}x" if ratio > 1 else f"1/{1 / ratio:.1f}"
        return (f"the last {STRIKES} runs took {way} the time per token the attention kernels "
                f"were measured at: measuring them again")
