"""`kvprimer bench --reuse ...`, `kvprimer cache` and `kvprimer run --reuse` on the tiny model."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.cli import main
from tests.paths import REPO_ROOT

TPL = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
       + "hello world of the answer and question. " * 3
       + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
ROWS = ("c1,c2,q\n"
        "the world is a question,hello answer,why?\n"
        "the world is a question,a helpful assistant,how?\n"
        "the world is a question,hello answer,what?\n")
FIELDS = ("row", "reuse", "reused_by_source", "evaluated_tokens", "cold_ms", "warm_ms",
          "tokens_equal", "first_diff", "max_logit_diff", "kl_divergence", "top1_agree",
          "equivalence")


@pytest.fixture
def files(tmp_path, tiny_model):
    (tmp_path / "t.tmpl").write_text(TPL, encoding="utf-8")
    (tmp_path / "rows.csv").write_text(ROWS, encoding="utf-8")
    return tmp_path, ["-m", str(tiny_model), "-t", "1", "-c", "1024", "-b", "32"]


def test_bench_every_reuse_mode_writes_one_entry_per_row_and_mode(files, capsys):
    d, m = files
    out = d / "out.json"
    rc = main(["bench", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv"), "--max-tokens", "3",
               "--reuse", "prefix,chain,compose", "--recompute", "0", "--json-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["row"], r["reuse"]) for r in rows] == [
        (row, mode) for mode in ("prefix", "chain", "compose") for row in (2, 3, 4)]
    for r in rows:
        for f in FIELDS:
            assert f in r, f
        assert r["error"] is None
        assert (r["first_diff"] is None) == r["tokens_equal"]
        assert all(set(s) == {"source", "tokens"} for s in r["reused_by_source"])
        assert sum(s["tokens"] for s in r["reused_by_source"]) == r["reused_tokens"]
    by = {(r["row"], r["reuse"]): r for r in rows}
    # exact modes stay bit-identical; chain reuses through <c1> (row 3) and <c1>, <c2> (row 4)
    for row in (2, 3, 4):
        for mode in ("prefix", "chain"):
            assert by[row, mode]["equivalence"] == "bit-identical"
            assert by[row, mode]["max_logit_diff"] == 0 and by[row, mode]["tokens_equal"]
        # compose places <c2>'s module, which never attended to <c1>: a measured difference,
        # and this model has no batch-grouping noise to hide it in
        c = by[row, "compose"]
        assert c["equivalence"] == "diverged" and c["max_logit_diff"] > 0 and c["kl_divergence"] > 0
    assert [s["source"].split(" = ")[0] for s in by[3, "chain"]["reused_by_source"]] == [
        "static prefix", "<c1>"]
    assert [s["source"].split(" = ")[0] for s in by[4, "chain"]["reused_by_source"]][:3] == [
        "static prefix", "<c1>", "<c2>"]
    assert by[4, "chain"]["evaluated_tokens"] < by[4, "prefix"]["evaluated_tokens"]
    assert any(s["source"].startswith("module") for s in by[4, "compose"]["reused_by_source"])
    # one cold run per row serves every mode whose warm history had the same batch starts:
    # chain and compose start a batch at every segment; prefix mode evaluates the suffix whole
    assert by[2, "chain"]["cold_ms"] == by[2, "compose"]["cold_ms"]
    summary = res["summary"]
    for mode in ("prefix", "chain", "compose"):
        assert summary[mode]["warm_ms_median"] > 0 and summary[mode]["rows"] == 3
    assert summary["modes"] == ["prefix", "chain", "compose"]
    assert "DIFF at None" not in text


@pytest.mark.parametrize("bad", ["bogus", "prefix,nope", ","])
def test_a_bad_reuse_value_is_one_line_and_exit_2(files, capfd, bad):
    d, m = files
    capfd.readouterr()
    try:
        rc = main(["bench", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv"), "--reuse", bad])
    except SystemExit as e:
        rc = e.code
    _out, err = capfd.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "reuse" in lines[0] and "prefix" in lines[0], err
    assert "Traceback" not in err


def test_cache_lists_tiers_and_nodes(files, capsys):
    d, m = files
    assert main(["cache", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in out["tiers"]] == ["resident", "ram", "file"]
    for t in out["tiers"]:
        assert 0 <= t["used_bytes"] <= t["cap_bytes"]
    labels = [n["label"] for n in out["nodes"]]
    assert "static prefix" in labels and any(lab.startswith("<c1>") for lab in labels)
    assert [h["row"] for h in out["rows"]] == [2, 3, 4]
    assert main(["cache", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^resident\s+\d+", text, re.M) and re.search(r"^file\s+\d+", text, re.M)
    assert "static prefix" in text


def test_run_with_recompute_and_compose(files, capsys):
    d, m = files
    vals = ["--set", "c1=the world", "--set", "c2=hello answer", "--set", "q=why?"]
    assert main(["run", str(d / "t.tmpl"), *m, *vals, "--reuse", "compose", "--recompute", "1",
                 "--json", "--max-tokens", "2"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["reuse"] == "compose" and rep["verdict"]["equivalence"] == "diverged"
    assert rep["verdict"]["max_logit_diff"] > 0  # <c2>'s module never saw <c1>
    assert [s["source"].split(" = ")[0] for s in rep["reused_by_source"]] == [
        "static prefix", "module <c1>", "module <c2>"]
    # <c1> lies where its module was made: its cells are the cold run's, so only <c2>'s are
    # recomputed
    assert ["(recomputed 1)" in s["source"] for s in rep["reused_by_source"][1:]] == [False, True]
    assert rep["recompute"]["tokens"] == 1 and rep["recompute"]["in_place"] > 0
    # --recompute covering every module: nothing composed is left, the run is the cold run
    assert main(["run", str(d / "t.tmpl"), *m, *vals, "--reuse", "compose", "--recompute", "100",
                 "--json", "--max-tokens", "2"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["verdict"]["equivalence"] == "bit-identical"
    assert whole["reused_tokens"] == whole["prefix_tokens"] + whole["recompute"]["in_place"]


def test_diff_at_none_exists_nowhere():
    root = REPO_ROOT / "app"
    hits = [str(p) for p in root.rglob("*.py") if "DIFF at None" in p.read_text(encoding="utf-8")]
    assert hits == []


def test_bench_runs_a_projects_rows_and_saves_the_results_into_it(files, capsys):
    """The CLI drives the same session the window saves: a project's template and rows in,
    the benchmark back into the project file, where the window finds it."""
    from app.engine.project.project_file import ProjectFile
    from app.engine.session import Session

    d, m = files
    s = Session()
    s.set_template(TPL)
    s.set_rows([{"c1": "the world", "c2": "hello", "q": "why?"},
                {"c1": "the world", "c2": "answer", "q": "how?"}])
    proj = d / "p.kvproj"
    s.to_project().save(proj)
    rc = main(["bench", str(proj), *m, "--reuse", "prefix,chain", "--max-tokens", "2", "--save"])
    assert rc == 0, capsys.readouterr()
    back = Session()
    back.apply_project(ProjectFile.load(proj), str(proj))
    assert back.template_text == TPL and len(back.rows) == 2
    assert back.bench is not None
    assert [(r.row, r.reuse) for r in back.bench.rows] == [(1, "prefix"), (2, "prefix"),
                                                           (1, "chain"), (2, "chain")]
    assert all(r.equivalence == "bit-identical" for r in back.bench.rows)


def test_bench_without_rows_says_where_rows_come_from(files, capsys):
    d, m = files
    assert main(["bench", str(d / "t.tmpl"), *m]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rows" in err[0]
    assert main(["bench", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv"), "--save"]) == 2
    assert ".kvproj" in capsys.readouterr().err
