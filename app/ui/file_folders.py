"""Where the window's file dialogs start: the folder last used for that kind of file, else the
one last used for any, else the user's Documents folder (QStandardPaths) — never the folder the
app was started from, which for a source checkout is the code.

One ``FileFolders`` per window, over the window's QSettings (tests give it a file in a temp
folder). The dialogs themselves are Qt's static ones, so tests answer them as before.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths
from PySide6.QtWidgets import QFileDialog, QWidget

KEY = "folders/"
ANY = "any"


def documents_dir() -> Path:
    """The user's Documents folder, or their home when there is none."""
    docs = QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation)
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


class FileFolders:
    def __init__(self, settings: QSettings):
        self.settings = settings

    def folder(self, kind: str) -> Path:
        """Where a dialog for ``kind`` ("project", "template", "rows", "export") starts."""
        for key in (kind, ANY):
            value = self.settings.value(KEY + key, "")
            if value and Path(str(value)).is_dir():
                return Path(str(value))
        return documents_dir()

    def remember(self, kind: str, path: str | Path) -> None:
        """The user chose ``path``: dialogs for ``kind`` (and any other new kind) start there."""
        folder = str(Path(path).parent)
        self.settings.setValue(KEY + kind, folder)
        self.settings.setValue(KEY + ANY, folder)

    def open_file(self, parent: QWidget, kind: str, title: str, filters: str) -> str:
        path, _ = QFileDialog.getOpenFileName(parent, title, str(self.folder(kind)), filters)
        if path:
            self.remember(kind, path)
        return path

    def save_file(self, parent: QWidget, kind: str, title: str, name: str,
                  filters: str) -> tuple[str, str]:
        """(path, chosen filter); ``name``: the file name offered, or a whole path to start at."""
        start = Path(name) if Path(name).is_absolute() else self.folder(kind) / name
        path, chosen = QFileDialog.getSaveFileName(parent, title, str(start), filters)
        if path:
            self.remember(kind, path)
        return path, chosen
