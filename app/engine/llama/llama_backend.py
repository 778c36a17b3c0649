"""llama.cpp's process-wide set-up: backend initialisation, the one log callback, versions.

llama_log_set is global to the process, so there is one callback: it forwards every line to
Python logging and to listeners (the KV debug view parses the find_slot lines), and remembers
the last warning and first error so a NULL from llama.cpp can be explained.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from pathlib import Path
from typing import Callable

import llama_cpp as L

log = logging.getLogger("kvprimer.llama")

_log_listeners: list[Callable[[int, str], None]] = []
_backend_ready = False
_last_problem = ["", ""]  # llama.cpp's last warning and first error, to explain a NULL
_expected = threading.local()  # see expected_errors


@L.llama_log_callback
def _on_llama_log(level: int, text: bytes, user_data) -> None:  # pragma: no cover - native path
    try:
        s = text.decode("utf-8", errors="replace")
        for fn in list(_log_listeners):
            fn(level, s)
        # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
        if level in (3, 4) and not getattr(_expected, "on", False):
            # keep the first error: "error loading model: <why>" comes before the generic
            # "failed to load model" that follows it
            if level == 4 and not _last_problem[1]:
                _last_problem[1] = s.strip()
            _last_problem[0] = s.strip()
            log.warning(s.rstrip())
    except Exception:  # never let an exception cross into C
        pass


def last_problem() -> str:
    """llama.cpp's last warning, as ' (llama.cpp: ...)' to append to a message, or ''."""
    msg = _last_problem[1] or _last_problem[0]
    _last_problem[:] = ["", ""]
    return f" (llama.cpp: {msg})" if msg else ""


@contextlib.contextmanager
def expected_errors():
    """Errors llama.cpp logs on this thread meanwhile are expected (a call made to fail, such
    as the KV report's probe): listeners hear them, but they are no warning and no problem."""
    _expected.on = True
    try:
        yield
    finally:
        _expected.on = False


def add_log_listener(fn: Callable[[int, str], None]) -> None:
    _log_listeners.append(fn)


def remove_log_listener(fn: Callable[[int, str], None]) -> None:
    if fn in _log_listeners:
        _log_listeners.remove(fn)


def ensure_backend() -> None:
    global _backend_ready
    L.llama_log_set(_on_llama_log, ctypes.c_void_p(0))  # first: loading a CPU level logs
    if not _backend_ready:
        cpu_backend()  # a build of several CPU levels registers none until asked
        L.llama_backend_init()
        _backend_ready = True


def cpu_backend():
    """The CPU level llama.cpp runs (app/cpu_backends.py): loaded on first use."""
    from ...cpu_backends import NoCpuBackendError, load_cpu_backend
    from ..errors import ModelError

    try:
        return load_cpu_backend(library_dir())
    except NoCpuBackendError as e:
        raise ModelError(str(e)) from None


def library_dir() -> Path:
    """The folder of the libllama that llama_cpp loaded (LLAMA_CPP_LIB_PATH may move it)."""
    from llama_cpp import llama_cpp as bindings

    return Path(bindings._lib._name).resolve().parent


def versions() -> dict[str, str]:
    ensure_backend()  # the CPU level's features are in the system info once it is loaded
    info = L.llama_print_system_info().decode("utf-8", "replace").strip()
    return {"llama_cpp_python": L.__version__, "llama_cpp_build": _llama_build(),
            "cpu_backend": cpu_backend().describe(), "system": info}


def _llama_build() -> str:
    """The vendored llama.cpp's build: ggml's git commit and version (ggml_commit/ggml_version
    are exported by libggml-base, which the bindings do not wrap) and llama_version()."""
    parts: list[str] = []
    try:
        from llama_cpp import _ggml

        for name, fmt in (("ggml_commit", "{}"), ("ggml_version", "ggml {}")):
            fn = getattr(_ggml.libggml, name)
            fn.argtypes, fn.restype = [], ctypes.c_char_p
            value = fn()
            if value:
                parts.append(fmt.format(value.decode("ascii", "replace")))
    except (ImportError, OSError, AttributeError):
        pass
    try:
        parts.append(f"libllama {L.llama_version().decode('ascii', 'replace')}")
    except AttributeError:
        pass
    return ", ".join(parts) or "unknown build"


