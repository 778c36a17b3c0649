"""Where the window's file dialogs start: the folder last used for that kind of file, else the
one last used for any, else the user's Documents folder (QStandardPaths) — never the folder the
app was started from, which for a source checkout is the code.

A save dialog never starts in the examples that come with the app (a folder of the app's own,
read-only once installed): there it starts in the user's folder instead.

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


def app_folder(folder) -> bool:
    """Whether ``folder`` is the app's own examples folder (or inside it)."""
    from ..resources_path import examples_dir

    try:
        return Path(str(folder)).resolve().is_relative_to(examples_dir().resolve())
    except OSError:
        return False


class FileFolders:
    def __init__(self, settings: QSettings):
        self.settings = settings

    def folder(self, kind: str, saving: bool = False) -> Path:
        """Where a dialog for ``kind`` ("project", "template", "rows", "export") starts."""
        for key in (kind, ANY):
            value = self.settings.value(KEY + key, "")
            if value and Path(str(value)).is_dir() and not (saving and app_folder(value)):
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
        start = Path(name) if Path(name).is_absolute() and not app_folder(Path(name).parent) \
            else self.folder(kind, saving=True) / Path(name).name
        path, chosen = QFileDialog.getSaveFileName(parent, title, str(start), filters)
        if path:
            self.remember(kind, path)
        return path, chosen
