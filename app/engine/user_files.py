"""Files the user names (templates, rows, states, projects): reading them with errors that
say what to do, and saving them atomically.

Every reader raises its own engine error class (TemplateError, RowsError, StateFileError), so
the message names the kind of file as well as the problem.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Iterable

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


# ---- saving: atomic, so that a crash leaves the old file or none, never half of one ---------

STALE_TEMP_S = 600


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Temp files left by killed saves of this target (a live save's file is younger than
    STALE_TEMP_S, so it is left alone)."""
    now = time.time()
    for old in folder.glob(f".{name}.*.tmp"):
        try:
            if now - old.stat().st_mtime > STALE_TEMP_S:
                old.unlink()
        except OSError:
            pass


def atomic_write(path: Path, chunks: Iterable[bytes], error: type[KvPrimerError], what: str) -> None:
    """Write ``chunks`` to a temp file in the same folder, fsync, rename over ``path``.

    Errors are ``error`` with a message that says the ``what`` (state, project) is still in
    memory, so the user saves it elsewhere instead of losing it.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _remove_stale_temps(folder, path.name)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except FileNotFoundError:
        raise error(f"cannot save to {path}: the folder {folder} does not exist") from None
    except OSError as e:
        raise error(f"cannot save to {path}: {e.strerror}; choose another folder") from None
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise error(f"cannot save to {path}: {e.strerror}; the {what} is still in memory, "
                    "save it elsewhere") from None
    try:  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
