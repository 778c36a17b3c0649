"""The bundle's launcher sends every CLI command to the CLI and the rest to the window, reading the
CLI's own command list (checked here without building the bundle)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from app.cli.parser import COMMAND_NAMES, build_parser
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
LAUNCHER = ROOT / "packaging" / "kvprimer_launcher.py"


def _launcher():
    spec = importlib.util.spec_from_file_location("kvprimer_launcher", LAUNCHER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_cli_command_goes_to_the_cli():
    launcher = _launcher()
    assert {"info", "prime", "run", "bench", "kv", "demo"} <= COMMAND_NAMES
    for name in COMMAND_NAMES:
        assert launcher.wants_cli([name, "--help"]), name
    assert launcher.wants_cli(["--version"])


def test_window_options_go_to_the_window():
    launcher = _launcher()
    assert not launcher.wants_cli([])
    assert not launcher.wants_cli(["--screenshot", "out.png"])
    assert not launcher.wants_cli(["--model", "kv"])


def test_launcher_shows_the_kv_commands_help():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(LAUNCHER), "kv", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: kvprimer kv ")
    assert "--fork K" in r.stdout
    assert r.stdout == _help_of("kv")


def _help_of(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command].format_help()
