"""Running a filled prompt warm and cold, and comparing the two.

Warm: find what the radix cache already holds of the prompt (``reuse``: the static prefix only,
the deepest cached prompt — ``chain`` —, or the static prefix with composed modules), keep or
copy it into the work context (a sliding-window model: fork it into a working sequence of the
cache's context), evaluate only the rest, generate. Cold: the same prompt from scratch in
the cold reference context, with the batch starts the warm run's history used, so an exact
cache gives bit-identical logits. Only when the two differ (or when asked) a one-shot cold run
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

from ..llama.batch_policy import batch_end_at_or_before, chain_marks, fork_marks
from .cold_reference import ColdKey, PathResult
from ..errors import KvPrimerError
from ..llama.thread_fit import shared_fit
from .generation import GenerationConfig, TextDelta, generate
from .module_compose import compose_in_work_context, compose_into, plan_modules
from .reuse_modes import (EXACT_REUSE_MODES, REUSE_MODES, check_recompute, check_reuse_modes,
                          refuse_compose, refuse_compose_on_file)
from ..cache.cache_tiers import APPROX_RESTORED
from ..files.prefix_state import PrefixState
from ..prompts.prompt_segments import prompt_segments
from ..task_state import TaskState
from ..prompts.template import Template
from .late_verify import verify_run
from .verdict import Verdict
from .warm_cost import WarmBreakdown, run_breakdown

KEEP_LOGITS = 16  # generated positions whose logits the verdict compares

__all__ = ["EXACT_REUSE_MODES", "GenerationConfig", "PathResult", "REUSE_MODES", "RunReport", "TextDelta",
           "WarmBreakdown", "check_reuse_modes", "refuse_compose", "run_prompt", "report_dict",
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
            "breakdown": None if rep.breakdown is None else asdict(rep.breakdown)}


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
               recompute: int = 0, keep: bool = True, task: TaskState | None = None,
               cold_cache: dict | None = None, reuse_before: int | None = None) -> RunReport:
    """Run one filled prompt on the chosen paths (see the module docstring).

    ``state``: a saved prefix state to reuse (restored once into the cache). ``keep``: cache
    the prompt's segments for later runs (chain). ``recompute``: compose mode evaluates the
    first k tokens of each module in context. ``cold_cache``: cold runs already made for this
    prompt, by batch starts (a benchmark's row: its cold times, shared by its modes). Cold
    runs kept by ``engine.cold`` from earlier runs stand in for new ones with the same key
    (``report.cold_kept``). ``reuse_before``: reuse only cache nodes older than this cache
    generation (a benchmark's repeats must not reuse what the row's own first run cached).
    ``oneshot``: the noise run, None (the default) only when warm and cold differ, True
    always, False never.
    """
    reuse, = check_reuse_modes(reuse, one=True)
    if not (cold or warm):
        raise KvPrimerError("choose cold, warm or both")
    check_recompute(recompute)
    task = task or TaskState()
    t0 = time.perf_counter()
    tokens = engine.tokenize(template.fill(values))
    tokenize_ms = (time.perf_counter() - t0) * 1000
    if not tokens:
        raise KvPrimerError("the filled prompt is empty; nothing to evaluate")
    engine.check_fits(len(tokens))
    segments = prompt_segments(engine.tokenize, template, values, tokens)
    max_new = max(1, min(gen.max_tokens, engine.ctx.n_ctx - len(tokens) - 1))
    report = RunReport(len(tokens), segments[0].end, reuse, 0, len(tokens), tokenize_ms,
                       state_bytes=state.nbytes if state else 0)
    if warm:
        report.warm = _warm(engine, template, values, tokens, segments, reuse, state, gen,
                            max_new, recompute, keep, task, report, reuse_before)
        task.partial(report)
    keep_n = min(max_new, KEEP_LOGITS)
    if warm:  # what verifying it later needs
        report.prompt = tokens
        report.reference = engine.cold.key(tokens, report.plan, gen, max_new, keep_n)
    verify_run(engine, report, tokens, gen, max_new, keep_n, task, cold=cold, oneshot=oneshot,
               colds=cold_cache)
    if report.warm:
        report.breakdown = run_breakdown(engine, report, len(tokens), segments)
    task.partial(report)
    return report


def _warm(engine, template, values, tokens, segments, reuse, state, gen, max_new, recompute,
          keep, task, report, before) -> PathResult:
    cache = engine.cache
    if reuse == "compose" and state is None:
        refuse_compose(engine)
    if state is not None and engine.runs_in_work_context:
        engine.check_state(state)
        hit = state_hit(engine, state, tokens, len(tokens) - 1)
        report.note = hit.approx
        if reuse != "prefix":  # reported as what it was: a state holds one prefix, nothing more
            report.reuse = "prefix"
            report.note = "; ".join(x for x in (f"a saved state gives its prefix only: {reuse} "
                                                "mode ran as prefix mode", hit.approx) if x)
        result, report.copied_tokens = warm_in_work_context(engine, tokens, hit, gen, max_new,
                                                            task, state=state)
        return _reported(report, result, hit.sources, hit.tier)
    if state is not None:
        node = engine.adopt(state)
        hit = cache.lookup(tokens, limit=min(node.depth, len(tokens) - 1))
    elif reuse == "chain":  # (promoting a cached prefix from RAM or a file is warm time)
        engine.prime_node(template, task, resident=False)
        hit = cache.lookup(tokens, limit=len(tokens) - 1, before=before)
    else:
        node = engine.prime_node(template, task, resident=False)
        hit = cache.lookup(tokens, limit=min(segments[0].end, node.depth, len(tokens) - 1))
    compose = reuse == "compose" and state is None
    if compose:  # modules seen for the first time are built first, timed apart
        plan = plan_modules(engine, tokens, segments, hit, node, task)
        report.build_ms = plan.build_ms
        hit = plan.hit
    if engine.runs_in_work_context:
        if compose:
            return _compose_in_work_context(engine, tokens, plan, gen, max_new, recompute, task,
                                            report)
        return _warm_in_work_context(engine, template, tokens, segments, reuse, hit, gen,
                                     max_new, keep, task, report)
    report.note = hit.approx
    reused_nodes = [hit.node] + ([m for _s, m in plan.modules] if compose else [])
    t0 = time.perf_counter()  # bringing the reused cells back from RAM or a file is warm time
    with cache.busy(*reused_nodes):  # making room must not evict what this run reuses
        # promotions from RAM or files take cells too: make them first, then room for the rest
        for n in reused_nodes:
            if n is not None:
                cache.materialise(n)
        cache.ensure_free_cells(len(tokens) - hit.reused + max_new)
        work = cache.take_work_seq()
    try:
        with cache.busy(hit.node):
            if compose:
                c = compose_into(engine, plan, tokens, work, recompute, task)
                reused, sources, recomputed = c.reused, c.sources, c.recomputed
                head = []  # the plan is the shared cold run's, set below
                report.note = report.note or "composed modules never attended to each other"
            else:
                cache.fork_into(hit, work)
                reused, sources, recomputed = hit.reused, hit.sources, 0
                head = hit.head_cuts()
        t1 = time.perf_counter()
        labels = {s.end: s.label for s in segments}
        marks = fork_marks([s.start for s in segments], reused, len(tokens))

        # Each segment's end becomes a node. Where the cells are exact whatever follows, the
        # nodes are added after the first token (the radix bookkeeping, spills included, stays
        # out of the time to first token); a sliding-window model's node must be forked while
        # the sequence ends there.
        later: list[int] = []
        starts = engine.batching.warm(reused, len(tokens), marks, windowed=True)

        def remember(pos: int) -> None:
            if not (keep and reuse == "chain" and pos in labels):
                return
            if cache.windowed:
                cache.add(work, labels[pos], head + starts, template.sha256,
                          hit.approx)
            else:
                later.append(pos)

        engine.evaluate(tokens[reused:], work, task, stage="warm", starts=starts, marks=marks,
                        at_mark=remember)
        prompt_s = time.perf_counter() - t1
        report.plan = head + starts
        if compose:
            # a composed sequence has no single history to replay: its reference is the cold
            # run every exact mode shares (static prefix as primed, then each segment in small
            # batches), so one cold run per row serves all modes
            report.plan = engine.batching.composed_reference(
                plan.prefix.all_cuts(), segments[0].end, len(tokens), [x.start for x in segments])
        # tokens recomputed in context were evaluated, not reused
        report.reused_tokens, report.sources = reused - recomputed, sources
        report.evaluated_tokens = len(tokens) - report.reused_tokens
        report.hit_tier = hit.tier
        g = generate(engine.ctx, engine.model,
                     lambda tok: engine.evaluate([tok], work, stage="generate"),
                     gen, max_new, task, "warm", min(max_new, KEEP_LOGITS))
        for pos in later:
            cache.add(work, labels[pos], report.plan, template.sha256, hit.approx, upto=pos)
    finally:
        cache.give_back(work)
        cache.enforce()  # what this run added may have left no node free to move until now
    return PathResult("warm", report.reused_tokens, report.evaluated_tokens, (t1 - t0) * 1000, prompt_s * 1000,
                      (g.t_first - t0) * 1000, (g.t_end - g.t_first) * 1000, g.tokens, g.text,
                      g.logits, report.plan)


def _warm_in_work_context(engine, template, tokens, segments, reuse, hit, gen, max_new, keep,
                          task, report) -> PathResult:
    """Run mode prefix or chain in the work context; chain caches each segment's end."""
    hit = engine.cache.whole_batches(hit)
    report.note = hit.approx
    add_nodes = keep and reuse == "chain"
    marks = chain_marks([s.start for s in segments], hit.reused, storing=add_nodes,
                        grouping_exact=engine.grouping_exact)
    nodes = [(s.end, s.label) for s in segments if s.end > hit.reused] if add_nodes else []
    result, report.copied_tokens = warm_in_work_context(
        engine, tokens, hit, gen, max_new, task, marks=marks, nodes=nodes,
        template_sha256=template.sha256)
    return _reported(report, result, hit.sources, hit.tier)


def _compose_in_work_context(engine, tokens, plan, gen, max_new, recompute, task,
                             report) -> PathResult:
    report.note = plan.hit.approx or "composed modules never attended to each other"
    t0 = time.perf_counter()
    c = compose_in_work_context(engine, plan, tokens, recompute, task)
    t1 = time.perf_counter()
    result = _evaluate_and_generate(engine, tokens, c.reused, (), gen, max_new, task, t0, t1,
                                    KEEP_LOGITS)
    # tokens recomputed in context were evaluated, not reused
    result.reused_tokens = c.reused - c.recomputed
    result.evaluated_tokens = len(tokens) - result.reused_tokens
    engine.cache.enforce()
    return _reported(report, result, c.sources, plan.hit.tier)


def _reported(report, result: PathResult, sources, tier: str) -> PathResult:
    """The run's reuse, as the work-context paths report it: from the warm result itself."""
    report.plan = result.starts
    report.reused_tokens, report.evaluated_tokens = result.reused_tokens, result.evaluated_tokens
    report.sources, report.hit_tier = sources, tier
    return result


def warm_in_work_context(engine, tokens: list[int], hit, gen: GenerationConfig, max_new: int,
                         task: TaskState | None = None, *, marks=(), nodes=(),
                         template_sha256: str = "", keep_logits: int = KEEP_LOGITS,
                         state: PrefixState | None = None) -> tuple[PathResult, int]:
    """The warm run where cells lie as a cold run lays them out (work_context.py): keep or copy
    the hit's tokens (whole batches), evaluate the rest in n_batch batches (also starting at
    ``marks``), generate; after the first token, cache ``tokens[:pos]`` for each (pos, label)
    of ``nodes``. Returns the result (``starts``: the batch starts a cold run replays) and the
    number of tokens copied from the cache.

    With a saved ``state`` (``hit`` from ``state_hit``), the state goes straight into the work
    context, and into the radix cache only after the first token."""
    cache = engine.cache
    t0 = time.perf_counter()
    if state is not None:
        copied = engine.work.restore(state.data, list(state.tokens), engine.cache.state_cuts(state),
                                     hit.reused)
    else:
        copied = cache.bring_to_work(hit, tokens)
    t1 = time.perf_counter()
    result = _evaluate_and_generate(engine, tokens, hit.reused, marks, gen, max_new, task, t0, t1,
                                    keep_logits, snap_at=[pos for pos, _label in nodes])
    if state is not None:
        engine.adopt(state)
    for pos, label in nodes:  # after the first token: the bookkeeping stays out of its time
        cache.store(tokens[:pos], label, template_sha256, hit.approx)
    cache.enforce()  # what this run promoted stayed while it was busy
    return result, copied


def state_hit(engine, state: PrefixState, tokens: list[int], limit: int):
    """What a run takes from a saved state: its tokens shared with the prompt, up to ``limit``,
    cut back to a batch end of its history."""
    from ..prompts.prompt_tokens import common_prefix
    from ..cache.radix_cache import CacheHit

    n = batch_end_at_or_before(engine.cache.state_cuts(state), state.n_tokens,
                               min(common_prefix(list(state.tokens), tokens), limit),
                               engine.grouping_exact)
    if engine.stateful and n < state.n_tokens:
        n = 0  # its recurrent state stands at its end: all of it or nothing
    approx = APPROX_RESTORED if engine.cache.windowed else ""
    return CacheHit(None, n, (("saved state", n),) if n else (), "file", approx)


def _evaluate_and_generate(engine, tokens, reused, marks, gen, max_new, task, t0, t1,
                           keep_logits, snap_at=()) -> PathResult:
    """Evaluate tokens[reused:] in the work context in n_batch batches (also starting at
    ``marks``), then generate; times are from ``t0`` (the reused part was ready at ``t1``).
    A stateful model keeps its recurrent state at the depths ``snap_at`` (nodes to store)."""
    work = engine.work
    work.evaluate(tokens[reused:], engine.batching.warm(reused, len(tokens), marks, windowed=False),
                  task, stage="warm", snap_at=snap_at)
    prompt_s = time.perf_counter() - t1
    plan = [c for c in work.cuts if c < len(tokens)]
    g = generate(work.ctx, engine.model, work.step, gen, max_new, task, "warm",
                 min(max_new, keep_logits))
    return PathResult("warm", reused, len(tokens) - reused, (t1 - t0) * 1000, prompt_s * 1000,
                      (g.t_first - t0) * 1000, (g.t_end - g.t_first) * 1000, g.tokens, g.text,
                      g.logits, plan)
