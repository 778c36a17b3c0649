"""The `kvprimer` command line: the same engine API the window uses.

Exit codes are defined once, in `exit_codes.ExitCode` (0 done, 1 runs differ, 2 bad input:
one line on stderr and no traceback, 3 some rows failed, 130 interrupted). Engine messages name
concepts; `flag_hints.with_flags` adds the options that act on them.
The commands and their options are listed once, in `parser.COMMANDS`; the bundle's launcher
reads the same list to tell command-line calls from window starts.
"""
from __future__ import annotations

import logging
import sys

from ..engine import KvPrimerError
from ..versions import version_text
from .exit_codes import ExitCode
from .flag_hints import with_flags
from .parser import COMMANDS, build_parser

__all__ = ["main", "version_text"]


def main(argv: list[str] | None = None) -> int:
    # llama.cpp's warnings go to the "kvprimer.llama" logger; without a handler Python would
    # print them to stderr around our one-line error (which already quotes the one that matters)
    root = logging.getLogger("kvprimer")
    if not root.handlers:
        root.addHandler(logging.NullHandler())
    args = build_parser().parse_args(argv)
    if args.version:
        print(version_text())
        return ExitCode.OK
    if not args.command:
        build_parser().print_help()
        return ExitCode.OK
    handlers = {c.name: c.handler for c in COMMANDS}
    try:
        return handlers[args.command](args)
    except KvPrimerError as e:
        print(f"kvprimer: error: {with_flags(str(e))}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print("kvprimer: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
