"""The one list of `kvprimer` commands and the argument parser built from it.

The bundle's launcher (packaging/kvprimer_launcher.py) reads `COMMAND_NAMES` from here, so a
command added to `COMMANDS` reaches the command line in the bundle too.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from .cache_commands import cache_options, cmd_cache
from .chat_commands import cmd_render, render_options
from .engine_options import shared_options
from .exit_codes import ExitCode
from .kv_commands import cmd_kv, kv_options
from .server_commands import cmd_deploy, cmd_serve, deploy_options, serve_options
from .run_commands import (bench_options, cmd_bench, cmd_demo, cmd_info, cmd_prime, cmd_run,
                           info_options, no_options, prime_options, run_options)


@dataclass(frozen=True)
class Command:
    name: str
    handler: Callable[[argparse.Namespace], int]  # returns the exit code
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]


COMMANDS: tuple[Command, ...] = (
    Command("info", cmd_info, "model facts and KV bytes per token", info_options),
    Command("prime", cmd_prime, "evaluate a template's static prefix and save its state", prime_options),
    Command("run", cmd_run, "run a filled template cold and warm", run_options),
    Command("bench", cmd_bench, "cold vs warm over rows of values", bench_options),
    Command("render", cmd_render, "print a template's prompt as the model reads it (a chat "
            "template in the model's own chat template) and its tokens", render_options),
    Command("kv", cmd_kv, "prime into sequence 0, fork, show the KV cells", kv_options),
    Command("cache", cmd_cache, "prime, run rows warm, list the radix cache's tiers and prompts; "
            "--clear empties it", cache_options),
    Command("serve", cmd_serve, "start a llama-server whose settings match KV Primer's states",
            serve_options),
    Command("deploy", cmd_deploy, "prime a template and restore its prefix into a llama-server slot",
            deploy_options),
    Command("demo", cmd_demo, "prime the RAG example and run its first row", no_options),
)
COMMAND_NAMES = frozenset(c.name for c in COMMANDS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line
        self.exit(ExitCode.BAD_INPUT, f"kvprimer: error: {message} (see kvprimer --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = shared_options()
    ap = _Parser(prog="kvprimer", description="Prime a prompt template's static prefix once; "
                 "restore it on every call and evaluate only the rest.")
    ap.add_argument("--version", action="store_true", help="print versions and exit")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)
    for c in COMMANDS:
        c.add_options(sub.add_parser(c.name, parents=[common], help=c.help))
    return ap
