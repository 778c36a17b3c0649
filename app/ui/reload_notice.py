"""What a reload did to the primed prefix, said in words with an offer to prime it again.

Loading a model (another file, another context size, any Apply) opens new contexts with an
empty KV cache: the prefix primed before is no longer resident, and the next run would
evaluate it again. The window says so on the status line and in the Model panel, whose line
carries a Prime again button; the line goes when a prefix is primed again or loaded.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from .model_events import follow


def prefix_dropped_text(state, old_info, new_info, why: str = "") -> str:
    """The sentence for a load that replaced ``old_info``'s contexts while ``state`` (the primed
    prefix, or None) was in use; ``why``: the session dropped the state itself (it no longer
    fits, another model). "" when nothing was primed."""
    if state is None:
        return ""
    if why:
        return f"the primed state was dropped: {why}"
    change = ""
    if old_info is not None and new_info is not None:
        if old_info.path != new_info.path:
            change = "another model is loaded: "
        elif old_info.n_ctx != new_info.n_ctx:
            change = f"the context is now {new_info.n_ctx:,} tokens (was {old_info.n_ctx:,}): "
    return (f"{change}the primed prefix ({state.n_tokens:,} tokens) is no longer in the KV "
            "cache; prime it again (Ctrl+P), or the next run evaluates it again")


class ReloadNotice(QWidget):
    """A line saying what the last reload dropped, and a Prime again button."""
    prime_requested = Signal()

    def __init__(self, session, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("reloadNotice")
        # a prefix primed (or loaded) again: nothing left to offer
        follow(self, session.events.state, lambda ref: ref.state is not None and self.offer(""))
        self.text = QLabel("")
        self.text.setObjectName("reloadNoticeText")
        self.text.setWordWrap(True)
        self.text.setStyleSheet("color: #a05a00")
        self.button = QPushButton("Prime again")
        self.button.setObjectName("primeAgain")
        self.button.setToolTip("Evaluate the template's static prefix again (Ctrl+P)")
        self.button.clicked.connect(self.prime_requested)
        self.button.clicked.connect(lambda: self.offer(""))
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.text, 1)
        lay.addWidget(self.button)
        self.hide()

    def offer(self, text: str) -> None:
        """Show ``text`` with the button ("" hides the line)."""
        self.text.setText(text)
        self.setVisible(bool(text))
