"""Render resources/icon.svg to PNGs with Qt's own SVG renderer (no display needed).

    QT_QPA_PLATFORM=offscreen python packaging/render_icons.py

Writes resources/icon.png (256 px, shipped in the wheel and the bundle) and the freedesktop
hicolor sizes under packaging/icons/hicolor/<N>x<N>/apps/kvprimer.png.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "icon.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(renderer: QSvgRenderer, size: int, out: Path) -> None:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(out), "PNG"):
        raise SystemExit(f"could not write {out}")


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"{SVG} is not a valid SVG")
    render(renderer, 256, ROOT / "resources" / "icon.png")
    for size in SIZES:
        render(renderer, size, ROOT / "packaging" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "kvprimer.png")
    print(f"rendered {SVG.name} to resources/icon.png and {len(SIZES)} hicolor sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
