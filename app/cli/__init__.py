"""The `kvprimer` command line: the same engine API the window uses.

Exit codes: 0 success, 2 bad input (one line on stderr, no traceback), 130 interrupted.
The commands and their options are listed once, in `parser.COMMANDS`; the bundle's launcher
reads the same list to tell command-line calls from window starts.
"""
from __future__ import annotations

import logging
import sys

from ..engine import KvPrimerError
from ..versions import version_text
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
        return 0
    if not args.command:
        build_parser().print_help()
        return 0
    handlers = {c.name: c.handler for c in COMMANDS}
    try:
        return handlers[args.command](args)
    except KvPrimerError as e:
        print(f"kvprimer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvprimer: interrupted", file=sys.stderr)
        return 130
