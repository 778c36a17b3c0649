"""The options of runs and benchmarks as boxes bound to the session's options: the reuse mode
and "always measure noise", changed through SessionEdits (undoable). Compose's recompute
setting has its box beside compose's columns (compose_columns.py)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QWidget

from ..engine import REUSE_MODES
from ..engine.session import Options, Session
from .session_edits import SessionEdits

MODE_TIPS = {
    "prefix": "Reuse the template's static prefix only",
    "chain": "Reuse the longest cached prompt: earlier rows with the same first values too (exact)",
    "compose": "Compose the prefix with cached modules of each value (fast, approximate: "
               "modules never attended to each other)",
}


def reuse_mode_box(session: Session, edits: SessionEdits, parent: QWidget | None = None
                   ) -> QComboBox:
    """The reuse mode of runs, bound to the session's options."""
    box = QComboBox(parent)
    box.setObjectName("reuseMode")
    for i, m in enumerate(REUSE_MODES):
        box.addItem(m, m)
        box.setItemData(i, MODE_TIPS[m], Qt.ToolTipRole)
    box.setToolTip("How a warm run reuses the radix cache: " +
                   "; ".join(f"{m}: {t}" for m, t in MODE_TIPS.items()))

    def show(o: Options) -> None:
        if box.currentData() != o.reuse_mode:
            box.setCurrentIndex(max(box.findData(o.reuse_mode), 0))

    show(session.options)
    box.currentIndexChanged.connect(lambda _i: edits.set_option("reuse_mode", box.currentData(),
                                                                text="set the reuse mode"))
    session.events.options.connect(show)
    return box


def noise_box(session: Session, edits: SessionEdits, parent: QWidget | None = None) -> QCheckBox:
    """Whether every run measures the noise floor, bound to the session's options."""
    box = QCheckBox("always measure noise", parent)
    box.setObjectName("measureNoise")
    box.setToolTip("Also evaluate the prompt a third time, in plain batches (the model's own "
                   "noise floor), on every run. Without it only runs whose warm result differs "
                   "from the cold one pay for it: a bit-identical run needs no noise floor")

    def show(o: Options) -> None:
        if box.isChecked() != o.measure_noise:
            box.setChecked(o.measure_noise)

    show(session.options)
    box.toggled.connect(lambda on: edits.set_option("measure_noise", on,
                                                    text="always measure noise" if on
                                                    else "measure noise only when needed"))
    session.events.options.connect(show)
    return box
