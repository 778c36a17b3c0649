"""Benchmark rows cold versus warm, per reuse mode: the figures behind `kvprimer bench` and the
Benchmark view.

The static prefix is primed once (not timed as part of any row) and the cache cut back to it.
The rows run in file order, and each row runs every mode side by side before the next row, in
an order that balances (mode_pairs.py: ABBA for two modes), each repeat a round of its own:
timed minutes apart, the modes would compare the machine's load as much as themselves. Every
call of a row sees the cache as the rows before it left it (what this row's own calls store is
not reused by its later calls), so chain and compose still reuse what earlier rows cached
(chain cuts a batch at a segment only where another row can reuse it: batch_policy.py). One
cold run per row serves every mode whose warm history used the same batch starts; the one-shot
cold run, which measures the model's own batch-grouping noise, runs at most once per row: only
when a mode's warm run differs from its cold run, or on every row when asked (``noise``).

Each call records the machine's load while it ran (machine_load.py), read pass by pass (the
task's reports mark the parts): a row is flagged when other programs used more than a quarter
of the cores over a call or over any half second of it (averaged over a call whose cold run
lasts ten times its warm run, a spell over the warm run alone was lost). The runs of a round
(one row, every mode side by side) whose warm runs saw different loads, one busy and one not
or shares more than a tenth of the cores apart, are made again (load_rounds.py), at most RETRIES times; the steadiest
try is kept (the cold runs are kept already, so a try is warm runs only, and the job's plan is
told of them), and a row still straddling a change is flagged. The headline of each mode
against prefix mode comes from each row's side-by-side runs (mode_pairs.paired_figures). The
job's progress comes from a plan of every pass made before it starts (bench_passes.py). Each
row keeps the breakdown of its median warm run (warm_cost.py). A row that fails (too long, bad
values) is reported with its error; the others still run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from ..errors import Cancelled, KvPrimerError, MissingValuesError
from ..llama.machine_load import LoadMeter, MachineLoad
from ..progress_plan import DonePass
from ..runs.generation import GenerationConfig
from ..states.prefix_state import PrefixState
from ..runs.prompt_runs import check_reuse_modes, job_reusable_depths, refuse_compose, run_prompt
from ..runs.result_origin import ResultOrigin
from ..prompts.rows import Row
from ..task_state import TaskState
from ..prompts.template import Template
from ..runs.verdict import Verdict
from ..runs.warm_cost import WarmBreakdown
from .bench_passes import plan_bench
from .load_rounds import LoadedCalls, LoadWatch
from .mode_pairs import bench_order, paired_figures, paired_ratio


@dataclass
class BenchRow:
    row: int
    reuse: str = "prefix"
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    reused_tokens: int = 0
    reused_by_source: list[dict] = field(default_factory=list)
    hit_tier: str = ""
    evaluated_tokens: int = 0
    cold_ms: float = 0.0
    warm_ms: float = 0.0
    cold_ms_min: float = 0.0
    cold_ms_max: float = 0.0
    warm_ms_min: float = 0.0
    warm_ms_max: float = 0.0
    restore_ms: float = 0.0
    build_ms: float = 0.0
    speedup: float = 0.0
    equivalence: str = ""
    tokens_equal: bool = False
    first_diff: int | None = None
    max_logit_diff: float = 0.0
    kl_divergence: float = 0.0
    top1_agree: float = 0.0
    noise_max_logit_diff: float | None = None
    noise_kl_divergence: float | None = None
    note: str = ""
    state_bytes: int = 0
    error: str | None = None
    positions: int = 0  # generated positions the verdict compared
    breakdown: WarmBreakdown | None = None  # where the median warm run's time went
    warm_runs_ms: list[float] = field(default_factory=list)  # each repeat's, in round order
    vs_prefix: float | None = None  # warm time against prefix mode's, side by side (median)
    load: float | None = None  # other programs' share of the cores, the busiest half second
    under_load: bool = False  # measured while other programs used the cores: less sure
    remeasured: int = 0  # runs made again because the load changed between a round's runs
    load_changed: bool = False  # a round's runs still saw different loads after the retries
    # compose: module tokens recomputed in context, their share of the modules' tokens, and
    # the signal that chose them (recompute_choice.py)
    recomputed_tokens: int = 0
    recompute_share: float | None = None
    recompute_signal: str = ""

    def load_words(self) -> str:
        """"re-measured: load changed" for a row whose round was made again; "" if none."""
        if not self.remeasured:
            return ""
        if self.load_changed:
            return "re-measured: load changed, and still changed (less sure)"
        return "re-measured: load changed"

    def verdict(self) -> Verdict | None:
        """The first repeat's verdict (None for a row that failed): its words come from it."""
        if self.error is not None or not self.equivalence:
            return None
        return Verdict(self.equivalence, self.tokens_equal, self.first_diff, self.max_logit_diff,
                       self.kl_divergence, self.top1_agree, self.noise_max_logit_diff,
                       self.noise_kl_divergence, self.note, self.positions)


@dataclass
class BenchResult:
    model: dict
    rows: list[BenchRow] = field(default_factory=list)
    repeat: int = 1
    modes: tuple[str, ...] = ("prefix",)
    recompute: int | str = 0  # compose: the recompute setting, a count (8) or a share ("15%")
    cancelled: bool = False
    origin: ResultOrigin | None = None  # the template, model and settings that made it

    def summary(self) -> dict:
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out: dict = {"rows": len({r.row for r in self.rows}), "repeat": self.repeat,
                     "modes": list(self.modes), "recompute": self.recompute,
                     "cancelled": self.cancelled,
                     "failed_rows": sum(1 for r in self.rows if r.error is not None)}
        for mode in self.modes:
            ok = [r for r in self.rows if r.error is None and r.reuse == mode]
            out[mode] = {
                "rows": len(ok),
                "warm_ms_median": med([r.warm_ms for r in ok]),
                "cold_ms_median": med([r.cold_ms for r in ok]),
                "speedup_median": med([r.speedup for r in ok]),
                "reused_tokens_median": med([r.reused_tokens for r in ok]),
                "evaluated_tokens_median": med([r.evaluated_tokens for r in ok]),
                "build_ms_total": sum(r.build_ms for r in ok),
                "all_tokens_equal": all(r.tokens_equal for r in ok) if ok else None,
                "max_logit_diff": max((r.max_logit_diff for r in ok), default=None),
                "kl_divergence_max": max((r.kl_divergence for r in ok), default=None),
                "top1_agree_mean": (statistics.fmean(r.top1_agree for r in ok) if ok else None),
                "tokens_equal_rows": sum(1 for r in ok if r.tokens_equal),
                "kl_divergence_median": med([r.kl_divergence for r in ok]),
                "recompute_share_median": med([r.recompute_share for r in ok
                                               if r.recompute_share is not None]),
                "equivalence": {w: sum(1 for r in ok if r.equivalence == w)
                                for w in ("bit-identical", "within-noise", "diverged")},
            }
        out["paired"] = {f"{f.mode}_vs_{f.base}": f.as_dict() for f in self.paired()}
        out["rows_under_load"] = self.rows_under_load()
        out["rows_remeasured"], out["rows_load_changed"] = self.rows_remeasured()
        first = out.get(self.modes[0], {}) if self.modes else {}
        # the one-mode figures as before, for readers of older JSON
        out.update({k: first.get(k) for k in ("warm_ms_median", "cold_ms_median",
                                              "speedup_median", "all_tokens_equal",
                                              "max_logit_diff")})
        return out

    def as_dict(self) -> dict:
        return {"model": self.model, "rows": [asdict(r) for r in self.rows],
                "summary": self.summary()}

    def paired(self):
        """Each mode against prefix mode, from the rows' side-by-side runs (mode_pairs.py)."""
        return paired_figures(self.rows, self.modes)

    def rows_under_load(self) -> list[int]:
        """The rows (numbers) measured, in some mode, while the machine was busy."""
        return sorted({r.row for r in self.rows if r.under_load})

    def rows_remeasured(self) -> tuple[list[int], list[int]]:
        """The rows (numbers) made again as the load changed, and those still straddling."""
        return (sorted({r.row for r in self.rows if r.remeasured}),
                sorted({r.row for r in self.rows if r.load_changed}))

    def mode_lines(self) -> list[str]:
        """The benchmark in words, one line per reuse mode (and one if it was cancelled): the
        CLI prints them, the window joins them into its summary."""
        s = self.summary()
        lines = []
        for mode in self.modes:
            m = s.get(mode) or {}
            if not m.get("rows"):
                lines.append(f"{mode}: no row finished")
                continue
            verdicts = ", ".join(f"{n} {w}" for w, n in m["equivalence"].items() if n)
            parts = [f"{mode}: median warm {m['warm_ms_median']:,.1f} ms, cold "
                     f"{m['cold_ms_median']:,.1f} ms, ×{m['speedup_median']:.1f}",
                     f"reused {m['reused_tokens_median']:,.0f} tokens", verdicts,
                     f"max |Δlogit| {m['max_logit_diff']:.3g}",
                     self._compose_words(s, m) if mode == "compose" else "",
                     f"modules built in {m['build_ms_total']:,.0f} ms" if m["build_ms_total"] else ""]
            lines.append("; ".join(x for x in parts if x))
        lines.extend(f.text() for f in self.paired())
        busy = self.rows_under_load()
        if busy:
            lines.append(f"measured under load (other programs used over a quarter of the "
                         f"cores): row{'s' if len(busy) > 1 else ''} "
                         f"{', '.join(str(n) for n in busy)}; their times are less sure")
        again, changed = self.rows_remeasured()
        if again:
            still = (f"; still changed on {', '.join(str(n) for n in changed)}: less sure"
                     if changed else "")
            lines.append(f"re-measured (load changed between a row's side-by-side runs): "
                         f"row{'s' if len(again) > 1 else ''} "
                         f"{', '.join(str(n) for n in again)}{still}")
        if self.cancelled:
            lines.append("cancelled before every row ran")
        return lines


    def _compose_words(self, s: dict, m: dict) -> str:
        """Compose's trade in words: what it recomputed and how close to the cold run it came
        (its time against prefix mode's is the paired line below, ``paired``)."""
        share = m["recompute_share_median"]
        words = [f"recomputed {share:.0%} of module tokens (setting {self.recompute})"
                 if share else "nothing recomputed",
                 f"greedy tokens equal on {m['tokens_equal_rows']} of {m['rows']} rows",
                 f"top-1 agreement {m['top1_agree_mean']:.0%}",
                 f"KL median {m['kl_divergence_median']:.3g}"]
        return ", ".join(words)


def bench_summary(result: BenchResult) -> str:
    """The benchmark on one line (the window's status bar and Benchmark view)."""
    return " · ".join(result.mode_lines())


def check_repeat(repeat: int) -> None:
    if repeat < 1:
        raise KvPrimerError(f"the repeat count must be at least 1 (each row runs that many "
                            f"times), not {repeat}")


def bench_rows(engine, template: Template, rows: list[Row], *, repeat: int = 1,
               modes: tuple[str, ...] | list[str] = ("prefix",), recompute: int | str = 0,
               state: PrefixState | None = None,
               gen: GenerationConfig = GenerationConfig(),
               task: TaskState | None = None, noise: bool = False,
               load_meter=LoadMeter) -> BenchResult:
    """``noise``: measure the noise floor on every row, not only where warm and cold differ.
    ``load_meter``: makes the LoadMeter each call is measured with (tests inject readings)."""
    task = task or TaskState()
    check_repeat(repeat)
    modes = check_reuse_modes(modes)
    if "compose" in modes:
        refuse_compose(engine)
    result = BenchResult(model=engine.info.as_dict(), repeat=repeat, modes=modes,
                         recompute=recompute)
    order = bench_order(len(rows), modes, repeat)
    plan, prime_from = plan_bench(engine, template, rows, order, gen=gen, recompute=recompute,
                                  state=state, noise=noise)
    task.begin_job("bench", len(order), plan=plan)  # "row 7 of 10 · chain", time left
    runs: dict[tuple[int, str], _RowRuns] = {}
    # chain cuts a batch only where another row of the benchmark can reuse the segment
    reusable = (job_reusable_depths(engine, template, [r.values for r in rows])
                if "chain" in modes else [None] * len(rows))
    calls = LoadedCalls(engine, template, state, recompute, gen, task, noise, reusable,
                        load_meter, LoadWatch(plan))
    hook, task.on_report = getattr(task, "on_report", None), calls.watch.report
    try:
        for s_i, step in enumerate(order):
            row = rows[step.row]
            task.begin_item(step.row + 1, len(rows), number=row.number, part=step.mode)
            passes = []
            if s_i == 0:
                passes += _prime(engine, template, state, task, prime_from)
                # the prime's speed, until the first call ends: measured here and now, it
                # beats the kernel measurement's (taken at another time, under another load)
                if passes:
                    plan.prefill_prior = passes[0].prefill_s / plan.units(passes[0])
            got = runs.setdefault((step.row, step.mode), _RowRuns())
            if got.error is None:
                passes += calls.run(step, row, got)
            nxt = order[s_i + 1] if s_i + 1 < len(order) else None
            if nxt is None or (nxt.row, nxt.round) != (step.row, step.round):
                first = s_i
                while first > 0 and (order[first - 1].row, order[first - 1].round) == (
                        step.row, step.round):
                    first -= 1
                passes += calls.steady_round(
                    [(i, order[i], runs[(order[i].row, order[i].mode)])
                     for i in range(first, s_i + 1)], row)
            calls.watch.step_ends()
            task.end_item(passes)
            if nxt is None or nxt.row != step.row:
                _add_row(result, step.row, row, modes, runs, calls.colds.get(step.row, {}),
                         state)
                task.partial(result)
    except Cancelled:
        result.cancelled = True
    finally:
        task.on_report = hook
    return result


def _prime(engine, template, state, task, prime_from: int) -> list:
    """Prime the static prefix (or adopt the saved state) and cut the cache back to it: the
    prime's pass, when it evaluated, for the job's plan."""
    t0 = time.perf_counter()
    node = engine.adopt(state) if state else engine.prime_node(template, task)
    seconds = time.perf_counter() - t0
    engine.cache.retain(node)
    if state is not None or node.depth <= prime_from:
        return []
    return [DonePass("prime", prime_from, node.depth, 0, seconds)]


@dataclass
class _RowRuns:
    """One row's calls in one mode, round by round."""
    reports: list = field(default_factory=list)
    loads: list[MachineLoad] = field(default_factory=list)
    pair_loads: list[MachineLoad] = field(default_factory=list)  # around each warm run
    error: str | None = None
    remeasured: int = 0  # runs made again (a round's loads differed)
    load_changed: bool = False  # a round kept still straddles a change of load

    def run(self, engine, template, row, mode, state, recompute, gen, task, colds, before,
            oneshot, reusable) -> None:
        try:
            blank = template.blank(row.values)
            if blank:  # a row not filled in yet fails alone, as a row too long for the context
                raise MissingValuesError(blank, [])
            # later calls of a row reuse only what was cached before the row's first call
            self.reports.append(run_prompt(engine, template, row.values, reuse=mode,
                                           state=state, gen=gen, recompute=recompute, task=task,
                                           cold_cache=colds, reuse_before=before,
                                           oneshot=oneshot, reusable=reusable))
        except Cancelled:
            raise
        except KvPrimerError as e:
            self.error = str(e)


def _add_row(result: BenchResult, index: int, row: Row, modes, runs, colds, state) -> None:
    """The row's BenchRow in every mode, each placed after the rows of its mode so far (the
    results read mode by mode, whatever order the calls ran in)."""
    made = {m: _bench_row(row, m, runs[(index, m)], colds, state)
            for m in modes if (index, m) in runs}
    base = made.get("prefix")
    for m in modes:
        r = made.get(m)
        if r is None:
            continue
        if base is not None and m != "prefix" and r.error is None and base.error is None:
            r.vs_prefix = paired_ratio(r.warm_runs_ms, base.warm_runs_ms)
        at = max((k + 1 for k, x in enumerate(result.rows)
                  if modes.index(x.reuse) <= modes.index(m)), default=0)
        result.rows.insert(at, r)


def _bench_row(row: Row, mode: str, got: _RowRuns, colds: dict, state) -> BenchRow:
    out = BenchRow(row=row.number, reuse=mode, state_bytes=state.nbytes if state else 0)
    shares = [x.peak_share for x in got.loads if x.peak_share is not None]
    out.load = max(shares) if shares else None
    out.under_load = any(x.busy_at_times for x in got.loads)
    out.remeasured, out.load_changed = got.remeasured, got.load_changed
    if got.error is not None or not got.reports:
        out.error = got.error or "the row did not run"
        return out
    reports = got.reports
    first = reports[0]
    warms = [r.warm.ttft_ms for r in reports]
    v = first.verdict
    colds_ms = sorted(c.ttft_ms for k, c in colds.items() if k[0] == "cold")
    out.prefix_tokens = first.prefix_tokens
    out.suffix_tokens = first.prompt_tokens - first.prefix_tokens
    out.reused_tokens, out.evaluated_tokens = first.reused_tokens, first.evaluated_tokens
    out.reused_by_source = [{"source": s, "tokens": n} for s, n in first.sources]
    out.hit_tier, out.build_ms, out.note = first.hit_tier, first.build_ms, first.note
    out.cold_ms = first.cold.ttft_ms
    out.cold_ms_min, out.cold_ms_max = colds_ms[0], colds_ms[-1]
    out.warm_runs_ms = warms
    out.warm_ms = statistics.median(warms)
    out.warm_ms_min, out.warm_ms_max = min(warms), max(warms)
    out.restore_ms = statistics.median(r.warm.restore_ms for r in reports)
    out.speedup = out.cold_ms / out.warm_ms if out.warm_ms > 0 else 0.0
    out.equivalence, out.tokens_equal, out.first_diff = v.equivalence, v.tokens_equal, v.first_diff
    out.max_logit_diff, out.kl_divergence, out.top1_agree = (v.max_logit_diff, v.kl_divergence,
                                                             v.top1_agree)
    out.noise_max_logit_diff, out.noise_kl_divergence = v.noise_max_logit_diff, v.noise_kl_divergence
    out.positions = v.positions
    if first.recompute is not None:
        c = first.recompute
        out.recomputed_tokens, out.recompute_share, out.recompute_signal = (c.tokens, c.share,
                                                                            c.signal)
    # the run whose time is the median (the lower one of an even count)
    out.breakdown = sorted(reports, key=lambda r: r.warm.ttft_ms)[(len(reports) - 1) // 2].breakdown
    return out
