"""One output rule for every `kvprimer` command: words for people on stdout by default;
``--json`` prints the same result as JSON on stdout instead; ``--json-out FILE`` also writes
the JSON to FILE. Booleans read as yes/no in the words."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

from ..engine import KvPrimerError


def output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    g.add_argument("--json-out", metavar="FILE", help="also write the result as JSON to FILE")


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def emit(args, data: dict, words: Callable[[], None]) -> None:
    """Write ``data`` to --json-out, then print it as JSON (--json) or call ``words``."""
    text = json.dumps(data, indent=2)
    if args.json_out:
        try:
            Path(args.json_out).write_text(text + "\n", encoding="utf-8")
        except OSError as e:
            raise KvPrimerError(f"cannot write {args.json_out} ({e.strerror})") from None
    if args.json:
        print(text)
        return
    words()
    if args.json_out:
        print(f"wrote {args.json_out}")
