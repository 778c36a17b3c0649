"""Every bad input to `kvprimer` ends with exit code 2 (ExitCode.BAD_INPUT) and exactly one
line on stderr.

Most cases call ``main()`` in this process and capture file descriptor 2 (so llama.cpp's own
prints would show too); a few run the real command in a subprocess, where Python's logging and
tracebacks behave as they do for a user.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
TPL = "<|im_start|>system\nhello world of the answer. the context is:\n<c>\n<|im_end|>\n<q>"


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model, other_tiny_model):
    tmp_path = tmp_path_factory.mktemp("cli")
    (tmp_path / "t.tmpl").write_text(TPL)
    (tmp_path / "bad.tmpl").write_text("hello <name\nworld")
    (tmp_path / "latin1.tmpl").write_bytes("caf\xe9 <c> <q>".encode("latin-1"))
    (tmp_path / "rows.csv").write_text("c,q\nthe world,hello?\n")
    (tmp_path / "extra.csv").write_text("c,q,zz\nthe world,hello?,1\n")
    (tmp_path / "missing.csv").write_text("c\nthe world\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "latin1.csv").write_bytes("c,q\ncaf\xe9,x\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"c": "a", "q": "b"}\n{"c": "a", "q": \n')
    (tmp_path / "notgguf.gguf").write_text("not a model")
    (tmp_path / "cut.gguf").write_bytes(tiny_model.read_bytes()[:5000])
    (tmp_path / "junk.kvstate").write_bytes(b"KVPSTATE" + bytes(100))
    m = ["-m", str(tiny_model), "-t", "1", "-c", "256", "-b", "32"]
    assert main(["prime", str(tmp_path / "t.tmpl"), *m, "-o", str(tmp_path / "good.kvstate")]) == 0
    other = ["-m", str(other_tiny_model), "-t", "1", "-c", "256", "-b", "32"]
    assert main(["prime", str(tmp_path / "t.tmpl"), *other, "-o", str(tmp_path / "other.kvstate")]) == 0
    return tmp_path, m


def cases(d: Path, m: list[str]) -> dict[str, tuple[list[str], str]]:
    t = str(d / "t.tmpl")
    vals = ["--set", "c=the world", "--set", "q=hello?"]
    return {
        "missing template": (["run", str(d / "none.tmpl"), *m], "no template file"),
        "template syntax": (["run", str(d / "bad.tmpl"), *m], "line 1, column 7"),
        "template not utf-8": (["run", str(d / "latin1.tmpl"), *m], "not UTF-8"),
        "missing --set": (["run", t, *m, "--set", "c=x"], "missing values for <q>"),
        "unknown --set": (["run", t, *m, *vals, "--set", "zz=1"], "unknown names zz"),
        "--set without =": (["run", t, *m, "--set", "c"], "name=value"),
        "--set-file missing": (["run", t, *m, "--set", "c=x", "--set-file", f"q={d}/nofile"], "cannot read"),
        "bad --state": (["run", t, *m, *vals, "--state", str(d / "junk.kvstate")], "kvstate"),
        "missing --state": (["run", t, *m, *vals, "--state", str(d / "none.kvstate")], "no state file"),
        "state for another model": (["run", t, *m, *vals, "--state", str(d / "other.kvstate")], "another model"),
        "model not gguf": (["run", t, "-m", str(d / "notgguf.gguf"), *vals], "not a GGUF"),
        "model missing": (["info", "-m", str(d / "none.gguf")], "no model file"),
        "model truncated": (["info", "-m", str(d / "cut.gguf"), "-t", "1"], "truncated"),
        "model is a folder": (["info", "-m", str(d)], "is a folder"),
        "-c 0": (["info", *m, "-c", "0"], "--ctx-size must be at least 16"),
        "-b 0": (["info", *m, "-b", "0"], "--batch-size must be at least 1"),
        "-t -1": (["info", *m, "-t", "-1"], "--threads must be at least 0"),
        "-tb huge": (["info", *m, "-tb", "100000"], "batch threads must be between 1 and 512"),
        "-t huge": (["info", *m, "-t", "100000"], "generation threads must be between 0"),
        "-c wraps uint32": (["info", *m, "-c", str((1 << 32) + 16)], "context size must be between"),
        "-c not a number": (["info", *m, "-c", "lots"], "invalid int value"),
        "unknown KV type": (["info", *m, "-ctk", "q9"], "invalid choice"),
        "prompt over context": (["run", t, *m, "--set", "c=" + "hello world " * 150, "--set", "q=?"],
                                "tokens but the context holds 256; raise the context size to at least"),
        "prime into missing folder": (["prime", t, *m, "-o", str(d / "no" / "x.kvstate")], "does not exist"),
        "rows missing": (["bench", t, *m, "--rows", str(d / "none.csv")], "no rows file"),
        "rows extra column": (["bench", t, *m, "--rows", str(d / "extra.csv")], "the header (row 1): column 'zz'"),
        "rows missing column": (["bench", t, *m, "--rows", str(d / "missing.csv")], "the header (row 1): no column 'q'"),
        "rows empty": (["bench", t, *m, "--rows", str(d / "empty.csv")], "is empty"),
        "rows not utf-8": (["bench", t, *m, "--rows", str(d / "latin1.csv")], "line 2: not UTF-8"),
        "rows bad json": (["bench", t, *m, "--rows", str(d / "bad.jsonl")], "line 2, column"),
        "bench --repeat 0": (["bench", t, *m, "--rows", str(d / "rows.csv"), "--repeat", "0"], "at least 1"),
    }


CASE_NAMES = list(cases(Path("."), []))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_exit_2_one_line(files, capfd, name):
    d, m = files
    argv, expect = cases(d, m)[name]
    capfd.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capfd.readouterr()
    assert rc == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvprimer: error: ") and expect in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["model truncated", "state for another model", "prompt over context",
                                  "-c wraps uint32"])
def test_bad_input_in_a_real_process(files, name):
    d, m = files
    argv, expect = cases(d, m)[name]
    r = subprocess.run([sys.executable, "-m", "app.cli", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


def test_bench_reports_a_bad_row_and_runs_the_others(files, capfd):
    d, m = files
    long_value = "hello world of the answer " * 60  # too long for -c 256 once filled in
    (d / "mixed.csv").write_text(f"c,q\nthe world,hi?\n{long_value},hi?\nthe answer,why?\n")
    capfd.readouterr()
    rc = main(["bench", str(d / "t.tmpl"), *m, "--rows", str(d / "mixed.csv"), "--max-tokens", "2",
               "--reuse", "prefix", "--repeat", "1", "--json-out", str(d / "out.json")])
    out, _ = capfd.readouterr()
    assert rc == 3  # some rows failed: ExitCode.ROWS_FAILED
    import json
    rows = json.loads((d / "out.json").read_text())["rows"]
    assert [r["row"] for r in rows] == [2, 3, 4]
    assert rows[0]["error"] is None and rows[2]["error"] is None
    assert "tokens but the context holds" in rows[1]["error"]
    assert rows[0]["tokens_equal"] and rows[2]["tokens_equal"]
    assert any(line.split()[:3] == ["3", "prefix", "error:"] and "the prompt has" in line
               for line in out.splitlines()), out
