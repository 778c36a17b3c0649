"""Is a warm run the cold run? A verdict that tells llama.cpp's own numeric noise from error.

Three words:
- ``bit-identical``: the same generated tokens and the same logits, bit for bit, at every
  compared position;
- ``within-noise``: the same tokens, and the logits differ by no more than the model itself
  differs from itself when the same prompt is grouped into batches differently and its cells
  lie elsewhere (measured on this prompt: the one-shot cold run, cells moved by one, against
  the same-boundary cold run), or by no more than float rounding (ROUNDING_*) where that
  measured noise is smaller: a kernel that happens to be insensitive to both must not turn a
  difference in the last bits into ``diverged``;
- ``diverged``: anything else: where the tokens first differ, the next-token KL divergence and
  how often the top-1 tokens agree say by how much.

The noise is measured (a third evaluation of the prompt) only for a run that is not
bit-identical: ``needs_noise`` says when; a bit-identical run's verdict does not depend on it.

Positions are compared while both runs have generated the same tokens so far (after the first
difference their contexts differ and a comparison says nothing about the cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# differences this small are float rounding, never a changed prediction
ROUNDING_LOGIT_DIFF = 1e-3
ROUNDING_KL = 1e-6

BIT_IDENTICAL = "bit-identical"
WITHIN_NOISE = "within-noise"
DIVERGED = "diverged"


@dataclass(frozen=True)
class Comparison:
    tokens_equal: bool
    first_diff: int | None  # first generated position where the tokens differ; None: equal
    max_logit_diff: float  # over the positions compared
    kl_divergence: float  # largest KL(reference || other) over the positions compared
    top1_agree: float  # share of compared positions whose most likely token is the same
    positions: int  # positions compared


@dataclass(frozen=True)
class Verdict:
    equivalence: str  # BIT_IDENTICAL, WITHIN_NOISE or DIVERGED
    tokens_equal: bool
    first_diff: int | None
    max_logit_diff: float
    kl_divergence: float
    top1_agree: float
    noise_max_logit_diff: float | None  # the model's own batch-grouping noise on this prompt
    noise_kl_divergence: float | None
    note: str = ""  # why the run could not be exact (e.g. a state restored on a window model)
    positions: int = 0  # generated positions whose logits were compared (0: nothing to judge)

    @property
    def exact(self) -> bool:
        return self.equivalence == BIT_IDENTICAL

    def describe(self) -> str:
        """One line for a table or a status bar."""
        if self.equivalence == BIT_IDENTICAL:
            text = BIT_IDENTICAL
        elif self.equivalence == WITHIN_NOISE:
            floor = max(self.noise_max_logit_diff or 0.0, ROUNDING_LOGIT_DIFF)
            what = "noise" if floor == self.noise_max_logit_diff else "float rounding"
            text = (f"{WITHIN_NOISE} (|Δlogit| {self.max_logit_diff:.3g} ≤ {what} "
                    f"{floor:.3g}, KL {self.kl_divergence:.2g})")
        else:
            where = ("no position compared" if self.positions == 0
                     else "tokens equal" if self.first_diff is None
                     else f"first differing token {self.first_diff}")
            text = (f"{DIVERGED} ({where}, |Δlogit| {self.max_logit_diff:.3g}, KL "
                    f"{self.kl_divergence:.2g}, top-1 {self.top1_agree:.0%})")
        return f"{text}; {self.note}" if self.note else text


def compare_runs(ref_tokens: list[int], ref_logits: list[np.ndarray], tokens: list[int],
                 logits: list[np.ndarray]) -> Comparison:
    """Compare a run with a reference run: tokens, and logits while their contexts agree."""
    first = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), None)
    if first is None and len(ref_tokens) != len(tokens):
        first = min(len(ref_tokens), len(tokens))
    # position i's logits predict token i: they share a context up to and including first
    n = min(len(ref_logits), len(logits), (first + 1) if first is not None else len(tokens))
    n = max(n, 1) if ref_logits and logits else 0
    diff = kl = 0.0
    agree = 0
    for a, b in zip(ref_logits[:n], logits[:n]):
        d = np.abs(a - b)
        # a NaN anywhere is a difference, never a match (max() would skip it)
        diff = max(diff, float("inf") if not np.all(np.isfinite(d)) and not np.array_equal(a, b)
                   else float(np.max(d)))
        kl = max(kl, kl_divergence(a, b))
        agree += int(np.argmax(a) == np.argmax(b))
    return Comparison(first is None, first, diff, kl, agree / n if n else 1.0, n)


def kl_divergence(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """KL(P_ref || P) of the two next-token distributions, in nats (float64, never negative)."""
    a = ref_logits.astype(np.float64)
    b = logits.astype(np.float64)
    la = a - a.max()
    la -= np.log(np.exp(la).sum())
    lb = b - b.max()
    lb -= np.log(np.exp(lb).sum())
    return max(0.0, float(np.sum(np.exp(la) * (la - lb))))


def is_bit_identical(warm: Comparison) -> bool:
    return warm.tokens_equal and warm.positions > 0 and warm.max_logit_diff == 0.0


def needs_noise(warm: Comparison) -> bool:
    """Whether judging this warm-against-cold comparison needs the model's noise floor: any
    run but a bit-identical one (the floor decides within-noise, and the words describe it)."""
    return not is_bit_identical(warm)


def judge(warm: Comparison, noise: Comparison | None, note: str = "") -> Verdict:
    """The verdict for a warm run compared with its same-boundary cold run, given the noise."""
    if is_bit_identical(warm):
        word = BIT_IDENTICAL
    elif warm.tokens_equal and warm.positions > 0 and (
            (noise is not None and warm.max_logit_diff <= noise.max_logit_diff
             and warm.kl_divergence <= noise.kl_divergence)
            or (warm.max_logit_diff <= ROUNDING_LOGIT_DIFF and warm.kl_divergence <= ROUNDING_KL)):
        word = WITHIN_NOISE
    else:
        word = DIVERGED
    return Verdict(word, warm.tokens_equal, warm.first_diff, warm.max_logit_diff,
                   warm.kl_divergence, warm.top1_agree,
                   None if noise is None else noise.max_logit_diff,
                   None if noise is None else noise.kl_divergence, note, warm.positions)
