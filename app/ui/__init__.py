"""KV Primer's window (PySide6): thin views over app.engine.

A guard against a PySide6 bug runs on import. In PySide6 6.12.0, ``SignalInstance.emit()``
returns ``True`` without taking a reference to it, so every emit from Python drops one
reference to the ``True`` singleton; on Python 3.11 the count reaches zero after a few hundred
to a few thousand emits and the interpreter aborts ("Fatal Python error: bool_dealloc"), at
exit or in the middle of a session. We probe for the bug with one emit and, when it is there,
give ``True`` a reference count no session can use up. ``True`` is never freed anyway
(Python 3.12 makes it immortal, where the probe sees no drop and nothing is changed).
"""
from __future__ import annotations

import ctypes
import sys


def _emit_drops_a_reference_to_true() -> bool:
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    before = sys.getrefcount(True)
    probe.ping.emit()
    return sys.getrefcount(True) < before


def _guard_true_refcount() -> None:
    if _emit_drops_a_reference_to_true():
        ctypes.c_ssize_t.from_address(id(True)).value += 1 << 40


_guard_true_refcount()
