"""Load the llama.cpp CPU backend built for this CPU, where the build has several.

The Makefile builds llama.cpp's CPU backend once per instruction-set level
(`GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON`, the levels in its CPU_VARIANTS): a portable
x86-64-v3 one (`haswell`) and faster ones for AVX-VNNI and AVX-512 CPUs, each a
`libggml-cpu-<level>.so` beside libllama. llama.cpp loads none of them by itself and
llama-cpp-python does not ask it to, so this does, once per process, before any model is
loaded: ggml scores each file against the CPU (a level the CPU lacks scores 0) and registers the
best. A build with its CPU backend linked in (one level, or a GPU build of the user's) has no
such files, and nothing happens.

It lives outside app.engine, like the crash check's child process, which needs it too and must
start fast; it needs only ctypes and the folder of the libraries llama_cpp loaded.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

_PREFIX = "libggml-cpu-"
_SUFFIX = {"win32": ".dll", "darwin": ".so"}.get(sys.platform, ".so")
_loaded: "CpuBackend | None" = None


@dataclass(frozen=True)
class CpuBackend:
    variant: str  # the level in use ("zen4", "haswell", ...); "" for a build with one CPU backend
    built: tuple[str, ...]  # every level the build has, in file-name order

    def describe(self) -> str:
        if not self.built:
            return "one CPU backend, linked into llama.cpp"
        return f"{self.variant} (built: {', '.join(self.built)})"


class NoCpuBackendError(RuntimeError):
    """No built level runs on this CPU."""


def variants_in(lib_dir: Path) -> tuple[str, ...]:
    """The CPU levels built into ``lib_dir`` (empty for a build without variants)."""
    return tuple(sorted(p.name[len(_PREFIX):-len(_SUFFIX)] for p in lib_dir.glob(f"{_PREFIX}*{_SUFFIX}")))


def load_cpu_backend(lib_dir: Path) -> CpuBackend:
    """Register the best CPU level in ``lib_dir`` with ggml (once per process)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    built = variants_in(lib_dir)
    if not built:
        _loaded = CpuBackend("", ())
        return _loaded
    ggml = ctypes.CDLL(str(lib_dir / f"libggml{_SUFFIX}"))  # already mapped by llama_cpp: the same handle
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_reg_by_name(b"CPU"):
        ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
    if not ggml.ggml_backend_reg_by_name(b"CPU"):
        raise NoCpuBackendError(
            f"none of llama.cpp's CPU builds ({', '.join(built)}) runs on this CPU: the oldest "
            "needs AVX2, FMA, F16C and BMI2 (x86-64-v3); rebuild llama-cpp-python for this CPU")
    _loaded = CpuBackend(_mapped_variant(lib_dir) or "unknown", built)
    return _loaded


def _mapped_variant(lib_dir: Path) -> str:
    """Which level the process mapped, read from the loader's own record (Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ""
    for line in maps.splitlines():
        path = Path(line.split()[-1]) if "/" in line else None
        if path and path.parent == lib_dir and path.name.startswith(_PREFIX):
            return path.name[len(_PREFIX):].split(_SUFFIX)[0]
    return ""
