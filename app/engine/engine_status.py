"""What front ends show about the engine, as one Qt-free model with events.

One thread owns the engine (app/ui/engine_worker.py in the window); the views must not reach
into it, nor into the worker, to learn whether a model is loaded, whether the user's job runs
or whether the KV cells may have changed. The worker writes an ``EngineStatus`` on the GUI
thread after every submit and delivery; panels connect to its events and read its fields
(napari's pattern: Qt-free models with events, thin views). The CLI or a test can drive one
without Qt.

Each field has an event of the same name, called with the field's new value. ``update`` sets
every field it is given before it emits anything, so a callback reads a consistent model; the
events then fire in field order. Setting a field to the value it holds emits nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .engine_config import EngineConfig, ModelInfo
from .events import Event
from .engine_kernels import KernelStatus
from .llama.kernel_choice import KernelChoice


@dataclass
class EngineStatusEvents:
    """One event per field of ``EngineStatus``, in the same order (the order they fire in)."""
    info: Event = field(default_factory=Event)  # (ModelInfo | None): config is already set
    config: Event = field(default_factory=Event)  # (EngineConfig | None)
    cache_revision: Event = field(default_factory=Event)  # (int): re-read the cells and cache
    busy: Event = field(default_factory=Event)  # (bool)
    working: Event = field(default_factory=Event)  # (bool)
    loading: Event = field(default_factory=Event)  # (bool)
    job: Event = field(default_factory=Event)  # (str)
    kernel_measurement: Event = field(default_factory=Event)  # (KernelStatus | None)
    closed: Event = field(default_factory=Event)  # (bool)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineStatusEvents))


@dataclass(eq=False)
class EngineStatus:
    """The loaded model, what runs, and how often the KV cells or the radix cache changed.

    Assigning a field (``status.busy = True``) is an ``update`` of that one field.
    """
    info: ModelInfo | None = None  # the loaded model; None until one loads
    # the settings it runs with; remeasure_kernels is always False (a request, not a setting)
    config: EngineConfig | None = None
    # bumped after every job that can change the KV cells or the radix cache, whatever its
    # outcome (a cancelled run may have evaluated half its batches): views of them re-read on it
    # instead of each deciding from the job's kind. A model load bumps it too: new empty cells.
    cache_revision: int = 0
    busy: bool = False  # any job queued or running, background reads included
    working: bool = False  # a job the user started (not a background read) queued or running
    loading: bool = False  # a model load queued or running
    job: str = ""  # the label of the user's job that runs ("run both", "prime"), "" when none
    # the attention-kernel measurement: wanted, running (steps, time left) or done, and its
    # latest news ("switched to flash attention on…"); None before a model loads
    kernel_measurement: KernelStatus | None = None
    closed: bool = False  # the worker is shut down: nothing more will run
    events: EngineStatusEvents = field(default_factory=EngineStatusEvents, init=False,
                                       repr=False)
    # each field's value as subscribers last heard it (differs from the field only mid-update)
    _told: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._told.update({n: getattr(self, n) for n in FIELDS})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FIELDS and "events" in self.__dict__:  # after __init__: a change to publish
            self.update(**{name: value})
        else:
            object.__setattr__(self, name, value)

    def update(self, **changes: Any) -> tuple[str, ...]:
        """Set the given fields, then emit the event of each whose value subscribers have not
        heard yet; return the names of the events this call emitted.

        A callback may update the model again (a panel that submits a job makes the worker
        busy while the update that found it idle is still emitting). Each event compares with
        the value last told, not the one last set, so subscribers hear every field's current
        value once, and never a value that was already replaced ("idle" while a job is queued).
        """
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise TypeError(f"EngineStatus has no field {', '.join(sorted(unknown))}")
        for n, value in changes.items():
            object.__setattr__(self, n, value)
        told = []
        for n in FIELDS:
            value = getattr(self, n)
            if n in changes and value != self._told[n]:
                self._told[n] = value
                told.append(n)
                getattr(self.events, n).emit(value)
        return tuple(told)

    def bump_cache_revision(self) -> int:
        """Say that the KV cells or the radix cache may have changed; return the new revision."""
        self.update(cache_revision=self.cache_revision + 1)
        return self.cache_revision

    @property
    def ready(self) -> bool:
        """A model is loaded, no job of the user's runs and the worker is open: the actions that
        start engine work may be enabled (a change of info, working or closed changes it)."""
        return self.info is not None and not self.working and not self.closed

    @property
    def kernels(self) -> KernelChoice | None:
        """The attention kernel the loaded model runs, and why (measured or set)."""
        return self.info.kernels if self.info is not None else None
