"""The one observer type of the Qt-free layer: models (the session, the engine's status) emit
an ``Event`` per kind of change, and front ends (the window's panels, the CLI, tests) connect
plain callbacks to it. No Qt here, so the engine and its tests stay free of an event loop."""
from __future__ import annotations

from typing import Callable


class Event:
    """Callbacks for one kind of change, called in the order they were connected."""

    def __init__(self) -> None:
        self._callbacks: list[Callable] = []

    def connect(self, callback: Callable) -> Callable:
        self._callbacks.append(callback)
        return callback

    def disconnect(self, callback: Callable) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def emit(self, *args) -> None:
        for cb in list(self._callbacks):  # a callback may disconnect itself while called
            cb(*args)
