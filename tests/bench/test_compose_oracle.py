"""The compose-oracle measurement (bench/compose_oracle*.py) on the tiny model: the recompute
assembly at its two ends (every module token recomputed is the cold run bit for bit; none is
plain compose, the cached cells as they were made), the deviation it reads, and the choices."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from app.engine import Template, read_rows
from app.engine.llama.native import NativeModel, ensure_backend
from bench.compose_oracle import PREFIX, OracleContext, deviation, layer_rows, runs_of
from bench.compose_oracle_score import ScoringContext, scored
from bench.compose_oracle_report import oracle_markdown, render_oracle_chart
from bench.compose_oracle_run import (OracleConfig, merge_parts, plan_rows, run_compose_oracle,
                                      summarise)
from bench.compose_oracle_select import choose, first_k, recall, share_count, top_share

TEMPLATE = ("<|im_start|>system\nAnswer the question with the context below; the context is "
            "about the world and the answer is short.\n# Context\n<c1>\n<c2>\n<c3><|im_end|>\n"
            "<|im_start|>user\n<question><|im_end|>\n<|im_start|>assistant\n")
ROWS = ("c1,c2,c3,question\n"
        "hello world is the answer,the world of a context,and you are helpful,what is it?\n"
        "the world of a context,hello world is the answer,you are a helpful assistant,who?\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("oracle")
    tpl, rows = d / "t.tmpl", d / "rows.csv"
    tpl.write_text(TEMPLATE, encoding="utf-8")
    rows.write_text(ROWS, encoding="utf-8")
    return tpl, rows


@pytest.fixture
def oracle(tiny_model, files):
    ensure_backend()
    model = NativeModel(tiny_model)
    tpl = Template.parse(files[0].read_text(encoding="utf-8"))
    prefix, plans = plan_rows(model, tpl, read_rows(files[1], tpl.placeholders))
    oc = OracleContext(model, n_ctx=1024, n_batch=32, n_threads=1)
    oc.prime(prefix)
    yield oc, plans
    oc.close()
    model.close()


def test_rows_split_into_prefix_modules_and_question(oracle):
    _oc, plans = oracle
    for plan in plans:
        assert len(plan.modules) == 3
        assert plan.modules[0][0] == plan.prefix_len
        assert all(a[1] == b[0] for a, b in zip(plan.modules, plan.modules[1:]))
        assert plan.tail_start < len(plan.tokens)
        assert plan.positions([0, plan.module_tokens - 1]) == [plan.prefix_len, plan.tail_start - 1]


def test_recomputing_every_module_token_is_the_cold_run_bit_for_bit(oracle):
    oc, plans = oracle
    for plan in plans:
        cold = oc.cold(plan, 4)
        full = oc.compose(plan, plan.positions(range(plan.module_tokens)), 4, want_state=True)
        assert full.tokens == cold.tokens
        assert all(np.array_equal(a, b) for a, b in zip(full.logits, cold.logits))
        assert full.runs == 3 and full.recomputed == plan.module_tokens
        dev = deviation(cold.state, full.state, plan)
        assert not dev.k.any() and not dev.v.any()


def test_no_token_recomputed_is_plain_compose(oracle):
    """Every module token keeps the V its module cached (V carries no position), and the
    first module, placed where it was made, its K too; later modules' K is rotated."""
    oc, plans = oracle
    plan = plans[0]
    plain = oc.compose(plan, [], 4, want_state=True)
    assert plain.runs == 0 and plain.recomputed == 0
    got = plain.state.first_stream
    p = plan.prefix_len
    for i, (s, e) in enumerate(plan.modules):
        cached = oc.module(plan.tokens[s:e]).first_stream
        at = np.isin(got.positions, np.arange(s, e))
        for layer in range(len(got.k)):
            assert np.array_equal(layer_rows(got, layer, "v")[at], layer_rows(cached, layer, "v"))
            same_k = np.array_equal(layer_rows(got, layer, "k")[at], layer_rows(cached, layer, "k"))
            assert same_k == (s == p), (i, layer)


def test_shifting_once_per_row_composes_the_same_cache(oracle):
    """Modules put at the row's positions first (one K re-rotation for the row) and their parts
    shared from there: the same cells' values as placing each part when its turn comes."""
    oc, plans = oracle
    plan = plans[1]
    chosen = plan.positions(range(2, plan.module_tokens, 5))
    each = oc.compose(plan, chosen, 3, want_state=True)
    once = oc.compose(plan, chosen, 3, want_state=True, shift_once=True)
    assert once.runs == each.runs and once.recomputed == each.recomputed
    a, b = each.state.first_stream, once.state.first_stream
    assert np.array_equal(a.positions, b.positions)
    for layer in range(len(a.k)):
        for w in ("k", "v"):
            x, y = layer_rows(a, layer, w), layer_rows(b, layer, w)
            assert np.allclose(x, y, atol=1e-2 * np.abs(x).max()), (layer, w)
    assert once.tokens == each.tokens
    assert oc.ctx.pos_range(4) == (-1, -1)  # the shifted modules' sequences are left empty
    # every token recomputed: the cold run's values, though not its bits (the modules' cells
    # took the first free cells, so the recomputed ones lie elsewhere than the cold run's)
    full = oc.compose(plan, plan.positions(range(plan.module_tokens)), 3, shift_once=True)
    cold = oc.cold(plan, 3)
    assert full.tokens == cold.tokens
    assert all(np.allclose(x, y, atol=1e-3 * np.abs(y).max()) for x, y in zip(full.logits, cold.logits))


def test_the_deviation_is_context_only(oracle):
    """Layer 0's V depends on the token alone, so composing leaves it as the cold run has it;
    layer 1's differs where a module's context differs (all modules after the first)."""
    oc, plans = oracle
    plan = plans[1]
    dev = deviation(oc.cold(plan, 2).state, oc.compose(plan, [], 2, want_state=True).state, plan)
    assert dev.v.shape == (2, plan.module_tokens)
    assert not dev.v[0].any()
    later = plan.modules[0][1] - plan.modules[0][0]
    assert dev.v[1][later:].max() > 0
    assert (dev.oracle() >= 0).all()


def test_recomputing_the_oracle_choice_removes_the_largest_deviation(oracle):
    oc, plans = oracle
    plan = plans[1]
    cold = oc.cold(plan, 2)
    dev = deviation(cold.state, oc.compose(plan, [], 2, want_state=True).state, plan)
    lengths = [e - s for s, e in plan.modules]
    idx = choose("oracle", 0.3, lengths, dev)
    run = oc.compose(plan, plan.positions(idx), 2, want_state=True)
    after = deviation(cold.state, run.state, plan).oracle()
    assert after.sum() < dev.oracle().sum()
    # the first chosen token sees the cold run's context in every layer: its cells are the cold
    # run's up to the cells' own batch
    assert after[idx[0]] < dev.oracle()[idx[0]] or dev.oracle()[idx[0]] == 0


def test_the_scoring_pass_reads_layer_1s_v_in_context(oracle):
    """Stopped after layer 1's V, the scoring pass gives the cold run's layer-1 V (up to the
    cache's f16 rounding), and so the same choice as the cold run's V would."""
    oc, plans = oracle
    sc = ScoringContext(oc.model, oc.ctx.state_get(PREFIX), 1024, 32, 1)
    try:
        for plan in plans:
            v1, ms = sc.layer1_v(plan)
            cold = oc.cold(plan, 1)
            cold_v1 = layer_rows(cold.state.first_stream, 1, "v")
            assert v1.shape[0] == len(plan.tokens) - plan.prefix_len and ms > 0
            assert np.allclose(v1[:plan.module_tokens], cold_v1, atol=1e-2 * np.abs(cold_v1).max())
            dev = deviation(cold.state, oc.compose(plan, [], 1, want_state=True).state, plan)
            cached = [layer_rows(oc.module(plan.tokens[s:e]).first_stream, 1, "v")
                      for s, e in plan.modules]
            score = scored(v1, plan, cached)
            assert np.allclose(score, dev.layer_v(1), rtol=0.05, atol=1e-3 * score.max())
    finally:
        sc.close()


def test_the_oracle_picks_the_largest_deviations():
    scores = np.array([0.1, 5.0, 0.3, 4.0, 0.0, 2.0, 0.2, 1.0, 0.05, 3.0])
    assert top_share(scores, 0.3) == [1, 3, 9]
    assert top_share(scores, 0.0) == []
    chosen = top_share(scores, 0.5)
    assert min(scores[chosen]) >= max(np.delete(scores, chosen))
    assert top_share(np.array([1.0, 1.0, 1.0]), 0.34) == [0]  # ties: the earlier token


def test_first_k_takes_each_modules_first_tokens_and_shares_round():
    assert first_k([10, 20, 5], 0.2) == [0, 1, 10, 11, 12, 13, 30]
    assert share_count(80, 0.05) == 4 and share_count(3, 0.05) == 1 and share_count(0, 0.3) == 0
    assert recall([1, 2, 3], [2, 3, 4, 5]) == 0.5 and recall([], []) == 1.0
    assert runs_of([3, 4, 5, 9, 11, 12]) == [(3, 6), (9, 10), (11, 13)]
    with pytest.raises(ValueError, match="unknown selection method"):
        choose("random", 0.1, [4], None)


def test_the_section_runs_and_sums_up(tiny_model, files, tmp_path):
    cfg = OracleConfig(rows=2, shares=(0.1, 0.3), oracle_more=(0.6,), max_tokens=3, n_ctx=1024,
                       n_batch=32, n_threads=1, model_path=str(tiny_model),
                       template_path=str(files[0]), rows_path=str(files[1]))
    seen = []
    out = run_compose_oracle(cfg, log=lambda m: None, on_row=lambda part: seen.append(
        len(part["rows"])))
    assert seen == [1, 2] and out["n_layer"] == 2
    s = out["summary"]
    assert s["rows"] == 2 and s["full_bit_identical"] == 2
    assert set(s["curves"]) == {"oracle", "layer1_v", "first_k"}
    assert set(s["curves"]["oracle"]) == {"0.1", "0.3", "0.6"}
    assert set(s["curves"]["first_k"]) == {"0.1", "0.3"}
    assert s["curves"]["oracle"]["0.3"]["oracle_recall"] == 1.0
    assert s["full"]["greedy_equal"] == 1.0 and s["full"]["kl_max"] == 0.0
    for row in out["rows"]:
        assert row["cells"]["oracle@0.1"]["recomputed"] == max(1, round(0.1 * row["module_tokens"]))
    # the summary is the rows' own figures
    again = summarise(out["rows"], cfg.shares, cfg.methods, cfg.oracle_more)
    assert again["curves"] == s["curves"]
    # two parts of the rows make the same section as one run
    halves = [run_compose_oracle(replace(cfg, first=i, rows=1), log=lambda m: None)
              for i in (0, 1)]
    merged = merge_parts(halves)
    assert [r["number"] for r in merged["rows"]] == [r["number"] for r in out["rows"]]
    assert merged["summary"]["full_bit_identical"] == 2
    # (a module's cells come out in the last bits as the cells free when it was made let them)
    assert [r["cells"]["oracle@0.3"]["kl"] for r in merged["rows"]] == pytest.approx(
        [r["cells"]["oracle@0.3"]["kl"] for r in out["rows"]], rel=1e-3)
    # the table and the chart
    text = oracle_markdown(out)
    assert "| oracle 30% |" in text and "| plain compose (0%) |" in text
    assert "bit-identical to the cold run on 2 of 2" in text
    png = render_oracle_chart(out, tmp_path / "c.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_bench_command_runs_the_section_alone(tiny_model, files, monkeypatch, tmp_path):
    import bench.__main__ as main
    import bench.compose_oracle_run as run

    got = {}
    real = run.run_compose_oracle

    def on_tiny(cfg, log=None, on_row=None):
        got["cfg"] = cfg
        return real(replace(cfg, shares=(0.2,), oracle_more=(), max_tokens=2, n_ctx=1024,
                            n_batch=32, n_threads=1, model_path=str(tiny_model),
                            template_path=str(files[0]), rows_path=str(files[1])),
                    log=log, on_row=on_row)

    monkeypatch.setattr(run, "run_compose_oracle", on_tiny)
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"kept": 1, "ratios": {"other": 2.0}}))
    code = main.main(["--only-compose-oracle", "--oracle-rows", "2", "--out", str(out),
                      "--oracle-chart", str(tmp_path / "oracle.png")])
    assert code == 0 and got["cfg"].rows == 2
    res = json.loads(out.read_text())
    assert res["kept"] == 1 and res["ratios"]["other"] == 2.0  # the other figures stay
    assert res["compose_oracle"]["summary"]["full_bit_identical"] == 2
    assert (tmp_path / "oracle.png").stat().st_size > 5000
    assert main.parse_args(["--no-compose-oracle"]).no_compose_oracle


def test_the_shift_once_probe_reads_as_one_paragraph():
    from bench.compose_oracle_report import shift_once_line

    cell = {"runs": 8, "each_vs_prefix": 0.76, "once_vs_prefix": 0.48, "each_equal": True,
            "once_equal": False}
    probe = {"date_utc": "2026-12-02 08:00 UTC", "loadavg_start": 9.5,
             "rows": [{"number": 14, "cells": {"oracle@0.3": cell}},
                      {"number": 38, "cells": {"oracle@0.3": {**cell, "each_vs_prefix": 0.70,
                                                               "once_vs_prefix": 0.40,
                                                               "once_equal": True}}}]}
    line = shift_once_line(probe)
    assert "rows 14, 38" in line and "oracle 0.3 0.73 → 0.44" in line
    assert "on 1 of 2 runs" in line
