"""Running a filled prompt warm and cold, and comparing the two.

Warm (warm_runs.py): find what the radix cache already holds of the prompt (``reuse``: the
static prefix only, the deepest cached prompt — ``chain`` —, or the static prefix with composed
modules), bring it into the run's slot (the work context; a sliding-window model: a working
sequence of the cache's context), evaluate only the rest, generate. Cold: the same prompt from
scratch in the cold reference context, with the batch starts the warm run's history used, so an
exact cache gives bit-identical logits. Only when the two differ (or when asked) a one-shot cold run
(plain batches) measures the model's own batch-grouping noise, so a bit-identical run costs two
evaluations, not three. The verdict (verdict.py) weighs the warm run against both. The report
also says where the warm time went (warm_cost.py).

Cold runs are kept (cold_reference.py) by what decides their bits: a later run, repeat or mode
whose reference is the same takes it from there (``RunReport.cold_kept``), a warm-only run too
when a kept one can judge it; a warm-only run otherwise stays "not yet verified" and keeps what
``late_verify.py`` needs to verify it later.
"""
from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field

from .cold_reference import ColdKey, PathResult
from ..errors import KvPrimerError
from ..llama.batch_policy import reusable_depths
from ..llama.thread_fit import shared_fit
from .generation import GenerationConfig, TextDelta
from .reuse_modes import (EXACT_REUSE_MODES, REUSE_MODES, check_recompute, check_reuse_modes,
                          refuse_compose, refuse_compose_on_file)
from ..states.prefix_state import PrefixState
from ..prompts.prompt_segments import prompt_segments
from ..task_state import TaskState
from ..prompts.template import Template
from .late_verify import verify_run
from .recompute_choice import Recompute, RecomputeChoice
from .verdict import Verdict
from .warm_cost import WarmBreakdown, run_breakdown
from .run_parts import RunParts
from .warm_runs import (KEEP_LOGITS, WarmOutcome, WarmRequest, from_saved_state, run_warm,
                        state_hit, warm_in_work_context)

__all__ = ["EXACT_REUSE_MODES", "KEEP_LOGITS", "GenerationConfig", "PathResult", "REUSE_MODES",
           "RunReport", "TextDelta", "WarmBreakdown", "check_reuse_modes", "job_reusable_depths",
           "refuse_compose", "refuse_compose_on_file", "report_dict", "run_prompt", "state_hit",
           "warm_in_work_context"]


@dataclass
class RunReport:
    prompt_tokens: int
    prefix_tokens: int  # the template's static prefix, in this prompt's tokens
    reuse: str
    reused_tokens: int
    evaluated_tokens: int
    tokenize_ms: float
    sources: tuple[tuple[str, int], ...] = ()  # what was reused: ("static prefix", 1761), …
    hit_tier: str = ""  # where the reused prompt was found: resident, ram, file
    build_ms: float = 0.0  # compose: evaluating modules seen for the first time
    state_bytes: int = 0
    cold: PathResult | None = None
    warm: PathResult | None = None
    oneshot: PathResult | None = None  # the noise run: only when warm and cold differ, or asked
    verdict: Verdict | None = None
    note: str = ""  # why the reused cells may not be exact, when they may not
    copied_tokens: int = 0  # reused tokens copied from the cache (the rest were in place)
    plan: list[int] = field(default_factory=list, repr=False)  # the warm history's batch starts
    breakdown: WarmBreakdown | None = None  # where the warm time to first token went
    recompute: RecomputeChoice | None = None  # compose: what was recomputed in context and why
    cold_kept: bool = False  # the cold run judged against was kept from an earlier run
    # what a verification later needs (late_verify.py): the prompt's tokens, and the key of the
    # cold run that is the warm run's reference (None: no warm run)
    prompt: list[int] = field(default_factory=list, repr=False)
    reference: ColdKey | None = field(default=None, repr=False)

    @property
    def speedup(self) -> float | None:
        if self.cold and self.warm and self.warm.ttft_ms > 0:
            return self.cold.ttft_ms / self.warm.ttft_ms
        return None

    @property
    def verified(self) -> bool:
        """A warm run judged against its cold run (a cold-only run has nothing to verify)."""
        return self.warm is None or self.verdict is not None

    def verdict_text(self) -> str:
        """The verdict's one line, saying when its cold run was a kept one; "" for a cold run."""
        if self.verdict is None:
            return "" if self.warm is None else "not yet verified (warm only)"
        text = self.verdict.describe()
        return f"{text}; against a cold run kept from an earlier run" if self.cold_kept else text

    def reuse_text(self) -> str:
        """What the run reused, for people: "static prefix 1,761 + <c1> = … 19 · evaluated 24"."""
        parts = " + ".join(f"{name} {n:,}" for name, n in self.sources) or "nothing"
        where = f" (from {self.hit_tier})" if self.hit_tier not in ("", "resident") else ""
        return f"{parts}{where} · evaluated {self.evaluated_tokens:,}"


def report_dict(rep: RunReport) -> dict:
    """A run as plain data (JSON), for the CLI, the project file and the window alike."""
    def path(p: PathResult | None):
        if p is None:
            return None
        return {"reused_tokens": p.reused_tokens, "evaluated_tokens": p.evaluated_tokens,
                "restore_ms": p.restore_ms, "prompt_ms": p.prompt_ms, "ttft_ms": p.ttft_ms,
                "gen_ms": p.gen_ms, "tokens_per_s": p.tokens_per_s, "tokens": p.tokens,
                "text": p.text}
    v = rep.verdict
    return {"prompt_tokens": rep.prompt_tokens, "prefix_tokens": rep.prefix_tokens,
            "reuse": rep.reuse, "reused_tokens": rep.reused_tokens,
            "reused_by_source": [{"source": s, "tokens": n} for s, n in rep.sources],
            "hit_tier": rep.hit_tier, "evaluated_tokens": rep.evaluated_tokens,
            "copied_tokens": rep.copied_tokens,
            "tokenize_ms": rep.tokenize_ms, "build_ms": rep.build_ms,
            "state_bytes": rep.state_bytes, "speedup": rep.speedup,
            "cold": path(rep.cold), "warm": path(rep.warm), "oneshot": path(rep.oneshot),
            "verdict": None if v is None else {**asdict(v), "text": v.describe()},
            "cold_kept": rep.cold_kept, "verified": rep.verified,
            "breakdown": None if rep.breakdown is None else asdict(rep.breakdown),
            "recompute": None if rep.recompute is None else rep.recompute.as_dict()}


def _one_generation_count(run):
    """The run's warm and cold paths generate on one thread count, taken when it starts: with
    flash attention a one-token decode's rounding depends on the count (thread_fit.py)."""
    @functools.wraps(run)
    def held(*args, **kwargs):
        with shared_fit().pinned():
            return run(*args, **kwargs)
    return held


@_one_generation_count
def run_prompt(engine, template: Template, values: dict[str, str], *, reuse: str = "chain",
               state: PrefixState | None = None, cold: bool = True, warm: bool = True,
               oneshot: bool | None = None, gen: GenerationConfig = GenerationConfig(),
               recompute: int | str | Recompute = 0, keep: bool = True,
               task: TaskState | None = None,
               cold_cache: dict | None = None, reuse_before: int | None = None,
               reusable: int | None = None) -> RunReport:
    """Run one filled prompt on the chosen paths (see the module docstring).

    ``state``: a saved prefix state to reuse (restored once into the cache). ``keep``: cache
    the prompt's segments for later runs (chain). ``recompute``: compose mode evaluates the
    first k tokens of each module in context (8), or a share of them (``"15%"``:
    recompute_choice.py). ``cold_cache``: cold runs already made for this prompt, by batch
    starts (a benchmark's row: its cold times, shared by its modes). Cold
    runs kept by ``engine.cold`` from earlier runs stand in for new ones with the same key
    (``report.cold_kept``). ``reuse_before``: reuse only cache nodes older than this cache
    generation (a benchmark's repeats must not reuse what the row's own first run cached).
    ``oneshot``: the noise run, None (the default) only when warm and cold differ, True
    always, False never. ``reusable`` (chain, a job whose rows are all known:
    ``job_reusable_depths``): the most another row of the job could reuse of this prompt;
    chain cuts a batch only at segment starts up to there (batch_policy.chain_marks). None
    (a single run): at every segment start, for the later runs it cannot see.
    """
    reuse, = check_reuse_modes(reuse, one=True)
    if not (cold or warm):
        raise KvPrimerError("choose cold, warm or both")
    setting = check_recompute(recompute)
    task = task or TaskState()
    t0 = time.perf_counter()
    tokens = engine.tokenize(template.fill(values))
    tokenize_ms = (time.perf_counter() - t0) * 1000
    if not tokens:
        raise KvPrimerError("the filled prompt is empty; nothing to evaluate")
    engine.check_fits(len(tokens))
    segments = prompt_segments(engine.tokenize, template, values, tokens)
    max_new = gen.max_new(len(tokens), engine.n_ctx)
    report = RunReport(len(tokens), segments[0].end, reuse, 0, len(tokens), tokenize_ms,
                       state_bytes=state.nbytes if state else 0)
    if warm:
        req = WarmRequest(template, tokens, segments, reuse, gen, max_new, state, setting, keep,
                          before=reuse_before, reusable=reusable)
        report.warm = _reported(report, _warm(engine, req, task))
        # the cold run that follows may get another count (thread_fit): the warm run's is said
        warm_threads = engine.slot_context.batch_threads
        task.partial(report)
    keep_n = min(max_new, KEEP_LOGITS)
    if warm:  # what verifying it later needs
        report.prompt = tokens
        report.reference = engine.cold.key(tokens, report.plan, gen, max_new, keep_n)
    verify_run(engine, report, tokens, gen, max_new, keep_n, task, cold=cold, oneshot=oneshot,
               colds=cold_cache)
    if report.warm:
        report.breakdown = run_breakdown(engine, report, len(tokens), segments, warm_threads)
    task.partial(report)
    return report


def job_reusable_depths(engine, template: Template, rows: list[dict[str, str]]) -> list[int]:
    """For each row (its values) of a job whose rows are all known, the most another row of
    the job could reuse of its prompt (batch_policy.reusable_depths): chain's ``reusable``. A
    row that will not run (blank, too long) shares nothing."""
    prompts = []
    for values in rows:
        tokens = None
        if not template.blank(values):
            try:
                tokens = engine.tokenize(template.fill(values))
                engine.check_fits(len(tokens))
            except KvPrimerError:
                tokens = None
        prompts.append(tokens)
    return reusable_depths(prompts)


def _warm(engine, req: WarmRequest, task: TaskState) -> WarmOutcome:
    """A saved state on a model that runs in the work context goes straight into it; every
    other warm run goes through the cache and the run's slot, with only the parts it needs."""
    if req.reuse == "compose" and req.state is None:
        refuse_compose(engine)
    if req.state is not None and engine.runs_in_work_context:
        return from_saved_state(engine, req, task)
    return run_warm(RunParts.of(engine), req, task)


def _reported(report: RunReport, warm: WarmOutcome) -> PathResult:
    """The warm path's reuse, as the report says it: from the warm result itself."""
    r = warm.result
    report.plan = r.starts
    report.reused_tokens, report.evaluated_tokens = r.reused_tokens, r.evaluated_tokens
    report.sources, report.hit_tier, report.note = warm.sources, warm.tier, warm.note
    report.copied_tokens, report.build_ms = warm.copied, warm.build_ms
    report.reuse = warm.reuse or report.reuse
    report.recompute = warm.recompute
    return r
