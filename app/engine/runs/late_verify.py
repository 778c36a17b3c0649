"""A warm run verified against its cold run: at once (run_prompt), or later, between jobs.

``verify_run`` is the cold half of every run: the cold run (the caller's, as a benchmark's row
shares it between its modes and repeats; kept by the cold reference from an earlier run,
``report.cold_kept``; or evaluated now), the noise run only when warm and cold differ or when
asked, and the verdict (verdict.py). A warm-only run makes no evaluation: a kept cold run judges
it if one is kept, else it stays "not yet verified" and keeps what its cold run needs: the
prompt's tokens and its ``ColdKey`` (cold_reference.py: its batches, kernel, settings, thread
count and generation). ``verify_later`` makes that cold run, on the generation thread count the
warm run held, and returns the report judged as a run of both paths would have been. A run whose
engine changed since (the model, the attention kernel, KV types, batch or context size) cannot
be verified: its cold run would be another computation.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import KvPrimerError
from ..llama.thread_fit import shared_fit
from ..task_state import TaskState
from .verdict import compare_runs, judge, needs_noise


def verify_run(engine, report, tokens: list[int], gen, max_new: int, keep_n: int,
               task: TaskState, *, cold: bool, oneshot: bool | None, colds: dict | None = None
               ) -> None:
    """Fill ``report``'s cold run, noise run, verdict and ``cold_kept`` (see the module
    docstring). ``cold``: evaluate what is not kept; ``oneshot``: the noise run, None only
    when warm and cold differ, True always, False never; ``colds``: the caller's cold runs."""
    colds = {} if colds is None else colds
    ref = engine.cold

    def cold_path(plan, mode):
        key = ref.key(tokens, plan, gen, max_new, keep_n)
        local = (("cold", tuple(plan), gen, max_new, key.gen_threads) if plan
                 else ("oneshot", gen, max_new, key.gen_threads))
        if local in colds:
            return colds[local], True
        colds[local], kept = ref.reference(key, tokens, plan, gen, max_new, task, mode, keep_n,
                                           report.warm)
        return colds[local], kept

    if cold:
        # without a warm run to match, the cold run is the plain one a user would make (the
        # one-shot run: one computation serves both)
        report.cold, report.cold_kept = cold_path(report.plan if report.warm else None, "cold")
        task.partial(report)
    elif report.warm is not None and report.reference is not None:
        report.cold = ref.kept.get(report.reference)  # warm only: judged if one is kept
        report.cold_kept = report.cold is not None
    if report.cold and report.warm:
        w = compare_runs(report.cold.tokens, report.cold.logits, report.warm.tokens,
                         report.warm.logits)
        if not cold and needs_noise(w):  # warm only: a kept noise run, or no verdict yet
            report.oneshot = ref.kept.get(ref.key(tokens, None, gen, max_new, keep_n))
            if report.oneshot is None:
                report.cold, report.cold_kept = None, False
                return
        # a bit-identical run needs no noise floor to be judged: its third evaluation is saved
        elif oneshot or (oneshot is None and needs_noise(w)):
            report.oneshot = cold_path(None, "oneshot")[0]
        noise = None if report.oneshot is None else compare_runs(
            report.cold.tokens, report.cold.logits, report.oneshot.tokens, report.oneshot.logits)
        report.verdict = judge(w, noise, report.note)
    elif oneshot:
        report.oneshot = cold_path(None, "oneshot")[0]


def check_verifiable(engine, report) -> None:
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


def verify_later(engine, report, task: TaskState | None = None, oneshot: bool | None = None):
    """A new report: ``report`` (a RunReport with a warm run) judged against its cold run, made
    now or kept; a verified report comes back as it is unless the noise run is asked for."""
    check_verifiable(engine, report)
    if report.verdict is not None and not oneshot:
        return report
    ref = report.reference
    out = replace(report, cold=None, oneshot=None, verdict=None, cold_kept=False)
    with shared_fit().pinned(ref.gen_threads):
        verify_run(engine, out, report.prompt, ref.gen, ref.max_new, ref.keep_logits,
                   task or TaskState(), cold=True, oneshot=oneshot)
    return out
