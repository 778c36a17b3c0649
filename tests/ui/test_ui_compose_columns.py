"""Compose's trade where people choose (no model needed): the recompute box takes a share or a
count, the Run panel's lines and the Benchmark view's tables show what compose recomputed and
how close it came, beside prefix mode."""
from __future__ import annotations

from app.engine import BenchResult, BenchRow
from app.engine.runs.cold_reference import PathResult
from app.engine.runs.prompt_runs import RunReport
from app.engine.runs.recompute_choice import RecomputeChoice
from app.engine.runs.verdict import Verdict
from app.engine.session import RunRecord, Session


def headers(table) -> dict[str, int]:
    # headers may wrap onto two lines to fit the window: read them as one
    return {" ".join(table.horizontalHeaderItem(c).text().split()): c
            for c in range(table.columnCount())}


def test_the_benchmark_view_shows_compose_beside_prefix(qtbot):
    from app.ui.bench_view import BenchView

    s = Session()
    v = BenchView(s)
    qtbot.addWidget(v)
    rows = [BenchRow(row=r, reuse="prefix", warm_ms=10.0, cold_ms=90.0, speedup=9.0,
                     equivalence="bit-identical", tokens_equal=True, top1_agree=1.0,
                     warm_runs_ms=[10.0])
            for r in (1, 2)]
    rows += [BenchRow(row=r, reuse="compose", warm_ms=4.0, cold_ms=90.0, speedup=22.5,
                      equivalence="diverged", tokens_equal=r == 1, top1_agree=0.75,
                      kl_divergence=kl, recompute_share=0.15, recomputed_tokens=12,
                      warm_runs_ms=[4.0])  # measured side by side with prefix's
             for r, kl in ((1, 0.002), (2, 0.004))]
    s.set_bench(BenchResult(model={}, rows=rows, modes=("prefix", "compose"), recompute="15%"))
    col = headers(v.table)
    assert [v.table.item(i, col["recomputed"]).text() for i in range(4)] == ["", "", "15%", "15%"]
    assert [v.table.item(i, col["top-1 agree"]).text() for i in range(4)] == [
        "100%", "100%", "75%", "75%"]
    acc = headers(v.accuracy)
    by_mode = {v.accuracy.item(i, 0).text(): i for i in range(v.accuracy.rowCount())}
    compose, prefix = by_mode["compose"], by_mode["prefix"]
    cell = lambda r, c: v.accuracy.item(r, acc[c]).text()  # noqa: E731
    assert cell(compose, "same tokens") == "1 of 2" and cell(prefix, "same tokens") == "2 of 2"
    assert cell(compose, "recomputed") == "15%" and cell(prefix, "recomputed") == "—"
    assert cell(compose, "median KL (nats)") == "0.003"
    assert cell(compose, "warm ÷ prefix") == "0.40" and cell(prefix, "warm ÷ prefix") == "1.00"
    assert "recomputed 15% of module tokens" in v.summary.text()


def test_the_recompute_box_takes_a_share_or_a_count_and_refuses_the_rest(qtbot):
    from app.ui.bench_view import BenchView

    s = Session()
    s.set_options(bench_modes=("prefix", "compose"))
    v = BenchView(s)
    qtbot.addWidget(v)
    box = v.recompute
    assert box.isEnabled() and box.currentText() == s.options.recompute
    for typed, kept in (("20%", "20%"), ("8", "8"), ("150%", "8"), ("abc", "8"), ("0%", "0%")):
        box.setCurrentText(typed)
        box.lineEdit().editingFinished.emit()
        assert s.options.recompute == kept and box.currentText() == kept, typed
    v.edits.stack.undo()
    assert s.options.recompute == "8" and box.currentText() == "8"
    s.set_options(recompute=4)  # a project file's count
    assert box.currentText() == "4"
    s.set_options(bench_modes=("prefix",))
    assert not box.isEnabled()


def test_the_run_panel_says_what_a_composed_run_recomputed_and_how_close_it_came(qtbot):
    from app.ui.run_panel import RunPanel

    s = Session()
    p = RunPanel(s)
    qtbot.addWidget(p)

    def path(mode):
        return PathResult(mode, 40, 20, 1.0, 5.0, 9.0, 3.0, [1, 2], "ab", [])
    choice = RecomputeChoice("30%", 9, 30, 2)
    rep = RunReport(60, 20, "compose", 40, 20, 0.1, sources=(("static prefix", 20),),
                    cold=path("cold"), warm=path("warm"), recompute=choice,
                    verdict=Verdict("diverged", False, 1, 0.5, 0.012, 0.5, None, None))
    s.add_run(RunRecord(1, rep))
    col = headers(p.table)
    warm = next(r for r in range(p.table.rowCount()) if p.table.item(r, col["path"]).text() == "warm")
    assert [p.table.item(warm, col[c]).text() for c in
            ("recomputed", "same tokens", "top-1 agree", "KL (nats)")] == ["30%", "NO", "50%", "0.012"]
    cold = 1 - warm
    assert p.table.item(cold, col["recomputed"]).text() == ""
    assert choice.describe() in p.reuse.text()
