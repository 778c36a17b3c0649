"""Where the shipped resources (examples, icon) are: the source tree's resources/ folder, or
``app/resources`` inside an installed wheel or a PyInstaller bundle."""
from __future__ import annotations

from pathlib import Path


def resources_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "resources", here / "resources"):
        if (candidate / "examples").is_dir():
            return candidate
    raise FileNotFoundError("KV Primer's resources folder is missing; reinstall the package")


def examples_dir() -> Path:
    return resources_dir() / "examples"
