"""The README's commands are commands the CLI takes, and its sample output is what the CLI prints.

Every `kvprimer ...` line in the README's code blocks is parsed by the CLI's own parser, with
each optional part (`[--clear]`, `[--api llama|openai]`) both left out and put in, and the files
it names must exist. The bench table the README shows is compared, line by line, with the shape
of what `kvprimer bench` prints on the tiny model: the same columns, the same words, the
numbers aside. A renamed option or a changed table fails here instead of misleading a reader.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from app.cli import main
from app.cli.parser import build_parser
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
README = (ROOT / "README.md").read_text(encoding="utf-8")


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:sh|text)\n(.*?)```", text, re.S)


def readme_commands() -> list[str]:
    """Each `kvprimer` command line of the README's code blocks, continuations joined and the
    comment after it dropped."""
    out = []
    for block in code_blocks(README):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ").removeprefix(".venv/bin/")
            if line.startswith("kvprimer "):
                out.append(re.sub(r"\s+#.*$", "", line))
    return out


def variants(command: str) -> list[list[str]]:
    """The command without its optional parts, and with each in (the first of a|b choices)."""
    optional = re.findall(r"\[([^\[\]]+)\]", command)
    bare = re.sub(r"\s*\[[^\[\]]+\]", "", command)
    full = re.sub(r"\[([^\[\]]+)\]", lambda m: re.sub(r"(\S+)\|\S+", r"\1", m.group(1)), command)
    return [shlex.split(bare)[1:], shlex.split(full)[1:]] if optional else [shlex.split(bare)[1:]]


def test_the_readme_shows_the_commands():
    names = {c.split()[1] for c in readme_commands()}
    assert {"info", "prime", "run", "bench", "cache", "kv", "serve", "deploy"} <= names, names


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_parses_as_written(command):
    if "..." in command.replace('="..."', ""):
        pytest.skip("an elided example: the line shows options only")
    for argv in variants(command):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"`kvprimer {' '.join(argv)}` is refused by the CLI (exit {e.code})")
        for arg in argv:
            if arg.startswith("resources/"):
                assert (ROOT / arg).exists(), f"{arg} (in `{command}`) is not in the repository"


def shape(line: str) -> str:
    """A line with its numbers as N and its runs of spaces as one."""
    return " ".join(re.sub(r"\d[\d,.]*", "N", line).split())


def test_the_readme_bench_table_is_what_the_cli_prints(tiny_model, tmp_path, capsys):
    block = next(b for b in code_blocks(README) if "kvprimer bench" in b and "verdict" in b)
    shown = [line for line in block.splitlines()[1:] if line.strip() and line.strip() != "..."]
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("You are a helpful assistant. Answer the question.\n<c1>\nQ: <question>\nA:")
    rows = tmp_path / "rows.csv"
    rows.write_text("c1,question\nhello world,why?\nthe world,how?\n")
    argv = shlex.split(block.splitlines()[0])[2:]  # as the README runs it, on this template
    argv[argv.index("resources/examples/rag.tmpl")] = str(tpl)
    argv[argv.index("--rows") + 1] = str(rows)
    assert main([argv[0], *argv[1:], "-m", str(tiny_model), "-t", "1"]) == 0
    printed = {shape(line) for line in capsys.readouterr().out.splitlines()}
    missing = [line for line in shown if shape(line) not in printed]
    assert not missing, f"the README shows lines the CLI does not print: {missing}"
