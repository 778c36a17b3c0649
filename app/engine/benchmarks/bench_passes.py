"""The passes a benchmark will run, foreseen before it starts, and the passes each call ran.

``plan_bench`` walks the benchmark's calls in their order (mode_pairs.bench_order) and lists,
per call, what it will evaluate (progress_plan.PlannedPass):

- the static prefix's prime, in the first call, when the cache does not hold it;
- the warm run: the row's tokens after what the mode reuses — prefix mode the static prefix,
  chain the longest start shared with an earlier row's prompt (chain cached it), compose all
  but the last segment — and the tokens it generates;
- a module for each of compose's segments not cached yet;
- the cold run, unless one with the same key (cold_reference.ColdKey: the prompt, the warm
  history's batch starts, the settings) was made by an earlier call or kept from an earlier
  job: so one serves every mode and repeat whose warm history is the same;
- the noise run (one-shot cold), once per prompt: on every row when asked, else where the
  composed run differs from its cold run (a module's cells stand in for others).

Each of these asks the rule the runs follow: batch_policy.py for where a hit is cut
(``node_reuse``) and where batches start (chain's and forks' marks), recompute_choice.py for
the tokens compose recomputes, the cold reference for keys and kept runs.

``done_passes`` reads what one call really ran from its RunReport, with the measured times, so
the plan (progress_plan.JobPlan) learns its rates from them.
"""
from __future__ import annotations

from ..errors import KvPrimerError
from ..llama.batch_policy import (chain_marks, chain_node_ends, fork_marks, node_reuse,
                                  reusable_depths)
from ..prompts.prompt_segments import prompt_segments
from ..prompts.prompt_tokens import common_prefix
from ..progress_plan import JobPlan, PlannedPass, PlanStep, StepPasses, work_units
from ..runs.generation import GenerationConfig
from ..runs.module_compose import composed_history
from ..runs.recompute_choice import Recompute, row_runs
from ..runs.reuse_modes import check_recompute
from ..runs.warm_runs import KEEP_LOGITS
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


class _Foresight:
    """The calls of a benchmark walked in order before they run, asking the rules the runs
    themselves follow (batch_policy.py for batches and reuse, the cold reference's keys for
    kept cold runs) what each will evaluate."""

    def __init__(self, engine, gen: GenerationConfig, recompute: Recompute, prefix: list[int],
                 prefix_cuts: list[int]):
        self.engine, self.gen, self.recompute, self.prefix = engine, gen, recompute, prefix
        self.windowed = not engine.runs_in_work_context  # the slot's batches and marks
        self.exact = engine.grouping_exact
        self.prefix_cuts = list(prefix_cuts)  # the static prefix's history, as primed
        self.chained: list[tuple] = []  # rows before this one as chain cached them: tokens, cuts
        self.modules: set[tuple[int, ...]] = set()  # module keys cached by the calls so far
        self.colds: set = set()  # ColdKeys evaluated by the calls so far (then kept)

    # ---- the warm run
    def prefix_start(self, segs) -> int:
        """Prefix and compose modes reuse the static prefix: whole batches of its history."""
        if not self.prefix_cuts:
            return segs[0].end
        return node_reuse(self.prefix_cuts, len(self.prefix), segs[0].end, self.exact)

    def chain_start(self, tokens: list[int], segs) -> tuple[int, list[int]]:
        """What chain reuses: the longest start shared with a prompt an earlier row cached,
        cut where the cache cuts a hit (node_reuse), else the static prefix; and the batch
        starts of that history before it."""
        best = self.prefix_start(segs)
        head = [c for c in self.prefix_cuts if c < best]
        for other, cuts in self.chained:
            shared = node_reuse(cuts, len(other), min(common_prefix(tokens, other),
                                                      len(tokens) - 1), self.exact)
            if shared > best:
                best, head = shared, [c for c in cuts if c < shared]
        return best, head

    def marks(self, start: int, n: int, segs, storing: bool,
              reusable: int | None = None) -> list[int]:
        """The slot's marks: chain's segment starts where a node another row can reuse is
        stored (``reusable``: the most another row of the job can reuse), or the forks of the
        cache's shared context."""
        seg_starts = [s.start for s in segs]
        if self.windowed:
            return fork_marks(seg_starts, start, n)
        return chain_marks(seg_starts, start, storing=storing, grouping_exact=self.exact,
                           reusable=reusable)

    def warm_starts(self, start: int, n: int, segs, storing: bool,
                    reusable: int | None = None) -> list[int]:
        """The warm run's batch starts from ``start``: the slot's marks, then the policy's
        batches."""
        return self.engine.batching.warm(start, n, self.marks(start, n, segs, storing, reusable),
                                         windowed=self.windowed)

    def module_runs(self, segs) -> list[list[tuple[int, int]]]:
        """Each composed module's recomputed runs, as compose chooses them: the first module
        right after the static prefix lies where it was made and is kept (``first_in_place``)."""
        modules = segs[1:-1]
        in_place = bool(modules) and modules[0].start == segs[0].end
        return row_runs([s.end - s.start for s in modules], self.recompute, in_place)

    def compose_history(self, segs, n: int) -> list[int]:
        """The batch starts of a composed run's history: module_compose's own plan of it
        (``composed_history``), or where a sliding-window model shares one cold run."""
        p = segs[0].end
        if self.windowed:
            return self.engine.batching.composed_reference(self.prefix_cuts, p, n,
                                                           [s.start for s in segs])
        runs = self.module_runs(segs)
        modules = segs[1:-1]
        return composed_history(self.engine.batching, [c for c in self.prefix_cuts if c < p],
                                modules, runs, segs[-1].start, n)

    def composed_differs(self, segs) -> bool:
        """A composed run differs from its cold run (the noise run is then made) where a
        module's cached cells stand in for cells the cold run computes otherwise: shifted
        after another module, or, on a kernel whose results depend on the batches, cut by a
        recomputed run."""
        for seg, runs in zip(segs[1:-1], self.module_runs(segs)):
            size = seg.end - seg.start
            k = sum(b - a for a, b in runs)
            if k < size and (seg.start != segs[0].end or (k and not self.exact)):
                return True
        return False

    # ---- modules and cold runs
    def new_module(self, key: tuple[int, ...]) -> bool:
        """True for a module no earlier call cached: it is evaluated (a benchmark starts from
        its static prefix alone: bench_rows cuts the cache back to it)."""
        if key in self.modules:
            return False
        self.modules.add(key)
        return True

    def new_cold(self, tokens: list[int], history: list[int] | None) -> bool:
        """True for a cold run (``history``: the warm history's batch starts; None: the
        noise run's plain batches) neither made by an earlier call nor kept from an earlier
        job: it is evaluated."""
        max_new = max_new_tokens(self.engine, len(tokens), self.gen)
        key = self.engine.cold.key(tokens, history, self.gen, max_new,
                                   min(max_new, KEEP_LOGITS))
        if key in self.colds or key in self.engine.cold.kept:
            return False
        self.colds.add(key)
        return True


def max_new_tokens(engine, n: int, gen: GenerationConfig) -> int:
    """The tokens a run of an ``n``-token prompt generates at most (run_prompt's bound)."""
    return gen.max_new(n, engine.n_ctx)


def _prefix_cuts(engine, prefix: list[int], prime_from: int, state) -> list[int]:
    """The batch starts of the static prefix's history: a saved state's, or the cached part's
    and the prime's."""
    if state is not None:
        return engine.batching.saved_state(state.n_tokens)
    hit = engine.cache.lookup(prefix) if prefix else None
    cached = [c for c in hit.node.all_cuts() if c < prime_from] if hit and hit.node else []
    windowed = not engine.runs_in_work_context
    return cached + engine.batching.prime(prime_from, len(prefix), windowed=windowed,
                                          cache_empty=not cached and windowed)


def plan_bench(engine, template, rows, order: list[Step], *, gen: GenerationConfig,
               recompute=0, state=None, noise: bool = False) -> tuple[JobPlan, int]:
    """The benchmark's JobPlan, one step per call of ``order``, and where the prime starts
    (the prefix tokens the cache holds already; the prefix's length: no prime)."""
    prefix = engine.tokenize(template.prefix_prompt())
    prime_from = len(prefix)
    if state is None and prefix:
        prime_from = engine.cache.lookup(prefix).reused
    info = [_row_tokens(engine, template, r) for r in rows]
    f = _Foresight(engine, gen, check_recompute(recompute), prefix,
                   _prefix_cuts(engine, prefix, prime_from, state))
    reusable = reusable_depths([got[0] if got else None for got in info])
    chain_history: dict[int, tuple] = {}
    steps = []
    row_at = -1
    for s in order:
        passes = []
        if not steps and prime_from < len(prefix):
            passes.append(PlannedPass("prime", prime_from, len(prefix)))
        if s.row != row_at:  # a new row: chain may reuse the rows before it (not its own)
            if row_at in chain_history:
                f.chained.append(chain_history[row_at])
            row_at = s.row
        got = info[s.row]
        if got is not None:
            passes += _call_passes(f, s.mode, got, state, noise, chain_history, s.row,
                                   reusable[s.row])
        steps.append(PlanStep(f"row {rows[s.row].number} · {s.mode}", passes, part=s.mode))
    k = attention_share(engine.info)
    prior = None
    est = engine.cold.estimate(len(prefix)) if prefix else None
    if est is not None and est.seconds > 0:
        prior = est.seconds / work_units(0, len(prefix), k)
    return JobPlan(steps, k, prior), prime_from


def _call_passes(f: _Foresight, mode: str, got, state, noise: bool, chain_history: dict,
                 row: int, reusable: int) -> list[PlannedPass]:
    """The passes one call of ``mode`` on a row (its tokens and segments) will run
    (``reusable``: the most another row of the job can reuse of it, for chain's marks)."""
    tokens, segs = got
    n, p = len(tokens), segs[0].end
    gen = max_new_tokens(f.engine, n, f.gen)
    passes = []
    composed = mode == "compose" and state is None and len(segs) > 1
    if state is not None:  # a saved state: prefix mode from its batches
        start = min(p, n - 1)
        history = [c for c in f.prefix_cuts if c < start] + f.warm_starts(start, n, segs, False)
    elif mode == "chain":
        start, head = f.chain_start(tokens, segs)
        start = min(start, n - 1)
        marks = f.marks(start, n, segs, True, reusable)
        history = [c for c in head if c < start] + f.warm_starts(start, n, segs, True, reusable)
        chain_history[row] = (tokens, history)
    elif composed:
        start = segs[-1].start
        d = len(f.prefix)  # a module is evaluated right after the static prefix's node
        for seg in segs[1:-1]:
            if f.new_module(tuple(f.prefix) + tuple(tokens[seg.start:seg.end])):
                passes.append(PlannedPass("module", d, d + seg.end - seg.start))
        history = f.compose_history(segs, n)
    else:
        start = min(f.prefix_start(segs), n - 1)
        history = [c for c in f.prefix_cuts if c < start] + f.warm_starts(start, n, segs, False)
    if mode == "chain" and state is None:
        # the first segment's end, where chain stores it (or reused it), is the module compose
        # would build
        for seg in segs[1:2]:
            if seg.end <= start or chain_node_ends([seg.end], start, n, marks,
                                                   grouping_exact=f.exact):
                f.modules.add(tuple(tokens[:seg.end]))
    passes.append(PlannedPass("warm", start, n, gen))
    if f.new_cold(tokens, history):
        passes.append(PlannedPass("cold", 0, n, gen))
    if (noise or (composed and f.composed_differs(segs))) and f.new_cold(tokens, None):
        passes.append(PlannedPass("oneshot", 0, n, gen))
    return passes


def done_passes(engine, rep, colds_before: set, colds: dict, evaluations_before: int,
                generation_before: int) -> list:
    """The passes one call (``rep``, a RunReport) ran, with their measured times; ``colds``:
    the row's cold runs after the call, ``colds_before`` their keys before it; the modules it
    built are the cache's module nodes newer than ``generation_before``."""
    out = StepPasses()
    n = rep.prompt_tokens
    w = rep.warm
    if w is not None:
        # compose's recomputed tokens count as reused here: they were evaluated before the
        # warm run's own batches, outside its prompt time
        start = w.reused_tokens + (rep.recompute.tokens if rep.recompute is not None else 0)
        out.add("warm", min(start, n), n, len(w.tokens), w.prompt_ms,
                max(w.ttft_ms - w.restore_ms - w.prompt_ms, 0.0) + w.gen_ms)
    if rep.build_ms > 0:
        p = rep.prefix_tokens
        built = [x.depth for x in engine.cache.tree
                 if x.created > generation_before and x.label.startswith("module ")]
        spans = [(p, d) for d in built if d > p] or [(p, max(rep.reused_tokens, p + 1))]
        units = [work_units(a, b, 0.0) for a, b in spans]
        for (a, b), u in zip(spans, units):  # the build's time shared by the modules' tokens
            out.add("module", a, b, 0, rep.build_ms * u / sum(units))
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
