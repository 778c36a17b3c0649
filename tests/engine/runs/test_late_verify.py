"""Verifying a warm-only run later: its verdict stays open ("not yet verified") until its cold
run is made, on the batches, kernel and generation threads the warm run had; the window's
Verify button does it between jobs and shows the verdict on the run it shows."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from PySide6.QtWidgets import QPushButton

from app.engine import KvPrimerError, report_dict, run_prompt
from app.engine import session_flows as flows
from app.engine.project.project_file import report_from_dict
from app.engine.prompts.rows import Row
from app.engine.runs import cold_reference
from app.engine.runs.late_verify import verify_later
from app.engine.session import Options, RunRecord, Session
from app.ui.engine_worker import JobKind
from tests.ui_actions import click

from tests.cold_runs import GEN, TPL, VALS, evaluations  # noqa: F401 (a fixture)


@pytest.mark.parametrize("reuse", ["prefix", "chain"])
def test_a_warm_only_run_verified_later_gets_the_verdict_of_a_run_of_both(engine, evaluations,
                                                                         reuse):
    warm = run_prompt(engine, TPL, VALS, reuse=reuse, gen=GEN, cold=False)
    assert evaluations == [] and warm.verdict is None and not warm.verified
    later = verify_later(engine, warm)
    assert evaluations == ["cold"] and later.verified and not later.cold_kept
    assert later.verdict.equivalence == "bit-identical", later.verdict.describe()
    assert later.warm is warm.warm and warm.verdict is None  # a new report; the old one as it was
    assert later.speedup is not None
    # the run of both paths a user would have made gets the same verdict, from the kept run
    both = run_prompt(engine, TPL, VALS, reuse=reuse, gen=GEN)
    if both.plan == warm.plan:
        assert evaluations == ["cold"] and both.cold_kept and both.cold is later.cold
    assert asdict(both.verdict) == asdict(later.verdict)


def test_a_run_that_differs_is_verified_with_its_noise_floor(engine, evaluations):
    warm = run_prompt(engine, TPL, VALS, reuse="compose", gen=GEN, cold=False)
    later = verify_later(engine, warm)
    assert evaluations == ["cold", "oneshot"] and later.oneshot is not None
    assert later.verdict.equivalence != "bit-identical"
    assert later.verdict.noise_max_logit_diff is not None


def test_what_cannot_be_verified_is_refused_in_one_line(engine):
    cold = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, warm=False)
    with pytest.raises(KvPrimerError, match="nothing to verify"):
        verify_later(engine, cold)
    warm = run_prompt(engine, TPL, VALS, reuse="prefix", gen=GEN, cold=False)
    read = report_from_dict(json.loads(json.dumps(report_dict(warm))))
    assert read.verdict is None and not read.verified
    with pytest.raises(KvPrimerError, match="read from a project file"):
        verify_later(engine, read)
    engine._flash_attn = not engine._flash_attn  # as after the kernel measurement switched
    with pytest.raises(KvPrimerError, match="the attention kernel changed since this run"):
        verify_later(engine, warm)


def test_the_verify_flow_takes_the_latest_run_not_yet_verified(engine):
    s = Session(Options(max_tokens=4))
    s.set_template(TPL.source)
    with pytest.raises(KvPrimerError, match="every run is verified already"):
        flows.verify_plan(s)
    plan = flows.run_plan(TPL, [Row(1, VALS)], s.options, paths="warm")
    rec = flows.run_rows(engine, plan).records[0]
    s.runs.append(rec)
    vp = flows.verify_plan(s)
    assert vp.record is rec
    new = flows.verify(engine, vp)
    assert isinstance(new, RunRecord) and new.row == 1 and new.report.verified
    s.runs[-1] = new
    with pytest.raises(KvPrimerError, match="every run is verified already"):
        flows.verify_plan(s)
    with pytest.raises(KvPrimerError, match="verified already"):
        flows.verify_plan(s, new)


def test_the_window_verifies_a_warm_only_run_later(qtbot, make_window, monkeypatch):
    w = make_window()
    w.editor.set_text(TPL.source)
    for name, value in VALS.items():
        qtbot.keyClicks(w.fillings.fields[name], value)
    w.fillings.table.selectRow(0)
    panel = w.run_panel
    verify = panel.findChild(QPushButton, "verify")
    assert not verify.isEnabled()  # nothing to verify yet
    click(qtbot, w, panel.findChild(QPushButton, "run_warm"), JobKind.RUN)
    rec = w.session.runs[-1]
    assert rec.report.verdict is None and panel.verdict.text() == "not yet verified"
    assert verify.isEnabled() and panel.table.rowCount() == 1
    monkeypatch.setattr(cold_reference, "LONG_COLD_S", 0.0)  # every cold run is "long"
    estimates = []
    w.jobs.cold_estimate.connect(estimates.append)
    job = click(qtbot, w, verify, JobKind.RUN)
    # announced first, with the time it would take (from the warm run's speed)
    said = f"verifying against a cold run of {rec.report.prompt_tokens:,} tokens: about "
    assert estimates and estimates[0].startswith(said)
    assert any(m.startswith(said) for m in w.errors.messages())
    assert job.outcome == "done" and job.label == "verify"
    new = w.session.runs[-1]
    assert new.row == rec.row and new.report.warm is rec.report.warm
    assert new.report.verdict.equivalence == "bit-identical", new.report.verdict.describe()
    assert panel.verdict.text() == "bit-identical" and not verify.isEnabled()
    assert panel.table.rowCount() == 2  # its cold line added
    assert {panel.table.item(r, 1).text() for r in range(2)} == {"cold", "warm"}
    warm_line = next(r for r in range(2) if panel.table.item(r, 1).text() == "warm")
    assert panel.table.item(warm_line, 7).text() == "bit-identical"
    assert panel.chart.bar_count == 2
