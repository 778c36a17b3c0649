"""The bench's paths on the tiny model: every path (ours and llama-cpp-python's) evaluates the
same suffix tokens, the disk cache stays warm across repeats, and the whole suite writes its
report, ratios and chart. Timings are not checked here: the bench is for that."""
import json

import numpy as np
import pytest

from bench.chart import render_chart
from bench.llamacpp_paths import LlamaPaths
from bench.report import format_report
from bench.suite import BenchConfig, run_suite
from bench.workload import load_workload, truncated

TEMPLATE = ("<|im_start|>system\nYou are a helpful assistant. Answer the question from the "
            "context.\n# Context\n<ctx><|im_end|>\n<|im_start|>user\n<q><|im_end|>\n"
            "<|im_start|>assistant\n")
ROWS = "ctx,q\nthe world is a hello,what is the world?\nhe is ll,who is he?\n"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "t.tmpl").write_text(TEMPLATE)
    (tmp_path / "rows.csv").write_text(ROWS)
    return tmp_path / "t.tmpl", tmp_path / "rows.csv"


def test_workload_boundary_and_truncation(engine, files):
    work = load_workload(engine, 2, *files)
    assert [r.number for r in work.rows] == [2, 3]
    for r in work.rows:
        assert r.tokens[:r.boundary] == work.prefix[:r.boundary]
        assert 0 < r.boundary < len(r.tokens)
        t = truncated(work.prefix, r, 10)
        assert t.tokens == work.prefix[:10] + r.suffix and t.boundary == 10
    assert work.unrelated[0] != work.prefix[0]


def test_llamacpp_paths_evaluate_the_suffix_and_disk_cache_stays_warm(tiny_model, engine,
                                                                        files, tmp_path):
    work = load_workload(engine, 1, *files)
    row = work.rows[0]
    lp = LlamaPaths(tiny_model, n_ctx=1024, n_batch=32, n_threads=1, cache_dir=tmp_path / "dc")
    try:
        lp.prime(work.prefix)
        assert lp.ram_entry_bytes() > lp.entry.llama_state_size > 0
        assert lp.disk_entry_bytes() > 0
        disk = []
        for _ in range(3):  # __getitem__ pops the entry; each repeat must still be a hit
            s = lp.disk_warm(row, work.unrelated)
            assert s.evaluated == len(row.suffix)
            disk.append(s)
        # a hit restores the prefix's state over the unrelated prompt's cells: every path then
        # evaluates the same suffix after the same cells, bit for bit
        s = lp.ram_warm(row, work.unrelated)
        assert s.evaluated == len(row.suffix)
        assert all(np.array_equal(d.logits, s.logits) for d in disk)
        s = lp.in_context(row, row.tokens[row.boundary] + 1)
        assert s.evaluated == len(row.suffix)
        assert np.array_equal(s.logits, disk[0].logits)
        assert len(lp.more_tokens(s.first_token, 3)) <= 3
    finally:
        lp.close()


def test_suite_on_tiny_model_reports_same_suffix_tokens(tiny_model, files, tmp_path):
    cfg = BenchConfig(rows=2, repeats=2, sweep_points=(16,), sweep_repeats=1, n_threads=1,
                      n_batch=32, n_ctx=1024, equivalence_tokens=4, model_path=str(tiny_model),
                      template_path=str(files[0]), rows_path=str(files[1]))
    res = run_suite(cfg, log=lambda msg: None)
    assert res["same_suffix_tokens"]["ok"], res["same_suffix_tokens"]["mismatches"]
    assert len(res["paths"]["warm_memory"]) == 4  # 2 repeats x 2 rows, paired by index
    for row in res["workload"]["rows"]:
        eq = res["equivalence"][str(row["row"])]
        # the same batches and cells where a cold run puts them: exact
        for name in ("limit", "warm_memory", "warm_in_place", "warm_file"):
            assert eq[name]["tokens_equal"] and eq[name]["max_abs_logit_diff"] == 0.0, name
        assert "q8_0_warm_memory" in eq and "llamacpp_ram" in eq
    for name in ("warm_vs_fastest_limit", "warm_vs_llamacpp_ram", "warm_vs_llamacpp_disk",
                 "state_bytes_vs_raw_kv", "q8_0_state_bytes_vs_raw_kv"):
        assert res["ratios"][name] > 0 and name in res["goals"]
    for name in ("warm_vs_limit", "warm_copy_vs_fastest_limit", "limit_cache_context_vs_fastest_limit"):
        assert res["ratios"][name] > 0
    assert res["ratios"]["state_bytes_vs_raw_kv"] < 1.1
    assert [p["prefix_tokens"] for p in res["sweep"]][0] == 16
    text = format_report(res)
    assert "every path evaluated the same suffix tokens: yes" in text
    json.dumps(res)  # results.json must be writable as is
    png = render_chart(res, tmp_path / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


REUSE_TEMPLATE = ("<|im_start|>system\nYou are a helpful assistant. Answer the question from the "
                  "context.\n# Context\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n"
                  "<|im_start|>assistant\n")
# rows 3 and 5 repeat row 2's c1 (chain reuses through it); row 4 repeats row 2's c2
REUSE_ROWS = ("c1,c2,q\nthe world is a hello,he is ll,what is the world?\n"
              "the world is a hello,a question of the answer,who is he?\n"
              "you are the context,he is ll,and the answer?\n"
              "the world is a hello,he is ll,is it hello?\n")


def test_reuse_section_on_tiny_model(tiny_model, tmp_path):
    from bench.report import format_reuse
    from bench.reuse_bench import ReuseConfig, run_reuse

    (tmp_path / "r.tmpl").write_text(REUSE_TEMPLATE)
    (tmp_path / "r.csv").write_text(REUSE_ROWS)
    cfg = ReuseConfig(rows=4, fork_repeats=2, n_threads=1, n_batch=32, n_ctx=2048, max_tokens=4,
                      check_tokens=4, model_path=str(tiny_model),
                      template_path=str(tmp_path / "r.tmpl"), rows_path=str(tmp_path / "r.csv"),
                      native_peer=False, server_peer=False)  # tests/test_bench_*peer*.py
    rz = run_reuse(cfg, log=lambda msg: None)
    rows = {(r["row"], r["reuse"]): r for r in rz["rows"]}
    assert len(rows) == 12 and not any(r["error"] for r in rows.values())
    # the warm run in prefix mode is the fastest limit's computation exactly, same batches
    fork = rz["warm_in_place"]
    assert fork["bit_identical"] and len(fork["fork_ms"]) == len(fork["limit_ms"]) == 8
    # chain: exact on every row, and rows repeating an earlier c1 reuse past the prefix
    assert rz["chain_exact"] == {"rows": 4, "bit_identical_rows": 4, "all": True}
    # chain against prefix in ABBA pairs on the rows where chain reused only the prefix
    static = [n for (n, m), r in sorted(rows.items())
              if m == "chain" and r["reused_tokens"] <= rows[(n, "prefix")]["reused_tokens"]]
    pairs = rz["static_pairs"]
    assert static and pairs["rows"] == static
    assert len(pairs["chain_ms"]) == len(pairs["prefix_ms"]) == 2 * len(static)
    prefix = rows[(2, "prefix")]["reused_tokens"]
    assert rows[(3, "chain")]["reused_tokens"] > prefix
    assert rows[(5, "chain")]["reused_tokens"] > rows[(3, "chain")]["reused_tokens"]
    assert rows[(2, "chain")]["reused_tokens"] == prefix
    # compose: every row places a <c2> module that never attended to its <c1>, so every row
    # measures a difference (this model has no batch-grouping noise), and the summary is the
    # rows' own figures
    acc = rz["compose_accuracy"]
    composed = [r for (_row, mode), r in rows.items() if mode == "compose"]
    assert acc["rows"] == 4 and all(r["max_logit_diff"] > 0 for r in composed)
    assert (acc["bit_identical"], acc["within_noise"], acc["diverged"]) == (0.0, 0.0, 1.0)
    assert acc["kl_median"] > 0 and acc["kl_max"] == max(r["kl_divergence"] for r in composed)
    assert acc["top1_agree_min"] == min(r["top1_agree"] for r in composed)
    for name in ("chain_vs_prefix_warm", "compose_vs_prefix_warm",
                 "warm_in_place_vs_fastest_limit_recurring", "chain_vs_prefix_static_rows"):
        assert rz["ratios"][name] > 0 and name in rz["goals"]
    assert rz["ratios"]["prefix_vs_llamacpp_ram_project_recurring"] > 0
    peer = rz["llamacpp_ram_recurring"]
    assert [r["row"] for r in peer] == [2, 3, 4, 5]
    # the peer starts with the static prefix cached, as each mode does, and reuses from its
    # cache: no row evaluates the whole prompt
    assert all(r["reused_tokens"] >= rows[(2, "prefix")]["reused_tokens"] for r in peer)
    text = format_reuse(rz)
    assert "compose accuracy over 4 rows" in text and "chain: 4/4 rows bit-identical" in text
    json.dumps(rz)
    # the chart gains the reuse panel
    res = run_suite(BenchConfig(rows=1, repeats=1, sweep_points=(), n_threads=1, n_batch=32,
                                n_ctx=1024, equivalence_tokens=2, llamacpp=False, q8_0=False,
                                model_path=str(tiny_model), template_path=str(tmp_path / "r.tmpl"),
                                rows_path=str(tmp_path / "r.csv")), log=lambda msg: None)
    res["reuse"] = rz
    png = render_chart(res, tmp_path / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
