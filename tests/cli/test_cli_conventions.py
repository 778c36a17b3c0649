"""`kvprimer`'s conventions: llama.cpp's option names and meanings, one source for defaults, one
--json rule, booleans as words, one exit code per outcome, messages that name concepts."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import app.cli.run_commands as run_commands
from app.cli import main
from app.cli.engine_options import engine_config, session_options
from app.cli.exit_codes import ExitCode
from app.cli.flag_hints import with_flags
from app.cli.parser import build_parser
from app.engine import Engine, EngineConfig, GenerationConfig, Template
from app.engine.runs import late_verify, prompt_runs
from app.engine.llama.native import ContextParams
from app.engine.session import Options
from app.engine.runs.verdict import DIVERGED, Verdict
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
TPL = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
       + "hello world of the answer and question. " * 3
       + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")
VALS = ["--set", "c=the world", "--set", "q=why?"]


@pytest.fixture
def files(tmp_path, tiny_model):
    (tmp_path / "t.tmpl").write_text(TPL, encoding="utf-8")
    (tmp_path / "rows.csv").write_text("c,q\nthe world,why?\nhello,how?\n", encoding="utf-8")
    return tmp_path, ["-m", str(tiny_model), "-tb", "1", "-c", "512", "-b", "32"]


def parse(*argv):
    return build_parser().parse_args(["info", *argv])


# ---- option names and meanings

def test_threads_follow_llama_cpp_t_generation_tb_batch():
    cfg = engine_config(parse("-t", "2", "-tb", "3"))
    assert (cfg.n_threads_gen, cfg.n_threads) == (2, 3)
    assert engine_config(parse("-tg", "4")).n_threads_gen == 4  # the old name still works
    long = engine_config(parse("--threads", "5", "--threads-batch", "6"))
    assert (long.n_threads_gen, long.n_threads) == (5, 6)


def test_generation_options_reach_the_session_options():
    args = build_parser().parse_args(["run", "t.tmpl", "-n", "7", "-s", "9", "--temp", "0.5"])
    opts = session_options(args)
    assert (opts.max_tokens, opts.seed, opts.temperature) == (7, 9, 0.5)
    old = build_parser().parse_args(["run", "t.tmpl", "--max-tokens", "5"])
    assert session_options(old).max_tokens == 5
    # unset options keep the base's (a project's) values
    assert session_options(build_parser().parse_args(["run", "t.tmpl"]),
                           Options(max_tokens=11)).max_tokens == 11


def test_defaults_are_defined_once():
    args = parse()
    cfg, ctx, gen = engine_config(args), ContextParams(), GenerationConfig()
    for f in ("n_ctx", "n_batch", "n_threads", "n_threads_gen", "type_k", "type_v", "n_ubatch"):
        assert getattr(cfg, f) == getattr(EngineConfig(), f) == getattr(ctx, f), f
    assert cfg.cache == EngineConfig().cache
    assert Options().max_tokens == gen.max_tokens and Options().generation() == gen
    run = build_parser().parse_args(["run", "t.tmpl"])
    assert session_options(run).generation() == gen


def test_the_window_takes_the_same_model_and_context_options():
    import app.__main__ as gui

    args = gui._parser().parse_args(["-m", "x.gguf", "-c", "8192", "-t", "2", "-tb", "3", "-ub", "64"])
    cfg = engine_config(args)
    assert (cfg.model_path, cfg.n_ctx, cfg.n_threads_gen, cfg.n_threads, cfg.n_ubatch) == (
        "x.gguf", 8192, 2, 3, 64)
    assert gui.main(["-c", "1"]) == ExitCode.BAD_INPUT  # before any window is made
    # with no engine option the window takes the reopened project's; any option wins over it
    assert gui.engine_options_given(engine_config(gui._parser().parse_args([]))) is None
    assert gui.engine_options_given(cfg) == cfg
    assert gui.engine_options_given(
        engine_config(gui._parser().parse_args(["-c", "2048"]))).n_ctx == 2048


def test_ubatch_reaches_llama_cpp_and_runs_stay_exact(tiny_model, files, capsys):
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_batch=32, n_ubatch=8,
                             n_threads=1)) as eng:
        assert eng.ctx.n_ubatch == 8 == eng.info.n_ubatch
        tpl = Template.parse(TPL)
        rep = prompt_runs.run_prompt(eng, tpl, {"c": "the world", "q": "why?"},
                                     gen=GenerationConfig(max_tokens=3))
        assert rep.verdict.exact
        assert eng.work.ctx.n_ubatch == 8  # the work context (warm runs) takes it too
    d, m = files
    assert main(["info", *m, "-ub", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_ubatch"] == 16
    assert main(["info", *m, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_ubatch"] == 32  # 0: the batch size


def test_seed_decides_what_sampling_generates(files, capsys):
    d, m = files

    def text(seed: str) -> str:
        assert main(["run", str(d / "t.tmpl"), *m, *VALS, "--warm", "--temp", "5", "-n", "12",
                     "-s", seed, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["warm"]["tokens"]

    first = text("1")
    assert text("1") == first
    assert any(text(s) != first for s in ("2", "3"))


# ---- one --json rule; booleans as words

@pytest.mark.parametrize("command", ["info", "prime", "run", "bench", "kv", "cache"])
def test_json_prints_json_and_json_out_writes_it(files, capsys, command):
    d, m = files
    t = str(d / "t.tmpl")
    argv = {"info": ["info"], "prime": ["prime", t, "-o", str(d / "s.kvstate")],
            "run": ["run", t, *VALS], "kv": ["kv", t, "--fork", "1"],
            "bench": ["bench", t, "--rows", str(d / "rows.csv"), "--reuse", "prefix", "--repeat", "1"],
            "cache": ["cache", t, "--rows", str(d / "rows.csv")]}[command] + [*m, "-n", "2"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = d / "out.json"
    assert main([*argv, "--json-out", str(out)]) == 0
    words = capsys.readouterr().out
    assert words.rstrip().endswith(f"wrote {out}")
    written = json.loads(out.read_text())
    assert set(written) == set(printed)
    assert "True" not in words and "False" not in words  # booleans read yes/no


def test_info_words_say_yes_and_no(files, capsys):
    d, m = files
    assert main(["info", *m]) == 0
    out = capsys.readouterr().out
    assert "gpu_offload" in out and ("  no" in out or "  yes" in out)
    assert " True" not in out and " False" not in out and "  1\n" not in out.split("gpu_offload")[1][:20]


# ---- exit codes

def test_exit_codes_each_mean_one_outcome(files, capfd, monkeypatch):
    d, m = files
    t = str(d / "t.tmpl")
    assert main(["run", t, *m, *VALS, "-n", "2"]) == ExitCode.OK == 0
    assert main(["run", t, *m, "--set", "c=x"]) == ExitCode.BAD_INPUT == 2
    with pytest.raises(SystemExit) as e:
        main(["run"])  # usage
    assert e.value.code == ExitCode.BAD_INPUT
    (d / "long.csv").write_text("c,q\nthe world,why?\n" + "hello world " * 80 + ",how?\n")
    assert main(["bench", t, *m, "--rows", str(d / "long.csv"), "--reuse", "prefix",
                 "--repeat", "1", "-c", "256", "-n", "2"]) == ExitCode.ROWS_FAILED == 3

    def diverged(warm, noise, note=""):
        return Verdict(DIVERGED, False, 0, 1.0, 0.5, 0.0, None, None, note, 1)

    monkeypatch.setattr(late_verify, "judge", diverged)  # where runs are judged
    assert main(["run", t, *m, *VALS, "-n", "2", "--reuse", "chain"]) == ExitCode.RUNS_DIFFER == 1
    assert main(["bench", t, *m, "--rows", str(d / "rows.csv"), "--reuse", "prefix",
                 "--repeat", "1", "-n", "2"]) == ExitCode.RUNS_DIFFER
    # compose is approximate by design: its divergence is reported, never a failure
    assert main(["run", t, *m, *VALS, "-n", "2", "--reuse", "compose"]) == ExitCode.OK
    monkeypatch.undo()

    def interrupted(args):  # Ctrl+C while the model loads
        raise KeyboardInterrupt

    monkeypatch.setattr(run_commands, "open_engine", interrupted)
    assert main(["info", *m]) == ExitCode.INTERRUPTED == 130


# ---- cache --clear

def test_cache_clear_empties_the_cache(files, capsys):
    d, m = files
    t = str(d / "t.tmpl")
    assert main(["cache", t, *m, "--rows", str(d / "rows.csv"), "-n", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"]
    assert main(["cache", t, *m, "--rows", str(d / "rows.csv"), "-n", "2", "--clear", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cleared"] > 0 and res["nodes"] == [] and all(x["nodes"] == 0 for x in res["tiers"])
    assert main(["cache", "--clear"]) == 0
    assert "the cache is empty" in capsys.readouterr().out
    assert main(["cache"]) == ExitCode.BAD_INPUT


# ---- messages: concepts in the engine, flags in the CLI

def _engine_strings():
    for path in sorted((ROOT / "app" / "engine").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                yield path.name, node.value


def test_engine_messages_name_no_cli_flags_and_no_window_controls():
    import re

    flag = re.compile(r"(^|[\s(])(--[a-z][a-z-]+|-(ngl|ctk|ctv|fa|ub|tb|tg)\b)")
    found = [(name, s) for name, s in _engine_strings()
             if flag.search(s) and "pip install" not in s and "kvprimer-crash-probe" not in s]
    assert found == []
    assert [(n, s) for n, s in _engine_strings() if "Cache panel" in s or "Ctrl+" in s] == []


def test_the_cli_adds_its_flags_to_concepts(files, capfd):
    assert with_flags("raise the context size to at least 300") == (
        "raise the context size to at least 300 (-c/--ctx-size)")
    assert "kvprimer cache --clear" in with_flags("llama.cpp refused a cached snapshot; clear the cache")
    assert with_flags("nothing to say") == "nothing to say"
    d, m = files
    long = "hello world " * 80
    assert main(["run", str(d / "t.tmpl"), *m, "-c", "256", "--set", f"c={long}", "--set", "q=?"]) == 2
    err = capfd.readouterr().err
    assert "raise the context size to at least" in err and err.rstrip().endswith("(-c/--ctx-size)")
