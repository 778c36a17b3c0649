"""The whole job in view: a job of rows says which row of how many, in which mode, and how long
the whole has left, besides the current pass; the same words on the CLI's line and in the
window's status bar (tests/ui/test_ui_keepwork.py). Cancel keeps the rows finished."""
from __future__ import annotations

import io
import sys

import pytest

from app.cli import main
from app.engine import GenerationConfig, Template, bench_rows
from app.engine import session_flows as flows
from app.engine.prompts.rows import Row
from app.engine.session import Options
from app.engine.task_state import JobStep, Progress, TaskState, duration_text, progress_line
from app.cli.engine_options import progress_printer

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
ROWS = [Row(i + 1, {"c": f"the world is question {i}", "q": "why?"}) for i in range(3)]
GEN = GenerationConfig(max_tokens=2)


def test_time_left_comes_from_the_finished_items_of_the_current_part(clock):
    seen: list[Progress] = []
    task = TaskState(on_progress=seen.append)
    task.begin_job("bench", 4)
    assert seen[-1].job.eta_s is None and seen[-1].job.done == 0
    for k, seconds in ((1, 10.0), (2, 30.0)):  # prefix rows: 10 s and 30 s
        task.begin_item(k, 2, part="prefix")
        clock.now += seconds
        task.end_item()
    assert seen[-1].job.done == 2 and seen[-1].job.eta_s == pytest.approx(2 * 20.0)
    task.begin_item(1, 2, part="chain")
    clock.now += 5
    task.report("warm", 10, 40)
    p = seen[-1]
    assert p.stage == "warm" and not p.whole and p.job.text() == "row 1 of 2 · chain"
    assert p.job.eta_s == pytest.approx(2 * 20.0 - 5)  # no chain row finished: the mean of all
    task.end_item()
    task.begin_item(2, 2, part="chain")
    # one chain row finished (5 s): the chain rows left are timed by it
    assert seen[-1].job.eta_s == pytest.approx(5.0)
    clock.now += 60  # slower than the mean: the running row still counts as one
    task.report("cold", 1, 2)
    assert seen[-1].job.eta_s == pytest.approx(0.0)


def test_the_line_names_the_row_the_mode_the_pass_and_the_time_left():
    step = JobStep("bench", "row", 7, 10, 7, "chain", 16, 20, 600.0, 190.0)
    p = Progress("warm", 1280, 1836, 5.0, step)
    assert progress_line("benchmark", p) == ("benchmark: row 7 of 10 · chain · warm 1,280/1,836"
                                             " · 256 tok/s · 3 min 10 s left")
    # a report about the whole job names no pass
    whole = Progress("bench", 16, 20, 600.0, step)
    assert progress_line("", whole) == "bench: row 7 of 10 · chain · 3 min 10 s left"
    # rows chosen out of others keep their own numbers
    picked = JobStep("run", "row", 2, 3, 5, "", 1, 3, 1.0, None)
    assert picked.text() == "row 5 (2 of 3)"
    # a job of no items: the pass alone, as before
    assert progress_line("prime", Progress("prime", 10, 40, 1.0)) == \
        "prime: prime 10/40 · 10 tok/s · 3 s left"
    assert [duration_text(s) for s in (0.4, 45, 190, 3900)] == ["<1 s", "45 s", "3 min 10 s",
                                                                "1 h 05 min"]


def test_a_bench_of_three_rows_says_which_row_of_three_in_every_pass(engine):
    seen: list[Progress] = []
    res = bench_rows(engine, TPL, ROWS, modes=("prefix", "chain"), gen=GEN,
                     task=TaskState(on_progress=seen.append))
    assert not res.cancelled and len(res.rows) == 6
    passes = [p for p in seen if p.job is not None and not p.whole]
    named = {(p.stage, p.job.text()) for p in passes}
    for mode in ("prefix", "chain"):
        for k in (1, 2, 3):
            assert ("warm", f"row {k} of 3 · {mode}") in named, sorted(named)
    assert ("cold", "row 1 of 3 · prefix") in named
    last = seen[-1]
    assert last.whole and (last.job.done, last.job.total) == (6, 6)
    # the time left is known once the prime has given a speed (the benchmark's plan), and
    # from then on, with the share done rising to the end
    primed = [p for p in passes if p.stage != "prime"]
    assert primed and all(p.job.eta_s is not None for p in primed)
    shares = [p.fraction for p in seen if p.whole and p.job.share is not None]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)


def test_cancel_keeps_the_finished_rows(engine):
    def cancel_after_two(p: Progress) -> None:
        if p.whole and p.job.done == 2:
            task.cancel()

    task = TaskState(on_progress=cancel_after_two)
    plan = flows.bench_plan(TPL, ROWS, Options(max_tokens=2, repeat=1, bench_modes=("prefix",)))
    outcome = flows.bench(engine, plan, task)  # not an exception: the rows so far come back
    res = outcome.result
    assert res.cancelled and [r.row for r in res.rows] == [1, 2]
    assert all(r.error is None and r.warm_ms > 0 for r in res.rows)
    assert outcome.state is None  # nothing more was done after the cancel
    assert "cancelled before every row ran" in res.mode_lines()[-1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cli_progress_line_names_row_k_of_n(engine, tiny_model, tmp_path, monkeypatch,
                                                capsys):
    out = Terminal()
    flows.run_rows(engine, flows.run_plan(TPL, ROWS[:2], Options(max_tokens=2), snapshot=False),
                   progress_printer(out))
    text = out.getvalue()
    assert "run: row 1 of 2 · chain · cold" in text and "row 2 of 2 · chain · warm" in text
    assert text.endswith("\n") and text.count("\n") == 1  # one rewritten line, ended once

    # the command itself, on a terminal
    (tmp_path / "t.tmpl").write_text(TPL.source, encoding="utf-8")
    (tmp_path / "rows.csv").write_text("c,q\nthe world,why?\nhello,how?\nanswer,what?\n",
                                       encoding="utf-8")
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    rc = main(["bench", str(tmp_path / "t.tmpl"), "-m", str(tiny_model), "-t", "1", "-c", "1024",
               "-b", "32", "--rows", str(tmp_path / "rows.csv"), "--max-tokens", "2",
               "--reuse", "prefix", "--repeat", "1"])
    assert rc == 0, capsys.readouterr()
    line = err.getvalue()
    # CSV rows keep their line numbers: row 3 of the file is the second of three
    for k, number in ((1, 2), (2, 3), (3, 4)):
        assert f"bench: row {number} ({k} of 3) · prefix · warm" in line, line
    assert "left" in line


def test_ctrl_c_stops_a_cli_benchmark_with_the_rows_it_finished(tiny_model, tmp_path,
                                                                monkeypatch, capsys):
    import json
    import signal

    from app.cli import run_commands

    def interrupted_after_one_row(stream=None):
        sent = []

        def on_progress(p: Progress) -> None:
            if p.whole and p.job.done == 1 and not sent:
                sent.append(p)
                signal.raise_signal(signal.SIGINT)  # as the terminal sends it, once

        return TaskState(on_progress=on_progress)

    monkeypatch.setattr(run_commands, "progress_printer", interrupted_after_one_row)
    (tmp_path / "t.tmpl").write_text(TPL.source, encoding="utf-8")
    (tmp_path / "rows.csv").write_text("c,q\nthe world,why?\nhello,how?\nanswer,what?\n",
                                       encoding="utf-8")
    before = signal.getsignal(signal.SIGINT)
    rc = main(["bench", str(tmp_path / "t.tmpl"), "-m", str(tiny_model), "-t", "1", "-c", "1024",
               "-b", "32", "--rows", str(tmp_path / "rows.csv"), "--max-tokens", "2",
               "--reuse", "prefix", "--repeat", "1", "--json"])
    out = capsys.readouterr()
    assert rc == 130 and "stopping after the current batch" in out.err
    res = json.loads(out.out)
    assert [r["row"] for r in res["rows"]] == [2] and res["summary"]["cancelled"] is True
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
