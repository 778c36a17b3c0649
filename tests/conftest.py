"""Shared fixtures: a tiny generated model for unit tests, the real default model for a few
integration tests, and isolation of every file the app writes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# one attention kernel for every engine the tests make: tests move states between engines (the
# kernel decides V's layout) and compare their logits, and a timing on a tiny model can come
# out either way; tests of the measurement itself ask for "auto"
os.environ["KVPRIMER_FLASH_ATTN"] = "on"

from tests.tiny_model import ARCHITECTURES, write_arch_model, write_tiny_model  # noqa: E402

TESTS = Path(__file__).resolve().parent
# fixtures that load a model in llama.cpp: a test using any of them is a native test
NATIVE_FIXTURES = {"tiny_model", "other_tiny_model", "arch_models", "engine", "default_model",
                   "make_window"}


def pytest_collection_modifyitems(items):
    """Markers from where a test lives and what it uses, so `-m "not gui"`, `-m docs` or
    `-m "not native"` pick a part of the suite (tests mirror the code's folders)."""
    for item in items:
        folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        if folder == "ui" or "qtbot" in item.fixturenames:
            item.add_marker(pytest.mark.gui)
        if folder == "docs":
            item.add_marker(pytest.mark.docs)
        if NATIVE_FIXTURES & set(item.fixturenames) or item.get_closest_marker("model"):
            item.add_marker(pytest.mark.native)


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Caches, settings and autosaves go to a temp folder, never the developer's home."""
    root = tmp_path_factory.mktemp("home")
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        os.environ[var] = str(root / var.lower())
    yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def other_tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models2") / "tiny-other.gguf", seed=99)


@pytest.fixture(scope="session")
def arch_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny model per architecture in tests.tiny_model.ARCHITECTURES, by name."""
    root = tmp_path_factory.mktemp("arch-models")
    return {a: write_arch_model(root / f"tiny-{a}.gguf", a) for a in ARCHITECTURES}


@pytest.fixture
def engine(tiny_model):
    from app.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def default_model() -> Path:
    from app.engine import default_model_path

    return default_model_path()  # raises with the install hint when `make setup` was skipped


@pytest.fixture(scope="session")
def examples() -> Path:
    from app.resources_path import examples_dir

    return examples_dir()


@pytest.fixture
def make_window(qtbot, tiny_model, tmp_path):
    """Real windows on the tiny model, sharing one settings file in tmp_path (a second window
    sees the first's layout); every file they write is in tmp_path. At the end, the window's
    Log must hold no internal error (its excepthook shows bugs there instead of failing)."""
    from PySide6.QtCore import QSettings

    from app.engine import EngineConfig
    from app.ui.main_window import MainWindow
    from tests.ui_actions import Answers

    made = []

    def make(n_batch=32, load=True, n_ctx=4096, **kw):
        cfg = EngineConfig(model_path=str(tiny_model), n_ctx=n_ctx, n_batch=n_batch, n_threads=1)
        opts = dict(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat),
                    states_dir=tmp_path / "states", autosave_dir=tmp_path / "autosave",
                    log_path=tmp_path / "kvprimer.log", ask=Answers(), open_example=False,
                    offer_restore=False, open_last=False, load_model=load)
        opts.update(kw)
        w = MainWindow(cfg, **opts)
        made.append(w)
        qtbot.addWidget(w)
        if load:
            qtbot.waitUntil(lambda: w.engine_status.info is not None and not w.engine_status.busy,
                            timeout=20000)
        return w
    yield make
    for w in made:
        bugs = [m for m in w.errors.messages("error") if m.startswith("internal error")]
        assert not bugs, bugs


class FakeClock:
    """A clock the test moves by hand (``clock.now += 2.0``)."""
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The progress model's clock (task_state.py), moved by the test."""
    from app.engine import task_state

    c = FakeClock()
    monkeypatch.setattr(task_state.time, "perf_counter", c)
    return c
