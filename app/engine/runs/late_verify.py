"""Verifying a warm run later: its cold run made when there is time, between jobs.

A warm-only run (``run_prompt(..., cold=False)``) leaves its verdict open ("not yet verified")
unless a kept cold run could judge it, and keeps what its cold run needs: the prompt's tokens
and the ``ColdKey`` (cold_reference.py) naming its batches, kernel, settings, thread count and
generation. ``verify_later`` makes that cold run (or takes a kept one) on the generation thread
count the warm run held, and judges the warm run as run_prompt would have: a new report with
the cold run, the noise run when needed, and the verdict. A run whose engine changed since (the
model, the attention kernel, KV types, batch or context size) cannot be verified: its cold run
would be another computation.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import KvPrimerError
from ..llama.thread_fit import shared_fit
from ..task_state import TaskState
from .prompt_runs import RunReport
from .verdict import compare_runs, judge, needs_noise


def check_verifiable(engine, report: RunReport) -> None:
    """Refuse, in one line, a run that has nothing to verify or cannot be verified here."""
    if report.warm is None:
        raise KvPrimerError("a cold-only run has nothing to verify; run the row warm")
    ref = report.reference
    if ref is None or not report.prompt or not report.warm.logits:
        raise KvPrimerError("this run was read from a project file, without its logits; run "
                            "the row again to verify it")
    if ref.model != engine.info.sha256:
        raise KvPrimerError("another model is loaded since this run; run the row again to "
                            "verify it")
    now = engine.cold.key(report.prompt, list(ref.starts or ()), ref.gen, ref.max_new,
                          ref.keep_logits, gen_threads=ref.gen_threads).context
    if now != ref.context:
        what = ("the attention kernel" if now.flash_attn != ref.context.flash_attn
                else "the engine's settings")
        raise KvPrimerError(f"{what} changed since this run, so its cold run would be another "
                            "computation; run the row again to verify it")


def verify_later(engine, report: RunReport, task: TaskState | None = None,
                 oneshot: bool | None = None) -> RunReport:
    """``report`` with its cold run and verdict (a verified report comes back as it is).
    ``oneshot``: the noise run, None only when warm and cold differ, True always."""
    check_verifiable(engine, report)
    if report.verdict is not None and not oneshot:
        return report
    ref, task = report.reference, task or TaskState()
    marks = list(ref.starts) if ref.starts is not None else None
    with shared_fit().pinned(ref.gen_threads):
        cold, kept = engine.cold.reference(ref, report.prompt, marks, ref.gen, ref.max_new,
                                           task, "cold", ref.keep_logits, report.warm)
        warm = report.warm
        w = compare_runs(cold.tokens, cold.logits, warm.tokens, warm.logits)
        noise_run = noise = None
        if oneshot or (oneshot is None and needs_noise(w)):
            noise_run, _kept = engine.cold.reference(
                replace(ref, starts=None), report.prompt, None, ref.gen, ref.max_new, task,
                "oneshot", ref.keep_logits, warm)
            noise = compare_runs(cold.tokens, cold.logits, noise_run.tokens, noise_run.logits)
    return replace(report, cold=cold, cold_kept=kept, oneshot=noise_run or report.oneshot,
                   verdict=judge(w, noise, report.note))
