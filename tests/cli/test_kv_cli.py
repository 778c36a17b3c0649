"""`kvprimer kv` and `kvprimer bench --fork K`."""
import json

import pytest

from app.cli import main

TPL = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
       + "hello world of the answer and question. " * 6 + "\n<c1>\n<|im_end|>\n")


@pytest.fixture
def tpl(tmp_path):
    p = tmp_path / "t.tmpl"
    p.write_text(TPL, encoding="utf-8")
    return p


def test_kv_json_shows_the_forks_sharing_every_prefix_cell(tpl, tiny_model, capsys):
    assert main(["kv", str(tpl), "--fork", "2", "--json", "-m", str(tiny_model), "-t", "1",
                 "-c", "512"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["n_cells", "used_cells", "source", "sequences"]
    assert out["source"] == "debug-log" and out["n_cells"] == 512
    P = out["used_cells"]
    assert P > 50
    # sequence 0 (the user's), the prefix's cache node and the two forks share every cell
    seqs = out["sequences"]
    assert len(seqs) == 4 and seqs[0]["seq"] == 0 and len({s["seq"] for s in seqs}) == 4
    assert [{k: v for k, v in s.items() if k != "seq"} for s in seqs] == [
        {"cells": P, "pos_min": 0, "pos_max": P - 1, "shared_cells": P}] * 4


def test_kv_text_and_too_many_forks(tpl, tiny_model, capsys):
    assert main(["kv", str(tpl), "--fork", "1", "-m", str(tiny_model), "-t", "1", "-c", "512"]) == 0
    out = capsys.readouterr().out
    assert "source: debug-log" in out and "/512 cells" in out
    # beside sequence 0, the prefix's node and the cache's holding and scratch sequences
    most = 64 - 4
    assert main(["kv", str(tpl), "--fork", str(most + 1), "-m", str(tiny_model), "-t", "1",
                 "-c", "512"]) == 2
    assert f"fork into at most {most}" in capsys.readouterr().err
    # at the most, the prefix's node keeps its sequence (it was pushed into the holding
    # sequence, 62, when the limit was n_seq_max - 3)
    assert main(["kv", str(tpl), "--fork", str(most), "--json", "-m", str(tiny_model), "-t", "1",
                 "-c", "512"]) == 0
    seqs = [s["seq"] for s in json.loads(capsys.readouterr().out)["sequences"]]
    assert len(seqs) == most + 2 and 62 not in seqs and 63 not in seqs


def test_bench_fork_compares_with_one_by_one_runs(tpl, tiny_model, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("c1\nthe world\nhello question\na b c\n", encoding="utf-8")
    out_json = tmp_path / "f.json"
    rc = main(["bench", str(tpl), "--rows", str(rows), "--fork", "2", "--max-tokens", "4",
               "-m", str(tiny_model), "-t", "1", "-c", "1024", "--json-out", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "forked batches of 2" in out and "all tokens equal: yes" in out
    res = json.loads(out_json.read_text())
    assert [b["rows"] for b in res["batches"]] == [[2, 3], [4]]
    assert all(b["tokens_equal"] and b["prompt_decodes"] == 1 for b in res["batches"])


@pytest.mark.model
def test_kv_on_the_rag_example_with_the_default_model(default_model, examples, capsys):
    """Three sequences sharing all prefix cells."""
    assert main(["kv", str(examples / "rag.tmpl"), "--fork", "2", "--json", "-t", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    P = out["used_cells"]
    assert out["source"] == "debug-log" and P > 1000
    seqs = out["sequences"]  # sequence 0, the prefix's cache node, the two forks
    assert len(seqs) == 4 and seqs[0]["seq"] == 0
    assert [(s["cells"], s["shared_cells"], s["pos_min"], s["pos_max"])
            for s in seqs] == [(P, P, 0, P - 1)] * 4
