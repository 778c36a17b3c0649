"""The Cache panel's bars: each tier's use against its cap, its nodes and any kept copies.

A tier's name and text are a line of their own above a thin bar, never over the bar: drawn on
a QProgressBar's fill, the characters at the fill's edge were half white on the fill and half
dark beside it, cut by the edge's line, and a text wider than the bar lost both ends. The line
fits a 380-pixel panel; narrower, the text ends in "…", whole in its tooltip (it does not wrap:
a wrapping label makes the scrolling panel as tall as it would like, the tree's buttons pushed
below the fold). The bytes of the kept copies are in the tooltip too (``tier_tip``).
"""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QVBoxLayout, QWidget

from ..engine.cache.radix_cache import TierUsage
from .byte_sizes import size_text
from .narrow_widgets import ElidedLabel

TIERS = {"resident": "resident (KV cells)", "ram": "RAM", "file": "files"}
TIER_TIPS = {
    "resident": "Nodes whose cells are in the KV cache, ready to fork",
    "ram": "Nodes whose cells are a snapshot in memory, and kept copies: the state of each "
           "node's last copy into the work context, kept so that the next run of the same "
           "prompt only restores it. Kept copies are dropped first when the cap is reached.",
    "file": "Nodes whose cells are a snapshot in a file of the cache's folder"}
BAR_HEIGHT = 6  # pixels: a bar that only shows how full the tier is, its text above it
TITLE_GAP = 8  # pixels between a tier's name and its text


def plural(n: int, one: str, many: str = "") -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def tier_text(t: TierUsage) -> str:
    """What a tier's bar says: its use against the cap, its nodes, and any kept copies."""
    text = f"{size_text(t.used_bytes)} / {size_text(t.cap_bytes)} · {plural(t.nodes, 'node')}"
    if t.kept_copies:
        text += f" + {plural(t.kept_copies, 'kept copy', 'kept copies')}"
    return text


def tier_tip(t: TierUsage) -> str:
    tip = TIER_TIPS[t.name]
    if t.kept_copies:
        tip += (f"\nNow: {plural(t.nodes, 'node')} and "
                f"{plural(t.kept_copies, 'kept copy', 'kept copies')} of "
                f"{size_text(t.kept_bytes)}, {size_text(t.used_bytes)} in all.")
    return tip


class TierBar(QWidget):
    """One tier: its name and text on a line, then a thin bar of its use against the cap."""

    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.name = name
        self.setObjectName(f"tier_{name}")
        self.title = QLabel(TIERS[name])
        self.label = ElidedLabel("—")
        self.label.setObjectName(f"tier_{name}_text")
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(BAR_HEIGHT)
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        line = QHBoxLayout()
        line.setSpacing(TITLE_GAP)  # else the parent's 1 px: "RAM40.6 MB" read as one word
        line.addWidget(self.title)
        line.addWidget(self.label, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(1)
        lay.addLayout(line)
        lay.addWidget(self.bar)
        self._show_tip(TIER_TIPS[name])

    def _show_tip(self, tip: str) -> None:
        self.setToolTip(tip)  # the title's and the bar's, which have none of their own
        self.label.setToolTip(f"{self.label.text()}\n{tip}")  # its whole text first, if cut

    def text(self) -> str:
        return self.label.text()

    def value(self) -> int:
        return self.bar.value()

    def show_usage(self, t: TierUsage | None) -> None:
        """``t``'s use (None: no model, no cache), changing only what changed: live pictures
        come many times a second while a job runs."""
        cap_kb = max(t.cap_bytes // 1000, 1) if t else 1  # kB: a progress bar holds an int
        if self.bar.maximum() != cap_kb:
            self.bar.setRange(0, cap_kb)
        used = min(t.used_bytes // 1000, cap_kb) if t else 0
        if self.bar.value() != used:
            self.bar.setValue(used)
        text = tier_text(t) if t else "—"
        if self.label.text() != text:
            self.label.setText(text)
            self._show_tip(tier_tip(t) if t else TIER_TIPS[self.name])
