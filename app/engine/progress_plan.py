"""The time a job of many passes has left, from a plan of every pass made before it starts.

A benchmark runs hundreds of passes of very different cost: a cold run evaluates the whole
prompt, a warm run only what the cache lacks, a noise run the whole prompt again, a module its
segment, and each generates a few tokens. Timing the rows finished and multiplying by the rows
left goes wrong as soon as rows differ (the first mode pays the cold runs the others share, a
composed row pays its modules and its noise run). So the job says up front what it will run:
``PlanStep``s in the order they run, each a list of ``PlannedPass``es with the positions it
evaluates and the tokens it generates. As steps finish, each reports the passes it really ran
with their measured times (``DonePass``), and the plan learns:

- the machine's speed now, and each kind's cost against it. A pass's seconds per unit of
  prefill work (a token costs 1 unit plus ``k`` per position it attends to: attention grows
  with the context) is the machine's level times the kind's ratio. The ratios come from every
  step so far, each kind compared with the others in the same step (so a load that drifts
  does not bias them); the level is the median of the last ``LEVEL_STEPS`` steps' speeds at
  those ratios, so it follows the machine as its load drifts, and one slow step (the first,
  which opens contexts and pages the weights in, or a busy spell's) is outvoted. Speeds
  remembered per kind with a slow decay counted a slow start long after it ended (a job
  whose first minute ran at 0.55x was told a quarter too much at 25%), and a kind measured
  once in three steps (the noise run) kept a stale speed. Before any step, the prior the job
  gave (its prime, or the kernel measurement);
- seconds per generated token, the same way (the median of the last steps');
- the cores the job had: other programs' use of the cores during each step (machine_load.py)
  scales its speeds to a quiet machine's (a step run with half the cores free took twice as
  long), and the passes left are timed with the cores free now, the latest reading: after a
  busy spell the level does not wait for the slow steps to leave the median, and it drops as
  soon as a spell starts. Without readings every step counts as quiet;
- per kind, how much of the planned work really ran (the plan foresees every pass, so it
  stays near 1; it absorbs what a plan cannot know, a kept run dropped for room, say);
- the step's time outside its passes (tokenizing, forking cells, the verdict), per part
  (reuse mode), recent steps weighing more.

The time left is the steps not begun at those rates, plus what the running step has left: its
passes after the one running in full, the running one from its own batches (task_state.py's
fit).
The plan has no clock of its own: the caller (task_state.py) passes ``now``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# each finished step's time outside its passes weighs this much less than the next's
MEMORY = 0.9
# the machine's level (and the generation speed) is the median of this many last steps': it
# follows a drift within a few steps, and one odd step does not move it
LEVEL_STEPS = 5

# the order of a step's passes (a benchmark's call): a pass reported means those before it ended;
# "remeasure": a warm run made again after the step's passes (its pair saw the load change)
PASS_ORDER = ("prime", "module", "warm", "cold", "oneshot", "remeasure")
# a kind costing what another costs: a warm run made again is a warm run
RATIO_OF = {"remeasure": "warm"}

# a decode of one token reads every weight, as a batch does for many tokens: until one is
# measured, a generated token is taken to cost this many prefill units
GEN_UNITS_GUESS = 3.0


def work_units(start: int, end: int, k: float) -> float:
    """Evaluating positions start..end-1: each token costs 1, plus ``k`` per position before it."""
    return max(end - start, 0) + k * max(end * end - start * start, 0) / 2


@dataclass(frozen=True)
class PlannedPass:
    kind: str  # "prime", "warm", "cold", "oneshot", "module"
    start: int  # the first position it evaluates
    end: int  # one past the last
    generate: int = 0  # tokens generated after


@dataclass(frozen=True)
class DonePass:
    """A pass as it ran: its positions and its measured prefill and generation seconds."""
    kind: str
    start: int
    end: int
    generate: int
    prefill_s: float
    generate_s: float = 0.0


@dataclass
class PlanStep:
    """One call of the job (a row in one mode, say), with the passes it is expected to run."""
    label: str
    passes: list[PlannedPass]
    done: list[DonePass] | None = None  # set when it finished
    wall_s: float = 0.0
    skipped: bool = False  # dropped before it ran (its row failed)
    part: str = ""  # the kind of call (a reuse mode): its time outside the passes is its own


class JobPlan:
    """Steps run in order: ``begin(now)`` before each, ``end(now, passes)`` after, ``skip(i)``
    for a step that will not run. ``prefill_prior``: seconds per prefill unit before any pass is
    measured (None: no time left until the first step finishes)."""

    def __init__(self, steps: list[PlanStep], k: float = 0.0,
                 prefill_prior: float | None = None, gen_prior: float | None = None,
                 memory: float = MEMORY):
        self.steps = steps
        self.memory = memory
        self.k = k
        self.prefill_prior = prefill_prior
        self.gen_prior = gen_prior
        self._next = 0  # the step that runs next (or is running)
        self._started: float | None = None  # when the running step began
        self._measured: list[list[tuple[str, float, float]]] = []  # per step: kind, units, s
        self._gen_rates: list[float] = []  # per step that generated: seconds per token
        self._ratio: dict[str, float] = {}  # each kind's cost against the level
        self._level: float | None = None  # seconds per unit at ratio 1, now
        self._planned_units: dict[str, float] = {}  # in finished steps, per kind
        self._run_units: dict[str, float] = {}
        self._overheads: list[tuple[str, float]] = []  # (part, seconds)
        self._first_start: float | None = None
        self._shown = 0.0  # the largest share said so far
        self._pass: tuple | None = None  # the running pass: kind, done, total, its time left
        self._free_step = 1.0  # the share of the cores free during the running step
        self._free_now = 1.0  # ... in the latest reading
        self._remeasuring = False  # the running step is making warm runs again
        self._re_begun = 0  # ... and has begun this many of them

    # ---- the job's side
    def begin(self, now: float) -> None:
        while self._next < len(self.steps) and self.steps[self._next].skipped:
            self._next += 1
        self._started = now
        self._pass = None
        self._free_step, self._remeasuring, self._re_begun = self._free_now, False, 0
        if self._first_start is None:
            self._first_start = now

    def end(self, now: float, passes: list[DonePass]) -> None:
        """The running step finished, having run ``passes``."""
        if self._next >= len(self.steps) or self._started is None:
            return
        step = self.steps[self._next]
        step.done, step.wall_s = list(passes), now - self._started
        for p in step.passes:
            self._planned_units[p.kind] = (self._planned_units.get(p.kind, 0.0)
                                           + self._units(p.start, p.end))
        inside = 0.0
        planned = {p.kind for p in step.passes}
        measured, gen_s, gen_n = [], 0.0, 0
        free = self._free_step  # seconds here are seconds times this on a quiet machine
        for d in passes:
            u = self._units(d.start, d.end)
            self._run_units[d.kind] = self._run_units.get(d.kind, 0.0) + u
            if u > 0 and d.prefill_s > 0:
                measured.append((RATIO_OF.get(d.kind, d.kind), u, d.prefill_s * free))
            gen_s, gen_n = gen_s + d.generate_s * free, gen_n + d.generate
            if d.kind in planned:  # a kind not foreseen here counts with the step's rest
                inside += d.prefill_s + d.generate_s
        if measured:
            self._measured.append(measured)
            self._fit()
        if gen_n > 0:
            self._gen_rates.append(gen_s / gen_n)
        self._overheads.append((step.part, max(step.wall_s - inside, 0.0)))
        self._next += 1
        self._started = None

    def in_pass(self, kind: str, done: int, total: int, left_s: float | None) -> None:
        """The running step reports a pass of ``kind`` (its own time left, from its batches,
        when known): the passes before it in the step are over."""
        if kind in PASS_ORDER and self._started is not None:
            if self._remeasuring:  # every pass now is part of the runs made again
                if kind == "warm" and done == 0:
                    self._re_begun += 1
                kind, left_s = "remeasure", None
            self._pass = (kind, done, total, left_s)

    def note_load(self, step: float | None = None, now: float | None = None) -> None:
        """Readings of the share of the cores other programs left free (1: quiet): over the
        running step so far (``step``), and lately (``now``), which times the passes left."""
        if step is not None:
            self._free_step = step
        if now is not None:
            self._free_now = now

    def extend(self, passes: list[PlannedPass]) -> None:
        """The running step runs ``passes`` more (a pair measured again): counted from now."""
        if self._next < len(self.steps) and self._started is not None:
            self.steps[self._next].passes.extend(passes)
            self._remeasuring = True
            self._pass = None

    def skip(self, index: int) -> None:
        """Step ``index`` will not run (its row failed in an earlier step)."""
        if index >= self._next:
            self.steps[index].skipped = True

    # ---- the rates learned
    def _units(self, start: int, end: int) -> float:
        return work_units(start, end, self.k)

    def units(self, p: PlannedPass | DonePass) -> float:
        """A pass's prefill work (at least one unit)."""
        return max(self._units(p.start, p.end), 1.0)

    def _fit(self, rounds: int = 4) -> None:
        """The kinds' ratios and the level from the steps measured (see the module docstring):
        a few rounds of each kind's seconds against its units at its steps' own speeds."""
        ratio: dict[str, float] = dict(self._ratio)
        speeds: list[float] = []
        for _ in range(rounds):
            speeds = [sum(x for _k, _u, x in m) / sum(u * ratio.get(k, 1.0) for k, u, _x in m)
                      for m in self._measured]
            seconds: dict[str, float] = {}
            expected: dict[str, float] = {}
            for m, v in zip(self._measured, speeds):
                for k, u, x in m:
                    seconds[k] = seconds.get(k, 0.0) + x
                    expected[k] = expected.get(k, 0.0) + u * v
            ratio = {k: seconds[k] / expected[k] for k in seconds if expected[k] > 0}
            # the kind with the most work is the yardstick: ratios stay near 1
            ref = ratio.get(max(expected, key=expected.get), 1.0)
            ratio = {k: r / ref for k, r in ratio.items()}
        self._ratio = ratio
        speeds = [sum(x for _k, _u, x in m) / sum(u * ratio.get(k, 1.0) for k, u, _x in m)
                  for m in self._measured]
        self._level = _median(speeds[-LEVEL_STEPS:])

    def prefill_rate(self, kind: str) -> float | None:
        """Seconds per prefill unit of ``kind``: the machine's level now times the kind's
        ratio (1 for a kind not measured yet), else the prior."""
        if self._level is None:
            return self.prefill_prior
        ratio = self._ratio.get(kind, self._ratio.get(RATIO_OF.get(kind, kind), 1.0))
        return self._level * ratio / self._free_now

    def gen_rate(self) -> float | None:
        if self._gen_rates:
            return _median(self._gen_rates[-LEVEL_STEPS:]) / self._free_now
        if self.gen_prior is not None:
            return self.gen_prior
        p = self.prefill_rate("warm")
        return None if p is None else p * GEN_UNITS_GUESS

    def ran_share(self, kind: str) -> float:
        """The work of ``kind`` that really ran, against what was planned, in the steps done."""
        planned = self._planned_units.get(kind, 0.0)
        return self._run_units.get(kind, 0.0) / planned if planned > 0 else 1.0

    def overhead(self, part: str | None = None) -> float:
        """A step's time outside its passes: the recent steps' of its ``part`` (a composed
        call places modules and recomputes, a chain call stores nodes), else of any."""
        got = [x for p, x in self._overheads if p == part] or [x for _p, x in self._overheads]
        if not got:
            return 0.0
        w = [self.memory ** age for age in range(len(got) - 1, -1, -1)]
        return sum(x * y for x, y in zip(w, got)) / sum(w)

    # ---- the estimates
    def step_seconds(self, step: PlanStep) -> float | None:
        """What ``step`` should take at the rates learned so far (None: nothing to go on)."""
        total = self.overhead(step.part)
        gen = self.gen_rate()
        for p in step.passes:
            rate = self.prefill_rate(p.kind)
            if rate is None or gen is None:
                return None
            share = self.ran_share(p.kind)
            total += share * (rate * self._units(p.start, p.end) + p.generate * gen)
        return total

    def _pass_seconds(self, p: PlannedPass) -> float | None:
        rate, gen = self.prefill_rate(p.kind), self.gen_rate()
        if rate is None or gen is None:
            return None
        return self.ran_share(p.kind) * (rate * self._units(p.start, p.end) + p.generate * gen)

    def _running_left(self, step: PlanStep, now: float) -> float | None:
        """What the running step has left: by its passes once one reports (the passes after
        it in full, the running one from its own batches), else its estimate less its time."""
        if self._pass is None:
            est = self.step_seconds(step)
            return None if est is None else max(est - (now - self._started), 0.0)
        kind, done, total, left_s = self._pass
        at = PASS_ORDER.index(kind)
        left = self.overhead(step.part) / 2  # the step's own work is partly still to come
        seen = 0  # the runs made again: those begun before the running one are over
        for p in step.passes:
            est = self._pass_seconds(p)
            if est is None:
                return None
            if p.kind == kind == "remeasure":
                seen += 1
                if seen < self._re_begun:
                    continue
                if seen > self._re_begun:
                    left += est
                    continue
            if p.kind not in PASS_ORDER or PASS_ORDER.index(p.kind) > at:
                left += est
            elif p.kind == kind:
                gen = p.generate * self.gen_rate()
                prefill = est - gen if left_s is None else left_s
                if left_s is None and total > 0:
                    prefill *= max(total - done, 0) / total
                left += max(prefill, 0.0) + gen
        return left

    def time_left(self, now: float) -> float | None:
        """The steps not begun, plus what the running one has left (at least nothing)."""
        left = 0.0
        for i in range(self._next, len(self.steps)):
            step = self.steps[i]
            if step.skipped:
                continue
            if i == self._next and self._started is not None:
                est = self._running_left(step, now)
            else:
                est = self.step_seconds(step)
            if est is None:
                return None
            left += est
        return left

    def fraction(self, now: float) -> float | None:
        """The share of the job done, by time: elapsed against elapsed plus time left; never
        less than it said before (a bar does not move back when an estimate grows)."""
        left = self.time_left(now)
        if left is None or self._first_start is None:
            return None
        elapsed = now - self._first_start
        share = elapsed / (elapsed + left) if elapsed + left > 0 else 1.0
        self._shown = max(self._shown, share)
        return self._shown

    @property
    def finished(self) -> int:
        return sum(1 for s in self.steps if s.done is not None)

    def pass_kinds(self) -> list[list[str]]:
        """Per step, the kinds of its planned passes (sorted): what the plan counts."""
        return [sorted(p.kind for p in s.passes) for s in self.steps]

    def run_kinds(self) -> list[list[str] | None]:
        """Per step, the kinds of the passes it ran (None: it did not run)."""
        return [None if s.done is None else sorted(d.kind for d in s.done) for s in self.steps]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


@dataclass
class StepPasses:
    """Collects the passes a step ran, for ``JobPlan.end``."""
    passes: list[DonePass] = field(default_factory=list)

    def add(self, kind: str, start: int, end: int, generate: int, prefill_ms: float,
            generate_ms: float = 0.0) -> None:
        self.passes.append(DonePass(kind, start, end, generate, prefill_ms / 1000,
                                    generate_ms / 1000))
