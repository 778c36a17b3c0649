"""Benchmark export (app/engine/benchmarks/bench_export.py): `kvprimer bench --csv/--json-out` and
the window's Export write the same files."""
import csv
import json

import pytest

from app.cli import main
from app.engine import KvPrimerError
from app.engine.project.project_file import ProjectFile
from app.engine.benchmarks.bench_export import CSV_COLUMNS, write_results
from app.engine.session import Session
from app.ui.bench_view import BenchView

TPL = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
       + "hello world of the answer and question. " * 6 + "\n<c1>\n<|im_end|>\n")


def test_the_cli_and_the_window_export_the_same_csv_and_json(qtbot, tiny_model, tmp_path,
                                                               capsys):
    s = Session()
    s.set_template(TPL)
    s.set_rows([{"c1": "the world"}, {"c1": "hello question"}])
    proj = tmp_path / "p.kvproj"
    s.to_project().save(proj)
    rc = main(["bench", str(proj), "-m", str(tiny_model), "-t", "1", "-c", "512", "--repeat", "1",
               "--max-tokens", "2", "--save", "--csv", str(tmp_path / "cli.csv"),
               "--json-out", str(tmp_path / "cli.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"wrote {tmp_path / 'cli.csv'}" in out
    back = Session()  # the window opens the project the CLI saved its results in
    back.apply_project(ProjectFile.load(proj), str(proj))
    view = BenchView(back)
    qtbot.addWidget(view)
    view.export_data(tmp_path / "win.csv")
    view.export_data(tmp_path / "win.json")
    assert (tmp_path / "win.csv").read_text() == (tmp_path / "cli.csv").read_text()
    assert json.loads((tmp_path / "win.json").read_text()) == json.loads(
        (tmp_path / "cli.json").read_text())
    rows = list(csv.DictReader(open(tmp_path / "cli.csv")))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(r["reuse"], r["row"]) for r in rows] == [("prefix", "1"), ("prefix", "2"),
                                                     ("chain", "1"), ("chain", "2")]
    # a list-valued field is one cell of JSON, so each row stays one line
    assert isinstance(json.loads(rows[0]["reused_by_source"]), list)


def test_nothing_to_export_and_csv_beside_fork_are_refused(tmp_path, capsys):
    with pytest.raises(KvPrimerError, match="nothing to export yet"):
        write_results(tmp_path / "x.json", None)
    with pytest.raises(KvPrimerError, match="run a benchmark first"):
        write_results(tmp_path / "x.csv", None)
    assert not list(tmp_path.iterdir())
    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TPL, encoding="utf-8")
    assert main(["bench", str(tpl), "--fork", "2", "--csv", str(tmp_path / "x.csv")]) == 2
    assert "--csv writes a cold/warm benchmark's rows" in capsys.readouterr().err
