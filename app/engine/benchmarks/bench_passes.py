"""The passes a benchmark will run, foreseen before it starts, and the passes each call ran.

``plan_bench`` walks the benchmark's calls in their order (mode_pairs.bench_order) and lists,
per call, what it will evaluate (progress_plan.PlannedPass):

- the static prefix's prime, in the first call, when the cache does not hold it;
- the warm run: the row's tokens after what the mode reuses — prefix mode the static prefix,
  chain the longest start shared with an earlier row's prompt (chain cached it), compose all
  but the last segment — and the tokens it generates;
- a module for each of compose's segments not seen before (chain's node after the prefix, where
  it stores one, is one);
- a cold run for each different warm history of the row (the batches after what was reused:
  n_batch batches, or, for compose and for chain on a kernel whose results depend on the
  batches, batches that also start at each segment — chain only where another row can reuse
  it, as batch_policy.chain_marks says), unless an earlier row had the same prompt and history
  (the cold run is kept): it runs in the first call that needs it;
- the noise run (one-shot cold), once per row: on every row when asked, else where compose
  places two modules or more (its warm run then differs from the cold one).

``done_passes`` reads what one call really ran from its RunReport, with the measured times, so
the plan (progress_plan.JobPlan) learns its rates from them.
"""
from __future__ import annotations

from ..errors import KvPrimerError
from ..llama.batch_policy import chain_marks, chain_node_ends, fork_marks, reusable_depths
from ..prompts.prompt_segments import prompt_segments
from ..prompts.prompt_tokens import common_prefix
from ..progress_plan import JobPlan, PlannedPass, PlanStep, StepPasses, work_units
from .mode_pairs import Step


def attention_share(info) -> float:
    """Prefill units' ``k``: a token's attention FLOPs per position over its weights' FLOPs."""
    layers = info.traits.attention_layers
    layers = info.n_layer if layers is None else layers
    return 2 * layers * info.n_embd / max(info.n_params, 1)


def _row_tokens(engine, template, row):
    """The row's prompt tokens and segments, or None for a row that will fail (blank, too long)."""
    if template.blank(row.values):
        return None
    try:
        tokens = engine.tokenize(template.fill(row.values))
        engine.check_fits(len(tokens))
    except KvPrimerError:
        return None
    if not tokens:
        return None
    return tokens, prompt_segments(engine.tokenize, template, row.values, tokens)


def _marks(engine, mode: str, start: int, n: int, segs, reusable: int) -> list[int]:
    """Where the warm run's batches also start, as its slot asks the policy: chain at the
    segment starts another row can reuse (``reusable``: chain_marks), at every one on a
    sliding-window model (fork_marks)."""
    starts = [x.start for x in segs]
    if mode == "chain" and engine.n_swa > 0:
        return fork_marks(starts, start, n)
    return chain_marks(starts, start, storing=mode == "chain",
                       grouping_exact=engine.grouping_exact, reusable=reusable)


def _history(engine, mode: str, start: int, n: int, segs, marks) -> tuple:
    """Where the warm run's batches start after the static prefix: what its cold run replays."""
    policy, windowed = engine.batching, engine.n_swa > 0
    if mode == "compose" and len(segs) > 1:
        return tuple(c for seg in segs[1:-1]
                     for c in policy.module(seg.start, seg.end, windowed=windowed)) + \
            tuple(policy.warm(segs[-1].start, n, windowed=windowed))
    return tuple(policy.warm(start, n, marks, windowed=windowed))


def _chain_start(engine, tokens: list[int], chained) -> tuple[int, tuple[int, ...]]:
    """How much of ``tokens`` chain reuses from the prompts earlier rows cached (``chained``:
    their tokens and batch starts): the longest shared start, cut back to a batch start of the
    cached history where the kernel's results depend on the batches; and that history's batch
    starts before it."""
    best, head = 0, ()
    for other, cuts in chained:
        shared = min(common_prefix(tokens, other), len(tokens) - 1)
        if not engine.grouping_exact:
            shared = max((c for c in cuts + (len(other),) if c <= shared), default=0)
        if shared > best:
            best, head = shared, tuple(c for c in cuts if c < shared)
    return best, head


def plan_bench(engine, template, rows, order: list[Step], *, max_tokens: int, state=None,
               noise: bool = False) -> tuple[JobPlan, int]:
    """The benchmark's JobPlan, one step per call of ``order``, and where the prime starts
    (the prefix tokens the cache holds already; the prefix's length: no prime)."""
    prefix = engine.tokenize(template.prefix_prompt())
    prime_from = len(prefix)
    if state is None and prefix:
        prime_from = engine.cache.lookup(prefix).reused
    n_ctx = engine.ctx.n_ctx
    info = [_row_tokens(engine, template, r) for r in rows]
    reusable = reusable_depths([got[0] if got else None for got in info])
    chained: list[tuple] = []  # prompts chain cached (rows before the current one), their cuts
    chain_history: dict[int, tuple] = {}
    modules: set[tuple[int, ...]] = set()
    colds: set[tuple] = set()  # (prompt, warm history): cold runs made (and kept)
    noisy: set[tuple[int, ...]] = set()
    steps = []
    row_at = -1
    for s in order:
        passes = []
        if not steps and prime_from < len(prefix):
            passes.append(PlannedPass("prime", prime_from, len(prefix)))
        got = info[s.row]
        if s.row != row_at:  # a new row: chain may reuse the rows before it
            if row_at in chain_history:
                chained.append(chain_history[row_at])
            row_at = s.row
        if got is not None:
            tokens, segs = got
            n, p = len(tokens), segs[0].end
            gen = max(1, min(max_tokens, n_ctx - n - 1))
            start, head = p, ()
            if s.mode == "chain" and state is None:
                start, head = _chain_start(engine, tokens, chained)
                if start <= p:
                    start, head = p, ()
            elif s.mode == "compose" and len(segs) > 1:
                start = segs[-1].start
                for seg in segs[1:-1]:
                    key = tuple(tokens[seg.start:seg.end])
                    if key not in modules:
                        modules.add(key)
                        passes.append(PlannedPass("module", p, p + seg.end - seg.start))
            start = min(start, n - 1)
            marks = _marks(engine, s.mode, start, n, segs, reusable[s.row])
            # its node after the prefix, where chain stores one, is a module
            if s.mode == "chain" and len(segs) > 1 and (segs[1].end <= start or chain_node_ends(
                    [segs[1].end], start, n, marks, grouping_exact=engine.grouping_exact)):
                modules.add(tuple(tokens[segs[1].start:segs[1].end]))
            passes.append(PlannedPass("warm", start, n, gen))
            history = head + _history(engine, s.mode, start, n, segs, marks)
            if s.mode == "chain":
                chain_history[s.row] = (tokens, history)
            key = (tuple(tokens), history)
            if key not in colds:
                colds.add(key)
                passes.append(PlannedPass("cold", 0, n, gen))
            wants_noise = noise or (s.mode == "compose" and len(segs) > 3)
            if wants_noise and tuple(tokens) not in noisy:
                noisy.add(tuple(tokens))
                passes.append(PlannedPass("oneshot", 0, n, gen))
        steps.append(PlanStep(f"row {rows[s.row].number} · {s.mode}", passes))
    k = attention_share(engine.info)
    prior = None
    est = engine.cold.estimate(len(prefix)) if prefix else None
    if est is not None and est.seconds > 0:
        prior = est.seconds / work_units(0, len(prefix), k)
    return JobPlan(steps, k, prior), prime_from


def done_passes(engine, rep, colds_before: set, colds: dict, evaluations_before: int,
                planned: list[PlannedPass]) -> list:
    """The passes one call (``rep``, a RunReport) ran, with their measured times; ``colds``:
    the row's cold runs after the call, ``colds_before`` their keys before it."""
    out = StepPasses()
    n = rep.prompt_tokens
    w = rep.warm
    if w is not None:
        out.add("warm", w.reused_tokens, n, len(w.tokens), w.prompt_ms,
                max(w.ttft_ms - w.restore_ms - w.prompt_ms, 0.0) + w.gen_ms)
    if rep.build_ms > 0:
        mods = [p for p in planned if p.kind == "module" and p.end > p.start]
        span = sum(p.end - p.start for p in mods)
        for m in mods:  # one pass per module built, the build's time shared by their tokens
            out.add("module", m.start, m.end, 0, rep.build_ms * (m.end - m.start) / span)
        if not mods:
            span = max(rep.reused_tokens - rep.prefix_tokens, 1)
            out.add("module", rep.prefix_tokens, rep.prefix_tokens + span, 0, rep.build_ms)
    made = engine.cold.evaluations - evaluations_before
    for key in [k for k in colds if k not in colds_before]:
        kind = key[0]
        run = colds[key]
        if made <= 0 or (kind == "cold" and rep.cold_kept):
            continue
        made -= 1
        out.add(kind, 0, n, len(run.tokens), run.prompt_ms,
                max(run.ttft_ms - run.prompt_ms, 0.0) + run.gen_ms)
    return out.passes
