"""A tiny decode in a child process before the first real load of a model kind, so that a
native crash in llama.cpp becomes one line for the user instead of a core dump.

llama.cpp crashes rather than failing: a miscompiled kernel dies with SIGSEGV (GCC 12's AMX
code, see cpu_kernels.py), a build for a newer CPU with SIGILL, an assertion with SIGABRT. Such
a crash cannot be caught in-process, so the first load of a model kind on this llama.cpp build
and CPU first runs app/crash_probe_child.py: load the model, decode a batch of 4 tokens (2 or
more is what takes the AMX path) and then 1. If that child dies by a signal, it runs again with
extra buffer types (AMX, repacked weights) off; if that passes, models of this kind load with
them off, and the reason says so; if both die, ``checked_cpu_kernels`` raises ModelError.

While the child runs, the parent hashes the model file (``model_fingerprint``, cached: the
engine needs it next): a first start on a new model pays the longer of the two, not both.

The verdict is cached in the user's cache folder per llama.cpp build (version + library files),
CPU (model name + flags) and model kind (architecture, file type, tensor types), and per process
by the model file's identity: a cached start costs a stat and a dict lookup.

Models whose weights are all float32 (the tests' tiny models) skip the check: no extra buffer
type takes float32 weights, so they run only the plain kernels every llama.cpp build tests.
"""
from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from ... import crash_probe_child as _child
from . import model_files as _mf
from .cpu_kernels import CpuKernels, build_facts, cpu_facts, decide
from ..errors import ModelError
from .ggml_types import GGML_TYPE_NAMES

CRASH_TEST_ENV = _child.CRASH_TEST_ENV  # tests: makes the child die by a signal (see there)
CHILD_ARG = "--kvprimer-crash-probe"  # how the PyInstaller bundle's launcher routes the child
TIMEOUT_S = 180.0  # a big model's first load reads all its weights: give it time
CACHE_VERSION = 1
# signals that mean llama.cpp crashed; SIGKILL (the OOM killer) or SIGTERM mean someone else
# stopped the check, which says nothing about the build
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT,
                  signal.SIGTRAP, signal.SIGSYS}

_memo: dict[tuple, CpuKernels | str] = {}  # (cache file, model file identity) -> choice or error


def cache_path() -> Path:
    # platformdirs builds the path anew on every call (~40 us); the engine asks on every load
    env = os.environ
    return _cache_path(env.get("XDG_CACHE_HOME"), env.get("HOME"), env.get("LOCALAPPDATA"))


@functools.lru_cache(maxsize=8)
def _cache_path(*_env: str | None) -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("kvprimer", appauthor=False) / "crash-checks.json"


def checked_cpu_kernels(path: str | os.PathLike, timeout: float = TIMEOUT_S) -> CpuKernels:
    """The extra-buffer-types setting to load ``path`` with, checked in a child process the
    first time this build, CPU and model kind meet. ModelError when llama.cpp crashes anyway."""
    p = Path(path)
    st = p.stat()
    # the same file under any name: a stat is all a loaded model costs here
    memo_key = (cache_path(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _memo.get(memo_key)
    if hit is None:
        file_key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        hit = _memo[memo_key] = _verdict(p, file_key, timeout)
    if isinstance(hit, str):
        raise ModelError(hit)
    return hit


def _verdict(p: Path, file_key: str, timeout: float) -> CpuKernels | str:
    build, cpu = build_facts(), cpu_facts()
    cache = _read_cache()
    kind = cache["files"].get(file_key) or model_kind(p)
    if kind is None:  # check_gguf_file lets no such file through; be safe anyway
        return decide(build, cpu, "unknown", "no crash check: the model file's header is unreadable")
    if set(kind.split("|")[2].split(",")) <= {"F32"}:
        return decide(build, cpu, "skipped", "no crash check needed: float32 weights run only on "
                                             "the plain kernels", buffers=())
    key = hashlib.sha256(f"{build.identity}|{cpu.identity}|{kind}".encode()).hexdigest()[:24]
    verdict = cache["verdicts"].get(key)
    fresh = verdict is None
    if fresh:
        verdict = _probe(p, timeout)
    if verdict["outcome"] != "unknown" and (fresh or file_key not in cache["files"]):
        cache["files"][file_key] = kind
        cache["verdicts"][key] = {**verdict, "build": build.identity, "cpu": cpu.model, "kind": kind}
        _write_cache(cache)
    if verdict["outcome"] == "crash":
        return crash_message(p.name, verdict["signal"])
    choice = decide(build, cpu, verdict["outcome"], verdict.get("detail", ""),
                    verdict.get("buffers"))
    if not fresh and verdict["outcome"] in ("default", "without_extra"):
        choice = replace(choice, probe=f"{choice.probe} (checked {verdict.get('checked', 'before')}, "
                                       "cached for this build, CPU and model kind)")
    return choice


def crash_message(model_name: str, signame: str) -> str:
    if signame == "SIGILL":
        return (f"llama.cpp stops with an illegal instruction on this CPU when it runs {model_name}: "
                "this llama-cpp-python was built for a newer CPU; reinstall it built for a "
                "portable CPU baseline (as `make setup` does) or for this machine")
    return (f"llama.cpp crashes ({signame}) on this CPU when it runs {model_name}, with and without "
            "its AMX and repacked kernels: reinstall llama-cpp-python (`make setup` builds a "
            "portable one) or use another model file")


# ---- the model kind --------------------------------------------------------------------------


def model_kind(p: Path) -> str | None:
    """'architecture|file type|tensor types' from the GGUF header, or None if unreadable."""
    arch, file_type, types = "unknown", -1, set()
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _mf._GgufReader(buf, len(buf))
            r.skip(8)  # magic, version
            n_tensors, n_kv = r.u64(), r.u64()
            for _ in range(n_kv):
                name, vtype = r.string(), r.u32()
                if name == b"general.architecture" and vtype == _mf._STRING:
                    arch = r.string().decode("utf-8", "replace")
                elif name == b"general.file_type" and vtype == 4:  # uint32
                    file_type = r.u32()
                else:
                    _mf._skip_value(r, vtype, p.name)
            for _ in range(n_tensors):
                r.string()
                r.skip(8 * r.u32())  # dimensions
                types.add(r.u32())
                r.skip(8)  # offset
    except (OSError, ValueError, _mf._Truncated, ModelError):
        return None
    names = sorted(GGML_TYPE_NAMES.get(t, f"type{t}") for t in types)
    return f"{arch}|{file_type}|{','.join(names)}"


# ---- the cache file ----------------------------------------------------------------------------


def _read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        if data.get("version") == CACHE_VERSION and isinstance(data.get("files"), dict) \
                and isinstance(data.get("verdicts"), dict):
            return data
    except (OSError, ValueError, AttributeError):
        pass
    return {"version": CACHE_VERSION, "files": {}, "verdicts": {}}


def _write_cache(cache: dict) -> None:
    from ..user_files import atomic_write

    # keep the newest entries: a model file that changes leaves its old identity behind
    for name in ("files", "verdicts"):
        cache[name] = dict(list(cache[name].items())[-256:])
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_path(), (json.dumps(cache, indent=1).encode(),), ModelError, "crash check")
    except (OSError, ModelError):
        pass  # a cache we cannot write only costs the next start another check


# ---- the parent's side: run the child ----------------------------------------------------------


def _probe(p: Path, timeout: float) -> dict:
    hashing = threading.Thread(target=_fingerprint, args=(p,), name="kvprimer-fingerprint",
                               daemon=True)
    hashing.start()
    try:
        return _probe_children(p, timeout)
    finally:
        hashing.join()


def _fingerprint(p: Path) -> None:
    """The model file's fingerprint, into its cache, meanwhile (hashlib and reads let the
    child's wait go on); a failure is the engine's to report when it asks again."""
    try:
        _mf.model_fingerprint(p)
    except Exception:  # noqa: BLE001 - the engine hashes again and says what is wrong
        pass


def _probe_children(p: Path, timeout: float) -> dict:
    checked = time.strftime("%Y-%m-%d")
    first = _run_child(p, True, timeout)
    if first.get("ok"):
        return {"outcome": "default", "buffers": first["buffers"], "checked": checked}
    if "signal" not in first:
        return {"outcome": "unknown", "detail": first["why"]}
    second = _run_child(p, False, timeout)
    if second.get("ok"):
        return {"outcome": "without_extra", "detail": first["signal"], "buffers": second["buffers"],
                "checked": checked}
    if "signal" not in second:
        return {"outcome": "unknown", "detail": second["why"]}
    return {"outcome": "crash", "signal": second["signal"], "checked": checked}


def _child_command() -> list[str]:
    if getattr(sys, "frozen", False):  # the PyInstaller bundle: no -m; its launcher routes CHILD_ARG
        return [sys.executable, CHILD_ARG]
    return [sys.executable, "-m", _child.__name__]


def _run_child(p: Path, extra: bool, timeout: float) -> dict:
    """{'ok': True, 'buffers': [...]}, {'signal': 'SIGSEGV'} or {'why': '...'}."""
    env = dict(os.environ)
    env.pop("LLAMA_KV_CACHE_DEBUG", None)  # the cell-map log would only slow the child down
    root = str(Path(__file__).resolve().parents[2])  # so that -m finds this app from any cwd
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    try:
        r = subprocess.run([*_child_command(), str(p), "1" if extra else "0"], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"why": f"no crash check: the test decode did not finish in {timeout:g} s"}
    except OSError as e:
        return {"why": f"no crash check: the test process could not start ({e.strerror})"}
    if r.returncode < 0:
        sig = -r.returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {sig}"
        if sig in _CRASH_SIGNALS:
            return {"signal": name}
        return {"why": f"no crash check: the test process was stopped by {name} (out of memory?)"}
    last = r.stdout.strip().splitlines()[-1:] or [""]
    try:
        result = json.loads(last[0])
        if r.returncode == 0 and isinstance(result, dict) and result.get("ok"):
            return {"ok": True, "buffers": list(result.get("buffers", []))}
    except ValueError:
        pass
    tail = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:200]
    return {"why": f"no crash check: the test decode failed ({tail})"}
