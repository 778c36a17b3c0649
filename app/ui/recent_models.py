"""The models loaded lately, newest first, in File ▸ Recent models and in the Model panel's
drop-down, with the default model in both.

Choosing one sets it in the Model panel, as the file chooser does: it loads with Apply, with
the context and the other settings beside it (a file dropped on the window loads at once).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMenu

from ..engine import default_model_path

MAX_RECENT = 8
KEY = "recentModels"
DEFAULT = ""  # the entry of the default model: no path of the user's


def default_name() -> str:
    try:
        return Path(default_model_path()).name
    except Exception:  # not downloaded yet: it still loads (and downloads) with Apply
        return "SmolLM2-135M-Instruct"


class RecentModels:
    def __init__(self, settings: QSettings, menu: QMenu, panel):
        """``panel``: the Model dock (its form's drop-down and ``choose``)."""
        self.settings, self.menu, self.panel = settings, menu, panel
        self.fill()

    def paths(self) -> list[str]:
        v = self.settings.value(KEY, [])
        return [v] if isinstance(v, str) else list(v or [])

    def add(self, path: str) -> None:
        recent = [p for p in self.paths() if p != path]
        recent.insert(0, path)
        self.settings.setValue(KEY, recent[:MAX_RECENT])
        self.fill()

    def entries(self) -> list[tuple[str, str]]:
        """(name shown, path) of each recent model, then the default model (path "")."""
        return [(Path(p).name, p) for p in self.paths()] + \
            [(f"default model ({default_name()})", DEFAULT)]

    def fill(self) -> None:
        self.menu.clear()
        entries = self.entries()
        self.panel.form.set_recent(entries)
        for name, path in entries:
            a = self.menu.addAction(name)
            a.setToolTip(path or "The model KV Primer downloads on its first start")
            a.triggered.connect(lambda _=False, p=path: self.panel.choose(p))
