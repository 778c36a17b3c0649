"""Benchmark rows cold versus warm, per reuse mode: the figures behind `kvprimer bench` and the
Benchmark view.

The static prefix is primed once (not timed as part of any row). For each reuse mode the cache
starts holding only the static prefix, and the rows run in file order, each able to reuse what
earlier rows of that mode left (chain, compose). One cold run per row serves every mode whose
warm history used the same batch starts (the normal case); the one-shot cold run, which
measures the model's own batch-grouping noise, runs at most once per row: only when a mode's
warm run differs from its cold run, or on every row when asked (``noise``). Each row keeps the
breakdown of its median warm run (warm_cost.py). A row that fails (too long,
bad values) is reported with its error; the others still run.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from ..errors import Cancelled, KvPrimerError, MissingValuesError
from ..runs.generation import GenerationConfig
from ..files.prefix_state import PrefixState
from ..runs.prompt_runs import check_reuse_modes, refuse_compose, run_prompt
from ..prompts.rows import Row
from ..task_state import TaskState
from ..prompts.template import Template
from ..runs.verdict import Verdict
from ..runs.warm_cost import WarmBreakdown


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
    # compose: module tokens recomputed in context, their share of the modules' tokens, and
    # the signal that chose them (recompute_choice.py)
    recomputed_tokens: int = 0
    recompute_share: float | None = None
    recompute_signal: str = ""

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
        first = out.get(self.modes[0], {}) if self.modes else {}
        # the one-mode figures as before, for readers of older JSON
        out.update({k: first.get(k) for k in ("warm_ms_median", "cold_ms_median",
                                              "speedup_median", "all_tokens_equal",
                                              "max_logit_diff")})
        return out

    def as_dict(self) -> dict:
        return {"model": self.model, "rows": [asdict(r) for r in self.rows],
                "summary": self.summary()}

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
        if self.cancelled:
            lines.append("cancelled before every row ran")
        return lines


    def _compose_words(self, s: dict, m: dict) -> str:
        """Compose's trade in words: what it recomputed, how close to the cold run it came, and
        its time against prefix mode's when both ran."""
        share = m["recompute_share_median"]
        words = [f"recomputed {share:.0%} of module tokens (setting {self.recompute})"
                 if share else "nothing recomputed",
                 f"greedy tokens equal on {m['tokens_equal_rows']} of {m['rows']} rows",
                 f"top-1 agreement {m['top1_agree_mean']:.0%}",
                 f"KL median {m['kl_divergence_median']:.3g}"]
        prefix = (s.get("prefix") or {}).get("warm_ms_median")
        if prefix:
            words.append(f"warm time {m['warm_ms_median'] / prefix:.2f} of prefix mode's")
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
               task: TaskState | None = None, noise: bool = False) -> BenchResult:
    """``noise``: measure the noise floor on every row, not only where warm and cold differ."""
    task = task or TaskState()
    check_repeat(repeat)
    modes = check_reuse_modes(modes)
    if "compose" in modes:
        refuse_compose(engine)
    result = BenchResult(model=engine.info.as_dict(), repeat=repeat, modes=modes,
                         recompute=recompute)
    prefix = engine.adopt(state) if state else engine.prime_node(template, task)
    colds: dict[int, dict] = {}  # per row: cold runs by batch starts, shared by the modes
    task.begin_job("bench", len(rows) * len(modes))  # "row 7 of 10 · chain", time left
    try:
        for mode in modes:
            engine.cache.retain(prefix)
            for i, row in enumerate(rows):
                task.begin_item(i + 1, len(rows), number=row.number, part=mode)
                result.rows.append(_bench_one(engine, template, row, mode, repeat, state,
                                              recompute, gen, task, colds.setdefault(row.number, {}),
                                              True if noise else None))
                task.end_item()
                task.partial(result)
    except Cancelled:
        result.cancelled = True
    return result


def _bench_one(engine, template, row, mode, repeat, state, recompute, gen, task, colds,
               oneshot) -> BenchRow:
    out = BenchRow(row=row.number, reuse=mode, state_bytes=state.nbytes if state else 0)
    warms, restores, reports = [], [], []
    before = engine.cache.generation + 1
    try:
        blank = template.blank(row.values)
        if blank:  # a row not filled in yet fails alone, as a row too long for the context does
            raise MissingValuesError(blank, [])
        for r in range(repeat):
            # later repeats of a row reuse only what was cached before its first repeat
            rep = run_prompt(engine, template, row.values, reuse=mode, state=state, gen=gen,
                             recompute=recompute, task=task, cold_cache=colds,
                             reuse_before=before, oneshot=oneshot)
            warms.append(rep.warm.ttft_ms)
            restores.append(rep.warm.restore_ms)
            reports.append(rep)
            if r == 0:
                first = rep
    except Cancelled:
        raise
    except KvPrimerError as e:
        out.error = str(e)
        return out
    v = first.verdict
    colds_ms = sorted(c.ttft_ms for k, c in colds.items() if k[0] == "cold")
    out.prefix_tokens = first.prefix_tokens
    out.suffix_tokens = first.prompt_tokens - first.prefix_tokens
    out.reused_tokens, out.evaluated_tokens = first.reused_tokens, first.evaluated_tokens
    out.reused_by_source = [{"source": s, "tokens": n} for s, n in first.sources]
    out.hit_tier, out.build_ms, out.note = first.hit_tier, first.build_ms, first.note
    out.cold_ms = first.cold.ttft_ms
    out.cold_ms_min, out.cold_ms_max = colds_ms[0], colds_ms[-1]
    out.warm_ms = statistics.median(warms)
    out.warm_ms_min, out.warm_ms_max = min(warms), max(warms)
    out.restore_ms = statistics.median(restores)
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
