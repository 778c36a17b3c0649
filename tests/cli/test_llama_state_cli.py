"""`kvprimer prime --format llama`, `--state` of either format, and `-ngl` on a CPU-only build."""
from __future__ import annotations

import json
import re

import pytest

from app.cli import main
from app.engine.states.llama_state_file import is_llama_state
from app.engine.states.prefix_state import NO_IDENTITY_NOTE

TPL = "<|im_start|>system\nhello world of the answer. the context is:\n<c>\n<|im_end|>\n<q>"
OTHER = "<|im_start|>user\nyou are a question of the world. <c> <q>"


@pytest.fixture
def setup(tmp_path, tiny_model):
    (tmp_path / "t.tmpl").write_text(TPL)
    (tmp_path / "other.tmpl").write_text(OTHER)
    (tmp_path / "rows.csv").write_text("c,q\nthe world,hello?\na world,the answer?\n")
    m = ["-m", str(tiny_model), "-t", "1", "-c", "256", "-b", "32"]
    return tmp_path, m


def test_prime_writes_llama_cpps_format_and_run_reads_it(setup, capfd):
    d, m = setup
    out = d / "slot.bin"
    assert main(["prime", str(d / "t.tmpl"), *m, "-o", str(out), "--format", "llama"]) == 0
    assert is_llama_state(out.read_bytes()[:4])
    capfd.readouterr()
    vals = ["--set", "c=the world", "--set", "q=hello?"]
    assert main(["run", str(d / "t.tmpl"), *m, *vals, "--state", str(out), "--json"]) == 0
    o, err = capfd.readouterr()
    rep = json.loads(o)
    assert rep["reused_tokens"] > 10 and rep["verdict"]["tokens_equal"]
    assert rep["verdict"]["equivalence"] == "bit-identical"
    assert err.count(NO_IDENTITY_NOTE) == 1 and err.startswith("kvprimer: note: ")

    assert main(["bench", str(d / "t.tmpl"), *m, "--rows", str(d / "rows.csv"), "--state", str(out)]) == 0
    _o, err = capfd.readouterr()
    assert err.count(NO_IDENTITY_NOTE) == 1


def test_default_format_has_no_note(setup, capfd):
    d, m = setup
    out = d / "p.kvstate"
    assert main(["prime", str(d / "t.tmpl"), *m, "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"KVPSTATE"
    capfd.readouterr()
    assert main(["run", str(d / "t.tmpl"), *m, "--set", "c=x", "--set", "q=y", "--state", str(out)]) == 0
    err = capfd.readouterr().err
    assert "note" not in err
    # the load is outside the warm run's time: said on its own line
    assert re.search(r"^kvprimer: loaded p\.kvstate: [\d,]+ tokens, [\d.]+ [kM]B in [\d,]+ ms$",
                     err, re.M)


def _fails_one_line(argv, capfd) -> str:
    capfd.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    _o, err = capfd.readouterr()
    assert rc == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith("kvprimer: note: ")]
    assert len(lines) == 1 and lines[0].startswith("kvprimer: error: "), err
    return lines[0]


def test_a_llama_state_for_another_templates_prefix_is_refused(setup, capfd):
    d, m = setup
    out = d / "slot.bin"
    assert main(["prime", str(d / "t.tmpl"), *m, "-o", str(out), "--format", "llama"]) == 0
    line = _fails_one_line(["run", str(d / "other.tmpl"), *m, "--set", "c=x", "--set", "q=y",
                            "--state", str(out)], capfd)
    assert "differ from the template's static prefix" in line


def test_bad_format_and_gpu_layers_on_a_cpu_build(setup, capfd, monkeypatch):
    import llama_cpp as L

    d, m = setup
    line = _fails_one_line(["prime", str(d / "t.tmpl"), *m, "-o", str(d / "x"), "--format", "gguf"], capfd)
    assert "invalid choice: 'gguf'" in line
    monkeypatch.setattr(L, "llama_supports_gpu_offload", lambda: False)
    line = _fails_one_line(["info", *m, "-ngl", "99"], capfd)
    assert "no GPU offload; reinstall it with GPU support (see README) or offload no layers" in line
    assert line.endswith("(-ngl)")  # the CLI names its option for the concept
    assert main(["info", *m, "-ngl", "0", "--json"]) == 0
