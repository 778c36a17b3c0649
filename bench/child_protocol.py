"""How the bench's child processes answer (scale_ours.py, scale_peer_child.py; peer_child.py
writes it out): a JSON request on stdin, one JSON answer on stdout, everything llama.cpp prints
on stderr, and an exception turned into one line for the parent to show."""
from __future__ import annotations

import json
import os
import sys


def _plain(x):
    """numpy scalars as numbers; anything else JSON cannot hold as its text."""
    return x.item() if hasattr(x, "item") else str(x)


def answer_request(serve) -> int:
    """Run ``serve(request)`` on the request read from stdin and write its answer to stdout;
    the process's exit code (0 when the answer says ok)."""
    request = json.load(sys.stdin)
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # anything llama.cpp prints goes to stderr; stdout carries the answer only
    try:
        answer = serve(request)
    except Exception as e:  # noqa: BLE001 - the parent turns it into one line for the user
        answer = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        json.dump(answer, out, default=_plain)
    return 0 if answer["ok"] else 1
