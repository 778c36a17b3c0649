"""The session's flows, written once: Prime, Run the selected rows, Verify a warm-only run
later, Benchmark the rows, the prefix sweep, and the snapshot Save writes after a run. The
window (app/ui/prompt_jobs.py), the CLI (app/cli/) and the tests drive these same functions.

A flow has two halves. Its plan is made on the caller's thread, from a Session or from a
template and rows (the CLI's files): it picks the rows, refuses what cannot run (no template,
no row, a row not filled in) with a one-line KvPrimerError, and freezes the options, so the body
never reads a session that another thread may change. Its body is a plain function
``(engine, plan, task)``, Orange3 style: it runs wherever the caller runs engine work (the
window's worker thread, the CLI's main thread), reports progress and partial results
(RowStarted, RunRecord, BenchResult) through the TaskState, and stops at the task's checks when
cancelled, the results so far already delivered.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .benchmarks.bench_rows import BenchResult, bench_rows, check_repeat
from .errors import KvPrimerError, MissingValuesError, RowsError
from .states.prefix_state import PrefixState
from .benchmarks.prefix_sweep import SweepPoint, prefix_sweep
from .runs.late_verify import verify_later
from .runs.prompt_runs import check_recompute, check_reuse_modes, job_reusable_depths, run_prompt
from .prompts.prompt_tokens import common_prefix
from .prompts.rows import Row
from .session import Options, RunRecord, Session
from .task_state import TaskState
from .prompts.template import Template

RUN_PATHS = ("both", "cold", "warm")  # what a run times: both paths, or one of them


@dataclass(frozen=True)
class RowStarted:
    """Partial result of a run: this row's paths start now."""
    row: int


# ---- plans (the caller's thread) ------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    template: Template
    rows: tuple[Row, ...]
    options: Options
    paths: str = "both"  # one of RUN_PATHS
    # with both paths, the plain-batches cold run (the noise floor): None only when warm and
    # cold differ, True on every run (Options.measure_noise), False never
    oneshot: bool | None = None
    state: PrefixState | None = None  # the session's prefix state: kept by the snapshot if it fits
    restore: PrefixState | None = None  # a saved state the warm runs start from
    snapshot: bool = True  # after warm runs, the state Save writes (the window's; not the CLI's)


@dataclass(frozen=True)
class BenchPlan:
    template: Template
    rows: tuple[Row, ...]
    options: Options  # repeat, bench_modes, recompute and generation are used
    state: PrefixState | None = None
    restore: PrefixState | None = None
    snapshot: bool = True


@dataclass(frozen=True)
class VerifyPlan:
    record: RunRecord  # a warm run not yet verified
    oneshot: bool | None = None  # the noise run: None only when warm and cold differ


def session_template(session: Session) -> Template:
    """The session's template, or why there is none to run."""
    if session.template is None:
        raise session.template_error or KvPrimerError("the template has an error; fix it first")
    if not session.template.parts:
        raise KvPrimerError("the template is empty; write or open one first")
    return session.template


def check_filled(template: Template, rows) -> None:
    """Refuse rows not filled in yet (a placeholder blank or only white space) and values for
    names the template does not have."""
    names = set(template.placeholders)
    for row in rows:
        blank = template.blank(row.values)
        unknown = sorted(k for k in row.values if k not in names)
        if blank or unknown:
            raise MissingValuesError(blank, unknown, row=row.number)


def check_options(options: Options) -> None:
    """What every run checks of the options, before any engine work."""
    if options.max_tokens < 1:
        raise KvPrimerError(f"a run generates at least 1 new token; the number of new tokens "
                            f"cannot be {options.max_tokens}")
    check_recompute(options.recompute)


def run_plan(template: Template, rows, options: Options, *, paths: str = "both",
             oneshot: bool | None = None, state: PrefixState | None = None,
             restore: PrefixState | None = None, snapshot: bool = True,
             model=None) -> RunPlan:
    """A run of these rows, checked: a path to take, at least one row, every row filled in,
    one reuse mode (that ``model``, a file not yet loaded, can run). ``oneshot`` (the noise
    run): None follows the options (always when ``measure_noise``, else only when warm and
    cold differ)."""
    if paths not in RUN_PATHS:
        raise KvPrimerError(f"a run takes {', '.join(RUN_PATHS)} paths, not {paths!r}")
    rows = tuple(rows)
    if not rows:
        raise RowsError("there is no row to run; fill the form or import rows first")
    check_filled(template, rows)
    check_options(options)
    check_reuse_modes(options.reuse_mode, one=True, model=model if paths != "cold" else None)
    if oneshot is None:
        oneshot = True if options.measure_noise else None
    return RunPlan(template, rows, options, paths, oneshot if paths == "both" else False, state,
                   restore, snapshot)


def selected_run_plan(session: Session, paths: str = "both",
                      oneshot: bool | None = None) -> RunPlan:
    """Run the selected rows (else the current one, else the first)."""
    tpl = session_template(session)
    rows = session.selected_rows() or session.all_rows()[:1]
    return run_plan(tpl, rows, session.options, paths=paths, oneshot=oneshot, state=session.state)


def bench_plan(template: Template, rows, options: Options, *, state: PrefixState | None = None,
               restore: PrefixState | None = None, snapshot: bool = True,
               model=None) -> BenchPlan:
    """A benchmark of these rows, checked. Rows not filled in fail alone, as rows too long for
    the context do (bench_rows.py); a saved state holds one prefix, so it is benchmarked in
    prefix mode only."""
    rows = tuple(rows)
    if not rows:
        raise RowsError("there are no rows to benchmark; import or add rows first")
    check_repeat(options.repeat)
    check_options(options)
    modes = check_reuse_modes(options.bench_modes, model=model)
    if restore is not None and modes != ("prefix",):
        raise KvPrimerError("a saved state holds one prefix, so it is benchmarked in prefix "
                            f"reuse mode only, not {', '.join(modes)}")
    return BenchPlan(template, rows, replace(options, bench_modes=modes), state, restore, snapshot)


def session_bench_plan(session: Session, repeat: int | None = None) -> BenchPlan:
    """Benchmark all the session's rows with its options (``repeat``: another repeat count)."""
    tpl = session_template(session)
    opts = session.options if repeat is None else replace(session.options, repeat=repeat)
    return bench_plan(tpl, session.all_rows(), opts, state=session.state)


def verify_plan(session: Session, record: RunRecord | None = None) -> VerifyPlan:
    """Verify ``record`` (else the session's latest run not yet verified) later: its cold run."""
    if record is None:
        record = next((r for r in reversed(session.runs) if not r.report.verified), None)
        if record is None:
            raise KvPrimerError("every run is verified already; a warm-only run can be "
                                "verified later")
    if record.report.verified:
        raise KvPrimerError(f"row {record.row}'s run is verified already")
    return VerifyPlan(record, True if session.options.measure_noise else None)


def sweep_values(session: Session) -> tuple[Template, dict[str, str]]:
    """The sweep's template and its one row of values (the selected row, else the first)."""
    tpl = session_template(session)
    rows = session.selected_rows() or session.all_rows()[:1]
    if not rows:
        raise RowsError("the sweep needs one row of values; fill the form first")
    return tpl, rows[0].values


# ---- bodies (where engine work runs) --------------------------------------------------------


@dataclass(frozen=True)
class RunOutcome:
    records: tuple[RunRecord, ...]
    state: PrefixState | None  # the snapshot (None: not asked for, or cold runs only)


@dataclass(frozen=True)
class BenchOutcome:
    result: BenchResult
    state: PrefixState | None


def prime(engine, template: Template, task: TaskState | None = None) -> PrefixState:
    """Evaluate the template's static prefix once (or find it cached) and snapshot it."""
    return engine.prime(template, task=task)


def state_to_save(engine, template: Template, state: PrefixState | None,
                  task: TaskState | None = None) -> PrefixState:
    """The state Save writes after a run: ``state`` (the session's) when it is a prefix of the
    template's static prefix, else the state of the cached static prefix (primed if need be).
    Runs never need it: they fork the radix cache's node."""
    kept = session_state_kept(engine, template, state)
    return kept if kept is not None else engine.prime(template, task=task)


def session_state_kept(engine, template: Template,
                       state: PrefixState | None) -> PrefixState | None:
    """``state`` (the session's) when Save can write it as it is after a run of ``template``:
    a prefix of its static prefix; else None (the static prefix is primed after the runs)."""
    if state is not None:
        prefix = engine.tokenize(template.prefix_prompt())
        if common_prefix(state.tokens, prefix) == state.n_tokens:
            return state
    return None


def run_rows(engine, plan: RunPlan, task: TaskState | None = None) -> RunOutcome:
    """Run each row of the plan on its paths; each row's RowStarted and RunRecord go out as
    partial results as they happen."""
    task = task or TaskState()
    o = plan.options
    records = []
    # the snapshot Save writes: the session's state as it is, known from the plan before the
    # runs, or else the static prefix, primed after them
    snapshot = plan.snapshot and plan.paths != "cold"
    state = session_state_kept(engine, plan.template, plan.state) if snapshot else None
    # several rows known: chain cuts a batch only where another of them can reuse the segment
    # (batch_policy.chain_marks); a single row cuts at every segment, for later runs
    reusable = [None] * len(plan.rows)
    if len(plan.rows) > 1 and o.reuse_mode == "chain" and plan.paths != "cold":
        reusable = job_reusable_depths(engine, plan.template, [r.values for r in plan.rows])
    task.begin_job("run", len(plan.rows))
    for i, row in enumerate(plan.rows):
        task.check()
        task.begin_item(i + 1, len(plan.rows), number=row.number,
                        part=o.reuse_mode if plan.paths != "cold" else "")
        task.partial(RowStarted(row.number))
        rep = run_prompt(engine, plan.template, row.values, reuse=o.reuse_mode,
                         state=plan.restore, recompute=o.recompute, cold=plan.paths != "warm",
                         warm=plan.paths != "cold", oneshot=plan.oneshot, gen=o.generation(),
                         task=task, reusable=reusable[i])
        records.append(RunRecord(row.number, rep))
        engine.note_run(rep.warm)  # runs far off the kernel measurement make it measure again
        task.end_item()
        task.partial(records[-1])
    if snapshot and state is None:
        state = engine.prime(plan.template, task=task)
    return RunOutcome(tuple(records), state)


def verify(engine, plan: VerifyPlan, task: TaskState | None = None) -> RunRecord:
    """The plan's run with its cold run made now (or a kept one) and its verdict
    (late_verify.py): a new record for the same row."""
    task = task or TaskState()
    task.begin_job("verify", 1)
    task.begin_item(1, 1, number=plan.record.row)
    rep = verify_later(engine, plan.record.report, task, plan.oneshot)
    task.end_item()
    return RunRecord(plan.record.row, rep)


def bench(engine, plan: BenchPlan, task: TaskState | None = None) -> BenchOutcome:
    """Benchmark the plan's rows cold against warm in each reuse mode (bench_rows.py); the
    result so far goes out as a partial result after each row. Cancelled, it returns the rows
    finished (``result.cancelled``)."""
    o = plan.options
    result = bench_rows(engine, plan.template, list(plan.rows), repeat=o.repeat,
                        modes=o.bench_modes, recompute=o.recompute, state=plan.restore,
                        gen=o.generation(), task=task, noise=o.measure_noise)
    # a cancelled benchmark comes back with the rows it finished, and nothing more is done
    state = (state_to_save(engine, plan.template, plan.state, task)
             if plan.snapshot and not result.cancelled else None)
    return BenchOutcome(result, state)


def sweep(engine, template: Template, values: dict[str, str],
          task: TaskState | None = None) -> list[SweepPoint]:
    """Time to first token as the static prefix grows (prefix_sweep.py)."""
    return prefix_sweep(engine, template, values, task=task)
