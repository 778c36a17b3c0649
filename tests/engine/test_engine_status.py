"""The engine status: a Qt-free model whose events fire once per change, in order, and never for
a value the field already holds. No Qt and no model file: milliseconds."""
from __future__ import annotations

import pytest

from app.engine import EngineConfig
from app.engine.engine_status import FIELDS, EngineStatus
from app.engine.events import Event


def record(status: EngineStatus, *names: str) -> list[tuple[str, object]]:
    got: list[tuple[str, object]] = []
    for n in names or FIELDS:
        getattr(status.events, n).connect(lambda v, n=n: got.append((n, v)))
    return got


def test_an_event_fires_once_per_change_and_not_for_an_equal_value():
    s = EngineStatus()
    got = record(s)
    s.busy = True
    s.busy = True  # the value it holds: nothing
    assert got == [("busy", True)]
    assert s.update(busy=True, job="") == ()  # nothing changed, nothing said
    s.config = EngineConfig(n_ctx=512)
    s.config = EngineConfig(n_ctx=512)  # another object, an equal value: nothing
    assert got == [("busy", True), ("config", EngineConfig(n_ctx=512))]


def test_an_update_sets_every_field_before_the_first_event_and_fires_in_field_order():
    s = EngineStatus()
    seen = []
    s.events.info.connect(lambda info: seen.append((info, s.config, s.cache_revision, s.working)))
    got = record(s)
    config = EngineConfig(n_ctx=256)
    info = object()  # any value: the model does not look inside
    assert s.update(working=True, cache_revision=1, config=config, info=info) == (
        "info", "config", "cache_revision", "working")
    assert seen == [(info, config, 1, True)]  # the callback read the whole update
    assert [n for n, _ in got] == ["info", "config", "cache_revision", "working"]
    assert s.ready is False  # a job of the user's runs
    s.working = False
    assert s.ready is True
    s.closed = True
    assert s.ready is False


def test_subscribers_are_called_in_the_order_they_connected_and_disconnect_works():
    s = EngineStatus()
    calls = []
    first = s.events.cache_revision.connect(lambda r: calls.append(("first", r)))
    s.events.cache_revision.connect(lambda r: calls.append(("second", r)))
    assert s.bump_cache_revision() == 1
    s.events.cache_revision.disconnect(first)
    s.events.cache_revision.disconnect(first)  # twice: harmless
    assert s.bump_cache_revision() == 2
    assert calls == [("first", 1), ("second", 1), ("second", 2)]


def test_a_callback_that_changes_a_field_again_has_the_last_word():
    # a panel refreshing on the revision submits a job: the worker sets busy again while the
    # update that cleared it is still emitting
    s = EngineStatus(busy=True)
    got = record(s, "busy")
    s.events.cache_revision.connect(lambda _r: s.update(busy=True))
    s.update(cache_revision=1, busy=False)
    assert got == [] and s.busy is True  # never told "idle" while a job is queued
    # busy fires before job: subscribers hear "idle", then "busy" again from the callback
    s.events.job.connect(lambda label: setattr(s, "busy", bool(label)))
    s.update(job="run", busy=False)
    assert got == [("busy", False), ("busy", True)] and s.busy is True


def test_an_unknown_field_is_refused_and_events_are_plain_python():
    s = EngineStatus()
    with pytest.raises(TypeError, match="no field nope"):
        s.update(nope=1)
    assert all(isinstance(getattr(s.events, n), Event) for n in FIELDS)
    assert s.kernels is None and s.info is None and s.cache_revision == 0


def test_a_callback_may_disconnect_itself_while_called():
    e, calls = Event(), []

    def once(v):
        calls.append(("once", v))
        e.disconnect(once)

    e.connect(once)
    e.connect(lambda v: calls.append(("always", v)))
    e.emit(1)
    e.emit(2)
    assert calls == [("once", 1), ("always", 1), ("always", 2)]
