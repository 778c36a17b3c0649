"""Where a warm run's time to first token went, and when chain's batching cost more than it saves.

A warm run's time to first token has three parts, timed where they happen (prompt_runs.py):
bringing the reused cells in (kept in place, copied from the radix cache or restored from a
state), evaluating the rest of the prompt in batches, and reading the last logits to sample the
first token. ``WarmBreakdown`` holds them, with the tokens and batches behind each.

On a kernel that is not grouping-exact (kernel_measure.py), chain mode starts a batch at each
segment after the reused part that another row of the job can reuse (every one in a single
run: batch_policy.chain_marks), so that the segment's end can be stored for later rows; prefix
mode evaluates the same tokens in as few batches as n_batch allows (and so does chain on a
grouping-exact kernel: then there is nothing to note). Small batches cost more per token (flash attention runs batches under 64 tokens on its
slower path), so the cuts pay off only when later rows reuse the stored segments.
``batching_note`` estimates both sides from the engine's kernel measurement (a suffix in one
batch and in several, kernel_measure.py) and says so when the cuts cost more than one reuse of
the segments they store can save.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..llama.kernel_measure import SPLIT


@dataclass(frozen=True)
class WarmBreakdown:
    """A warm run's time to first token, part by part; the parts add up to ``total_ms``."""
    reused_tokens: int  # taken from the cache (kept in place or copied)
    copied_tokens: int  # of those, copied or restored into the context the run evaluates in
    restore_ms: float  # finding, keeping, copying or restoring the reused cells
    evaluated_tokens: int  # the prompt's other tokens (compose: recomputed ones included)
    batches: int  # decode calls that evaluated them
    evaluate_ms: float
    first_token_ms: float  # after the last batch: the logits read and the first token sampled
    total_ms: float  # the warm run's time to first token
    build_ms: float = 0.0  # compose: modules seen for the first time, built before the run
    batching_note: str = ""  # chain's cuts cost more than the segments they store can save
    batch_threads: int = 0  # threads the last batch ran on (thread_fit.py: fewer on a busy machine)

    @property
    def ms_per_batch(self) -> float:
        return self.evaluate_ms / self.batches if self.batches else 0.0

    def describe(self) -> str:
        """One line: "copy 1,761 tokens 44.0 ms · evaluate 75 tokens in 1 batch 540.2 ms · …"."""
        kept = self.reused_tokens - self.copied_tokens
        bring = (f"copy {self.copied_tokens:,} tokens" if self.copied_tokens else "copy nothing")
        if kept > 0:
            bring += f" (kept {kept:,} in place)"
        plural = "batch" if self.batches == 1 else "batches"
        each = f" ({self.ms_per_batch:,.1f} ms a batch)" if self.batches > 1 else ""
        if self.batch_threads:
            # "batch": the Model panel's count is the same kind, taken at load
            each += f" on {self.batch_threads} batch thread{'s' if self.batch_threads > 1 else ''}"
        parts = [f"{bring} {self.restore_ms:,.1f} ms",
                 f"evaluate {self.evaluated_tokens:,} tokens in {self.batches} {plural} "
                 f"{self.evaluate_ms:,.1f} ms{each}",
                 f"first token {self.first_token_ms:,.1f} ms"]
        text = " · ".join(parts) + f" (time to first token {self.total_ms:,.1f} ms)"
        if self.build_ms:
            text += f"; modules built first {self.build_ms:,.0f} ms"
        return text


def warm_breakdown(warm, copied_tokens: int, build_ms: float = 0.0,
                   batching_note: str = "") -> WarmBreakdown:
    """The breakdown of a warm PathResult: its batches are its batch starts past the reused
    part; the first token is what its time to first token holds beyond restore and evaluation."""
    batches = sum(1 for s in warm.starts if s >= warm.reused_tokens)
    if warm.evaluated_tokens and not batches:
        batches = 1  # a path that kept no batch starts evaluated its tokens in one go
    first = max(0.0, warm.ttft_ms - warm.restore_ms - warm.prompt_ms)
    return WarmBreakdown(warm.reused_tokens, min(copied_tokens, warm.reused_tokens),
                         warm.restore_ms, warm.evaluated_tokens, batches, warm.prompt_ms, first,
                         warm.ttft_ms, build_ms, batching_note)


@dataclass(frozen=True)
class BatchCost:
    """What the kernel in use measured: a suffix of ``tokens`` in one batch and in ``split``."""
    tokens: int
    one_batch_ms: float
    split: int
    split_ms: float

    @property
    def extra_ms_per_batch(self) -> float:
        """What each further batch adds to the same tokens (never below 0)."""
        return max(0.0, (self.split_ms - self.one_batch_ms) / max(self.split - 1, 1))

    @property
    def ms_per_token(self) -> float:
        return self.one_batch_ms / self.tokens if self.tokens else 0.0


def measured_batch_cost(kernels) -> BatchCost | None:
    """The engine's kernel measurement for the kernel in use (a KernelChoice), or None when
    nothing was measured (a kernel set by hand or required by the model)."""
    t = kernels.timing if kernels is not None else None
    if t is None or t.suffix_tokens <= 0 or t.suffix_ms <= 0 or t.split_suffix_ms <= 0:
        return None
    return BatchCost(t.suffix_tokens, t.suffix_ms, SPLIT, t.split_suffix_ms)


def batching_note(batches: int, plain_batches: int, storable_tokens: int,
                  cost: BatchCost | None) -> str:
    """Chain cut its evaluation into ``batches`` where prefix mode makes ``plain_batches``;
    the segments it stores can save ``storable_tokens`` on a later row that repeats them. Say
    so, with the numbers, when the extra batches cost more than that saves; else ""."""
    extra = batches - plain_batches
    if cost is None or extra <= 0:
        return ""
    extra_ms = extra * cost.extra_ms_per_batch
    save_ms = storable_tokens * cost.ms_per_token
    if extra_ms <= save_ms:
        return ""
    return (f"chain cut the evaluation at segment ends into {batches} batches where prefix "
            f"mode makes {plain_batches}: {extra} more at ≈{cost.extra_ms_per_batch:,.0f} ms "
            f"each, ≈{extra_ms:,.0f} ms; the segments it stored save ≈{save_ms:,.0f} ms "
            f"({storable_tokens:,} tokens at {cost.ms_per_token:.2f} ms) when a later row "
            f"repeats them (measured at start: {cost.tokens} tokens in 1 batch "
            f"{cost.one_batch_ms:,.0f} ms, in {cost.split} {cost.split_ms:,.0f} ms)")


def run_breakdown(engine, report, n_tokens: int, segments, batch_threads: int) -> WarmBreakdown:
    """Where a run's warm time went (``report.warm``, its batches on ``batch_threads``); for a
    chain run in the work context, whether cutting batches at segment ends cost more than the
    segments stored can save."""
    warm = report.warm
    out = replace(warm_breakdown(warm, report.copied_tokens, report.build_ms),
                  batch_threads=batch_threads)
    if report.reuse != "chain" or not engine.runs_in_work_context:
        return out  # prefix and compose batch plainly; the cache's shared context cuts alike
    plain = len(engine.batching.plain(warm.reused_tokens, n_tokens))
    # a later row repeating the values before the last one reuses up to the last segment
    storable = max(0, segments[-1].start - warm.reused_tokens) if len(segments) > 1 else 0
    note = batching_note(out.batches, plain, storable,
                         measured_batch_cost(engine.kernels))
    return replace(out, batching_note=note)
