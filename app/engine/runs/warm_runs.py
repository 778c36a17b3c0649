"""The warm path of a run: what the radix cache holds of the prompt brought into the run's
slot (slot/run_slot.py), only the rest evaluated, then generation.

One path serves every reuse mode and both slots: the request says what to run and how to reuse
(``WarmRequest``); ``find_reuse`` primes or adopts what the mode reuses and looks the prompt up;
compose builds the modules it places (module_compose.py); ``run_in_slot`` brings the hit in (or
composes), evaluates the rest in the batches the policy gives (batch_policy.py: chain also cuts
at segment starts another row of the job can reuse, so those segments' ends can be stored as
nodes), generates, and gives the segment ends back to the cache after the first token. A saved
state on a model that runs in the work context goes straight into it (``from_saved_state``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..cache.cache_tiers import APPROX_RESTORED
from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..states.prefix_state import PrefixState
from ..llama.batch_policy import batch_end_at_or_before
from ..prompts.prompt_segments import Segment
from ..prompts.prompt_tokens import common_prefix
from ..prompts.template import Template
from ..slot.run_slot import NodeEnd, Slot
from ..task_state import TaskState
from .cold_reference import PathResult
from .generation import GenerationConfig, generate
from .module_compose import ModulePlan, compose, plan_modules
from .recompute_choice import Recompute, RecomputeChoice
from .run_parts import RunParts

KEEP_LOGITS = 16  # generated positions whose logits the verdict compares
COMPOSED = "composed modules never attended to each other"


@dataclass(frozen=True)
class WarmRequest:
    """What a warm run is asked: the filled prompt, and how to reuse."""
    template: Template
    tokens: list[int]
    segments: list[Segment]  # where each placeholder's segment starts, in tokens
    reuse: str  # "prefix", "chain" or "compose"
    gen: GenerationConfig
    max_new: int
    state: PrefixState | None = None  # a saved prefix state to reuse instead of the cache's
    recompute: Recompute = Recompute()  # compose: tokens of each module evaluated in context
    keep: bool = True  # chain: store each segment's end as a node
    before: int | None = None  # reuse only cache nodes older than this cache generation
    # chain: the most another row of the job could reuse of this prompt (batch_policy.py,
    # reusable_depths); None: the job's rows are not known, so every segment is cut and stored
    reusable: int | None = None


@dataclass(frozen=True)
class WarmOutcome:
    """The warm path's result and what the report says of its reuse."""
    result: PathResult  # ``starts``: the batch starts its cold run replays
    sources: tuple[tuple[str, int], ...]  # what was reused: ("static prefix", 1761), …
    tier: str  # where the reused prompt was found: resident, ram, file
    note: str = ""  # why the reused cells may not be exact, when they may not
    copied: int = 0  # reused tokens copied from the cache (the rest were in place)
    build_ms: float = 0.0  # compose: evaluating modules seen for the first time
    reuse: str = ""  # the mode it ran as, when not the one asked (a saved state: prefix)
    recompute: RecomputeChoice | None = None  # compose: what was recomputed and why


def run_warm(parts: RunParts, req: WarmRequest, task: TaskState) -> WarmOutcome:
    """The warm path of ``req`` through the cache and the run's slot (see the module
    docstring); a saved state that goes straight into the work context takes
    ``from_saved_state`` instead."""
    hit, node = find_reuse(parts, req, task)
    plan = None
    if req.reuse == "compose" and req.state is None:  # new modules are built first, timed apart
        plan = plan_modules(parts, req.tokens, req.segments, hit, node, task)
        hit = plan.hit
    reused_nodes = [hit.node] + ([m for _s, m in plan.modules] if plan else [])
    t0 = time.perf_counter()  # bringing the reused cells back from RAM or a file is warm time
    try:
        with parts.slot(len(req.tokens) - hit.reused + req.max_new, promote=reused_nodes) as slot:
            return run_in_slot(slot, parts.cache, parts.model, req, hit, plan, task, t0)
    finally:
        parts.cache.enforce()  # what this run added or promoted stayed while it was busy


def find_reuse(parts: RunParts, req: WarmRequest, task: TaskState) -> tuple[CacheHit, RadixNode]:
    """The cache's hit for the prompt under the mode's limit, and the node it reuses from (the
    static prefix primed, or the saved state adopted). Promoting a cached prefix from RAM or a
    file is warm time: the prefix node is not made resident here."""
    tokens, cache = req.tokens, parts.cache
    if req.state is not None:
        node = parts.adopt(req.state)
        return cache.lookup(tokens, limit=min(node.depth, len(tokens) - 1)), node
    node = parts.prime_node(req.template, task, resident=False)
    if req.reuse == "chain":
        return cache.lookup(tokens, limit=len(tokens) - 1, before=req.before), node
    limit = min(req.segments[0].end, node.depth, len(tokens) - 1)
    return cache.lookup(tokens, limit=limit), node


def run_in_slot(slot: Slot, cache: RadixCache, model, req: WarmRequest, hit: CacheHit,
                plan: ModulePlan | None, task: TaskState, t0: float) -> WarmOutcome:
    """Bring the hit (or the composed modules) into the run's slot, evaluate the rest, generate;
    chain gives each segment's end back to the cache. Times are from ``t0``."""
    tokens = req.tokens
    storing = req.keep and req.reuse == "chain"
    recomputed, copied, choice = 0, 0, None
    if plan is None:
        hit = slot.whole(hit)
        note = hit.approx
        with cache.busy(hit.node):
            copied = slot.bring(hit, tokens)
        reused, sources = hit.reused, hit.sources
    else:
        note = hit.approx or COMPOSED
        with cache.busy(hit.node):
            c = compose(slot, cache, plan, tokens, req.recompute, task)
        reused, sources, recomputed, choice = c.reused, c.sources, c.recomputed, c.choice
        if recomputed and not hit.approx:
            note = f"{COMPOSED} (but the {recomputed:,} tokens recomputed in context)"
    t1 = time.perf_counter()
    marks = slot.marks([s.start for s in req.segments], reused, len(tokens), storing,
                       req.reusable)
    ends = set(slot.node_ends([s.end for s in req.segments], reused, len(tokens), marks))
    nodes = [NodeEnd(s.end, s.label, req.template.sha256, hit.approx)
             for s in req.segments if s.end in ends] if storing else []
    result = evaluate_and_generate(slot, model, tokens, reused, marks, req.gen, req.max_new, task,
                                   t0, t1, KEEP_LOGITS, nodes)
    if plan is not None and slot.windowed:
        # a composed sequence there has no single history to replay: its reference is the cold
        # run every exact mode shares, so one cold run per row serves all modes
        result.starts = slot.batching.composed_reference(
            plan.prefix.all_cuts(), req.segments[0].end, len(tokens),
            [s.start for s in req.segments])
    # tokens recomputed in context were evaluated, not reused
    result.reused_tokens = reused - recomputed
    result.evaluated_tokens = len(tokens) - result.reused_tokens
    return WarmOutcome(result, sources, hit.tier, note, copied,
                       plan.build_ms if plan is not None else 0.0, recompute=choice)


def from_saved_state(engine, req: WarmRequest, task: TaskState) -> WarmOutcome:
    """A saved state straight into the work context (into the radix cache only after the
    first token). A state holds one prefix, nothing more: any mode runs as prefix mode."""
    engine.check_state(req.state)
    hit = state_hit(engine, req.state, req.tokens, len(req.tokens) - 1)
    note = hit.approx
    if req.reuse != "prefix":
        note = "; ".join(x for x in (f"a saved state gives its prefix only: {req.reuse} "
                                     "mode ran as prefix mode", hit.approx) if x)
    result, copied = warm_in_work_context(engine, req.tokens, hit, req.gen, req.max_new, task,
                                          state=req.state)
    return WarmOutcome(result, hit.sources, hit.tier, note, copied, reuse="prefix")


def warm_in_work_context(engine, tokens: list[int], hit: CacheHit, gen: GenerationConfig,
                         max_new: int, task: TaskState | None = None, *,
                         keep_logits: int = KEEP_LOGITS,
                         state: PrefixState | None = None) -> tuple[PathResult, int]:
    """The warm run from a saved ``state`` (``hit`` from ``state_hit``) in the work context:
    the state goes straight in, the rest in plain batches, generation; the state is adopted by
    the radix cache after the first token. Without a state, the hit is brought from the cache.
    Returns the result and the number of tokens copied or restored."""
    slot = engine.work_slot
    t0 = time.perf_counter()
    if state is not None:
        copied = slot.restore(state.data, list(state.tokens), hit.reused)
    else:
        copied = slot.bring(hit, tokens)
    t1 = time.perf_counter()
    result = evaluate_and_generate(slot, engine.model, tokens, hit.reused, (), gen, max_new,
                                   task, t0, t1, keep_logits)
    if state is not None:
        engine.adopt(state)
    engine.cache.enforce()  # what this run promoted stayed while it was busy
    return result, copied


def state_hit(engine, state: PrefixState, tokens: list[int], limit: int) -> CacheHit:
    """What a run takes from a saved state: its tokens shared with the prompt, up to ``limit``,
    cut back to a batch end of its history."""
    n = batch_end_at_or_before(engine.batching.saved_state(state.n_tokens), state.n_tokens,
                               min(common_prefix(list(state.tokens), tokens), limit),
                               engine.grouping_exact)
    if engine.stateful and n < state.n_tokens:
        n = 0  # its recurrent state stands at its end: all of it or nothing
    approx = APPROX_RESTORED if engine.cache.windowed else ""
    return CacheHit(None, n, (("saved state", n),) if n else (), "file", approx)


def evaluate_and_generate(slot: Slot, model, tokens: list[int], reused: int, marks, gen,
                          max_new: int, task: TaskState | None, t0: float, t1: float,
                          keep_logits: int, nodes=()) -> PathResult:
    """Evaluate tokens[reused:] in the slot (batches also starting at ``marks``), then generate,
    then give ``nodes`` back to the cache; times are from ``t0`` (the reused part was ready at
    ``t1``). The result's ``starts``: the batch starts a cold run replays."""
    slot.evaluate(tokens[reused:], slot.starts(len(tokens), marks), task, stage="warm",
                  nodes=nodes)
    prompt_s = time.perf_counter() - t1
    plan = slot.history(len(tokens))
    g = generate(slot.ctx, model, slot.step, gen, max_new, task, "warm", min(max_new, keep_logits))
    slot.flush()  # after the first token: the bookkeeping stays out of its time
    return PathResult("warm", reused, len(tokens) - reused, (t1 - t0) * 1000, prompt_s * 1000,
                      (g.t_first - t0) * 1000, (g.t_end - g.t_first) * 1000, g.tokens, g.text,
                      g.logits, plan)
