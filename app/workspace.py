"""A KV Primer project (template, rows, settings, results) and its file, Qt-free.

A project file is UTF-8 JSON with a format number. Saves are atomic (the state files' writer),
so a crash leaves the old file or the new one. Autosave writes the same format to one file in
the user's data folder; a clean exit deletes it, so finding it at start means the last session
ended badly and its work can be offered back.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .engine.errors import KvPrimerError
from .engine.user_files import atomic_write

FORMAT = 1
SUFFIX = ".kvproj"


class WorkspaceError(KvPrimerError):
    """A project file cannot be read or written."""


@dataclass
class Workspace:
    template: str = ""
    template_path: str = ""
    placeholders: list[str] = field(default_factory=list)
    rows: list[dict[str, str]] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # engine config and run options
    results: list[dict] = field(default_factory=list)  # run and benchmark results, as dicts

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, name: str = "project") -> "Workspace":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise WorkspaceError(f"{name} is not a KV Primer project (invalid JSON: {e})") from None
        except RecursionError:  # thousands of nested brackets
            raise WorkspaceError(f"{name} is not a KV Primer project (JSON nested too deeply)") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise WorkspaceError(f"{name} is not a KV Primer project of format {FORMAT}; "
                                 "open a .kvproj file saved by this version")
        try:
            ws = cls(template=str(data.get("template", "")),
                     template_path=str(data.get("template_path", "")),
                     placeholders=[str(p) for p in data.get("placeholders", [])],
                     rows=[{str(k): str(v) for k, v in r.items()} for r in data.get("rows", [])],
                     settings=dict(data.get("settings", {})),
                     results=list(data.get("results", [])))
        except (AttributeError, TypeError, ValueError):
            raise WorkspaceError(f"{name} is corrupt: a field has the wrong type") from None
        return ws

    def save(self, path: str | Path) -> None:
        path = Path(path)
        atomic_write(path, (self.to_json().encode("utf-8"),), WorkspaceError, "project")

    @classmethod
    def load(cls, path: str | Path) -> "Workspace":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise WorkspaceError(f"no project file at {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise WorkspaceError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        return cls.from_json(text, path.name)


def autosave_path(folder: str | Path | None = None) -> Path:
    """Where the autosave lives (the user's data folder unless a folder is given, as in tests)."""
    if folder is None:
        from platformdirs import user_data_path

        folder = user_data_path("kvprimer", appauthor=False)
    return Path(folder) / f"autosave{SUFFIX}"


class Autosaver:
    """Writes the workspace when asked and something changed; forgets it on a clean exit."""

    def __init__(self, path: Path):
        self.path = path
        self._last = ""

    def pending_restore(self) -> Workspace | None:
        """The autosaved workspace left by a session that did not exit cleanly, if readable."""
        if not self.path.is_file():
            return None
        try:
            return Workspace.load(self.path)
        except WorkspaceError:
            return None

    def write(self, ws: Workspace) -> bool:
        text = ws.to_json()
        if text == self._last:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, (text.encode("utf-8"),), WorkspaceError, "project")
        self._last = text
        return True

    def discard(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._last = ""
