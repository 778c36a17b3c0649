"""Opening files the user names (templates, rows, states) with errors that say what to do.

Every reader raises its own engine error class (TemplateError, RowsError, StateFileError), so
the message names the kind of file as well as the problem.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from .errors import KvPrimerError


def open_user_file(path: str | os.PathLike, error: type[KvPrimerError], kind: str) -> BinaryIO:
    p = Path(path)
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise error(f"no {kind} at {p}") from None
    except IsADirectoryError:
        raise error(f"{p} is a folder, not a {kind}") from None
    except OSError as e:
        raise error(f"cannot read {p}: {e.strerror}") from None


def read_user_text(path: str | os.PathLike, error: type[KvPrimerError], kind: str,
                   max_bytes: int | None = None) -> str:
    """The file as UTF-8 text (a BOM is dropped); bad bytes are reported with their line."""
    p = Path(path)
    with open_user_file(p, error, kind) as f:
        size = os.fstat(f.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise error(f"{p.name} is {size:,} bytes; a {kind} is limited to {max_bytes:,} bytes")
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise error(f"{p.name} line {line}: not UTF-8 text; save the file as UTF-8") from None
