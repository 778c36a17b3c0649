"""How right the benchmark's "time left" is: `kvprimer bench` run under a pseudo-terminal (so
its progress line is on), each line timestamped, its "… left" read back and compared with the
time the job really had left at 25%, 50% and 75% of its elapsed time.

    python -m bench.eta_probe                        4 rows of rag-rows.csv, prefix,chain,compose
    python -m bench.eta_probe --rows 10 -n 8 --repeat 1 --reuse prefix,chain,compose
    python -m bench.eta_probe --rows 4 --json out.json   also write the lines and the plan
    python -m bench.eta_probe --rows 10 --busy 60:150    a busy process from 60 s to 150 s

The job runs from its first progress line ("0 of N rows") to its last ("N of N rows"). The
estimate at a mark is the last one shown at or before it ("… in this pass" lines, a pass's own
time, are left out). The child also keeps the job's plan (bench_passes.plan_bench) and, per
step, the passes it planned against those it ran and the time the plan gave the step when it
began against its wall time, so a mismatch shows pass by pass, with the share of the cores the
plan was told were free over the step and when it began, and the batch threads then.
``--busy START:END`` plays another program: busy-loop processes (``--busy-procs``, one by
default) from START to END seconds after the job's first progress line. The machine's load
average is printed before and after: on a shared machine the error within one run still
means something under steady load, not a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "resources" / "examples"
MARKS = (0.25, 0.5, 0.75)
_LEFT = re.compile(r"((?:\d+ h \d+ min)|(?:\d+ min \d+ s)|(?:\d+ s)|(?:<1 s)) left(?! in this)")
_JOB = re.compile(r"^bench: ")  # a progress line of the benchmark job (progress_line)
_DONE = re.compile(r"\b(\d+) of (\d+) rows\b")


def seconds_of(text: str) -> float:
    """duration_text's words back to seconds: "<1 s", "45 s", "3 min 10 s", "1 h 05 min"."""
    if text.startswith("<"):
        return 0.5
    nums = [int(x) for x in re.findall(r"\d+", text)]
    if " h " in text:
        return nums[0] * 3600 + nums[1] * 60
    if "min" in text:
        return nums[0] * 60 + nums[1]
    return float(nums[0])


class BusySpell:
    """Busy-loop processes from ``start`` to ``end`` seconds after the job's first progress
    line (``tick`` is called with every line and every half second)."""

    def __init__(self, start: float, end: float, procs: int = 1):
        self.start, self.end, self.n = start, end, procs
        self.t0: float | None = None
        self.procs: list[subprocess.Popen] = []
        self.began: float | None = None
        self.ended: float | None = None

    def tick(self, now: float, line: str = "") -> None:
        if self.t0 is None:
            if not _JOB.search(line):
                return
            self.t0 = now
        t = now - self.t0
        if self.began is None and t >= self.start:
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                          for _ in range(self.n)]
            self.began = t
        elif self.began is not None and self.ended is None and t >= self.end:
            self.stop()
            self.ended = t

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def run_under_pty(argv: list[str], env: dict, cwd, tick=None) -> tuple[list[tuple[float, str]], int]:
    """Run ``argv`` with its stdout and stderr on a pty; every line (ended by \\r or \\n) with
    the time it arrived, and the exit code. ``tick(now, line)``: called with every line, and
    with "" every half second."""
    tick = tick or (lambda now, line="": None)
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=env, cwd=cwd, close_fds=True)
    os.close(slave)
    lines, buf = [], ""
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536).decode("utf-8", "replace")
            except OSError:  # the child closed the pty
                chunk = ""
            if not chunk and proc.poll() is not None:
                break
            now = time.monotonic()
            buf += chunk
            *done, buf = re.split(r"[\r\n]", buf)
            for x in done:
                if x.strip():
                    lines.append((now, x.strip()))
                    tick(now, x)
        elif proc.poll() is not None:
            break
        tick(time.monotonic(), "")
    if buf.strip():
        lines.append((time.monotonic(), buf.strip()))
    os.close(master)
    return lines, proc.wait()


def errors(lines: list[tuple[float, str]]) -> dict:
    """The job's span and, at each mark, the estimate shown against the real time left."""
    job = [(t, x) for t, x in lines if _JOB.search(x)]
    if not job:
        raise SystemExit("no progress line with the job in it: was the bench run on a pty?")
    t0 = job[0][0]
    ends = [t for t, x in job if (m := _DONE.search(x)) and m.group(1) == m.group(2)]
    t1 = ends[-1] if ends else job[-1][0]
    total = t1 - t0
    shown = [(t, seconds_of(m.group(1))) for t, x in job if (m := _LEFT.search(x))]
    out = {"total_s": total, "marks": []}
    for mark in MARKS:
        at = t0 + mark * total
        before = [(t, e) for t, e in shown if t <= at]
        if not before:
            out["marks"].append({"mark": mark, "estimate_s": None})
            continue
        t, est = before[-1]
        real = t1 - t  # what was left when the line shown at the mark was written
        out["marks"].append({"mark": mark, "estimate_s": est, "real_s": real,
                             "error": (est - real) / real if real > 0 else None,
                             "shown_at_s": t - t0})
    return out


# ---- the child: the CLI itself, with the job's plan kept --------------------------------------

def child(dump: str, cli_args: list[str], tree: str) -> int:
    """Run `kvprimer` with ``cli_args`` in this process, from the checkout ``tree``, keeping the
    benchmark's plan: at exit its steps, planned and run, go to ``dump`` as JSON."""
    sys.path.insert(0, tree)
    from app.cli import main
    from app.engine import session_flows
    from app.engine.benchmarks import bench_rows as bench_module
    from app.engine.llama.thread_fit import shared_fit
    from app.engine.progress_plan import JobPlan

    kept: list = []
    predicted: dict[int, float | None] = {}
    loads: dict[int, dict] = {}  # per step: what the plan was told of the cores free
    results: list = []
    real_plan, real_begin, real_end = bench_module.plan_bench, JobPlan.begin, JobPlan.end
    real_bench = session_flows.bench_rows

    def keep(*args, **kwargs):
        plan, start = real_plan(*args, **kwargs)
        kept.append(plan)
        return plan, start

    def begin(self, now):
        real_begin(self, now)
        if self._next < len(self.steps):  # what the plan gives the step as it starts
            predicted[self._next] = self.step_seconds(self.steps[self._next])
            loads[self._next] = {"free_begin": self._free_now,
                                 "batch_threads": shared_fit().threads()}

    def end(self, now, passes):
        if self._next < len(self.steps):
            loads.setdefault(self._next, {})["free_step"] = self._free_step
        real_end(self, now, passes)

    def bench(*args, **kwargs):
        results.append(real_bench(*args, **kwargs))
        return results[-1]

    bench_module.plan_bench = keep
    session_flows.bench_rows = bench  # (the flow holds the function by name)
    JobPlan.begin, JobPlan.end = begin, end
    try:
        return main(cli_args)
    finally:
        if kept:
            d = plan_dump(kept[0], predicted, loads)
            if results:
                d["rows"] = [{k: getattr(r, k) for k in ("row", "reuse", "warm_runs_ms",
                                                        "reused_tokens", "equivalence",
                                                        "vs_prefix", "load", "remeasured")}
                             | ({"copied": r.breakdown.copied_tokens,
                                 "restore_ms": r.breakdown.restore_ms,
                                 "evaluate_ms": r.breakdown.evaluate_ms,
                                 "batches": r.breakdown.batches} if r.breakdown else {})
                             for r in results[0].rows]
            Path(dump).write_text(json.dumps(d))


def plan_dump(plan, predicted: dict, loads: dict | None = None) -> dict:
    def passes(xs):
        return [{k: getattr(p, k) for k in ("kind", "start", "end", "generate", "prefill_s",
                                            "generate_s") if hasattr(p, k)} for p in xs or []]
    return {"k": plan.k, "prefill_prior": plan.prefill_prior,
            "rates": {k: plan.prefill_rate(k) for k in ("prime", "warm", "cold", "oneshot",
                                                       "module")},
            "gen_rate": plan.gen_rate(), "overhead": plan.overhead(),
            "steps": [{"label": s.label, "planned": passes(s.passes), "ran": passes(s.done),
                       "wall_s": s.wall_s, "predicted_s": predicted.get(i),
                       **(loads or {}).get(i, {})}
                      for i, s in enumerate(plan.steps)]}


def print_plan(d: dict) -> None:
    """Per step: the kinds planned against those run, the time planned against the wall, and
    the cores free the plan was told of (when the step began, over the step) and the batch
    threads when it began."""
    print(f"{'step':<22} {'planned':<34} {'ran':<34} {'plan s':>7} {'wall s':>7} "
          f"{'free0':>5} {'free':>5} {'thr':>3}")
    planned_n, ran_n = {}, {}
    for s in d["steps"]:
        a = sorted(p["kind"] for p in s["planned"])
        b = sorted(p["kind"] for p in s["ran"])
        for k in a:
            planned_n[k] = planned_n.get(k, 0) + 1
        for k in b:
            ran_n[k] = ran_n.get(k, 0) + 1
        flag = "" if a == b else "  <-"
        pred = "-" if s["predicted_s"] is None else f"{s['predicted_s']:.1f}"
        free0, free, thr = (s.get("free_begin"), s.get("free_step"), s.get("batch_threads"))
        print(f"{s['label']:<22} {','.join(a):<34} {','.join(b):<34} {pred:>7} "
              f"{s['wall_s']:>7.1f} {_num(free0):>5} {_num(free):>5} {_num(thr, '.0f'):>3}{flag}")
    kinds = sorted(set(planned_n) | set(ran_n))
    print("passes planned/ran: " + ", ".join(f"{k} {planned_n.get(k, 0)}/{ran_n.get(k, 0)}"
                                             for k in kinds))


def print_rows(rows: list[dict]) -> None:
    """Per row: each mode's warm time (ms) side by side, chain and compose against prefix, and
    each mode's tokens copied into the work context and the time that took (ms)."""
    modes = list(dict.fromkeys(r["reuse"] for r in rows))
    by = {(r["row"], r["reuse"]): r for r in rows}
    print("row  " + " ".join(f"{m:>9}" for m in modes) + "  " +
          " ".join(f"{m + '/prefix':>15}" for m in modes if m != "prefix") + "  load  again  "
          + " ".join(f"{m + ' copy':>16}" for m in modes))
    for n in sorted({r["row"] for r in rows}):
        got = [by.get((n, m)) for m in modes]
        warm = [f"{r['warm_runs_ms'][0]:>9.1f}" if r and r["warm_runs_ms"] else f"{'-':>9}"
                for r in got]
        vs = [f"{_num(r and r['vs_prefix'], '.3f'):>15}" for r, m in zip(got, modes)
              if m != "prefix"]
        load = max((r["load"] or 0.0) for r in got if r)
        again = max(r["remeasured"] for r in got if r)
        copy = [f"{r.get('copied', 0):>6} {r.get('restore_ms', 0.0):>7.1f} ms" if r else f"{'-':>16}"
                for r in got]
        print(f"{n:<4} " + " ".join(warm) + "  " + " ".join(vs) + f"  {load:.2f}  {again:>5}  "
              + " ".join(copy))


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eta_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4, help="first rows of rag-rows.csv (4)")
    ap.add_argument("--reuse", default="prefix,chain,compose")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("-n", type=int, default=8, help="tokens generated (8)")
    ap.add_argument("--json", help="write the lines, the errors and the plan here")
    ap.add_argument("--tree", default=str(ROOT),
                    help="the checkout whose kvprimer runs (this one; another to compare)")
    ap.add_argument("--busy", metavar="START:END",
                    help="busy-loop processes from START to END s into the job")
    ap.add_argument("--busy-procs", type=int, default=1, help="busy processes (1)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("cli", nargs="*", help="more `kvprimer bench` options, after --")
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, a.cli, a.tree)
    src = (EXAMPLES / "rag-rows.csv").read_text().splitlines(keepends=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp, "rows.csv")
        rows.write_text("".join(src[:a.rows + 1]))
        dump = Path(tmp, "plan.json")
        cli = ["bench", str(EXAMPLES / "rag.tmpl"), "--rows", str(rows), "--reuse", a.reuse,
               "--repeat", str(a.repeat), "-n", str(a.n), *a.cli]
        load0 = os.getloadavg()
        env = {**os.environ, "COLUMNS": "400"}
        spell = None
        if a.busy:
            start, end = (float(x) for x in a.busy.split(":"))
            spell = BusySpell(start, end, a.busy_procs)
        # run as a file, so that ``app`` comes from ``--tree`` alone
        try:
            lines, code = run_under_pty([sys.executable, __file__, "--child", str(dump),
                                         "--tree", a.tree, "--", *cli], env, a.tree,
                                        spell.tick if spell else None)
        finally:
            if spell is not None:
                spell.stop()
        load1 = os.getloadavg()
        plan = json.loads(dump.read_text()) if dump.exists() else None
    if code != 0 and code != 1:
        print("\n".join(x for _t, x in lines[-20:]))
        print(f"kvprimer bench exited with {code}")
    res = errors(lines)
    print(f"kvprimer {' '.join(cli)}")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; job {res['total_s']:.0f} s")
    if spell is not None:
        print(f"busy spell: {spell.n} process{'es' if spell.n > 1 else ''} from "
              f"{_num(spell.began, '.0f')} s to {_num(spell.ended, '.0f')} s into the job")
    for m in res["marks"]:
        if m["estimate_s"] is None:
            print(f"{m['mark']:.0%}: no estimate shown yet")
            continue
        print(f"{m['mark']:.0%}: shown {m['estimate_s']:.0f} s left, real {m['real_s']:.0f} s: "
              f"{m['error']:+.0%}")
    if plan is not None:
        print_plan(plan)
        print_rows(plan.get("rows") or [])
    # the CLI's own summary: its lines after the job's progress
    print("\n".join(x for _t, x in lines if not _JOB.search(x) and not x.startswith("kvprimer")
                    and ("×" in x or "bit-identical" in x or "re-measured" in x
                         or "under load" in x)))
    if a.json:
        Path(a.json).write_text(json.dumps({"cli": cli, "load": [load0, load1], **res,
                                            "lines": lines, "plan": plan}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
