"""Widgets follow the Qt-free models' events (app/engine/events.py) for as long as they live.

A Qt connection is dropped with its receiver; a plain-Python callback is not, and would later
be called on a deleted widget (PySide raises "already deleted"): ``follow`` drops it when the
widget is destroyed. The models are written on the GUI thread, so callbacks run there.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject

from ..engine.events import Event


def follow(owner: QObject, event: Event, callback: Callable) -> Callable:
    """Connect ``callback`` to ``event`` until ``owner`` is destroyed; return the callback."""
    event.connect(callback)
    # the lambda must not hold owner: it runs while owner's C++ object is being destroyed
    owner.destroyed.connect(lambda *_: event.disconnect(callback))
    return callback
