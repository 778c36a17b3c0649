"""Which CPU kernels llama.cpp runs a model with, and why: AMX, repacked weights, or neither.

llama.cpp's CPU backend can move weights into "extra buffer types" when it loads a model: the
AMX buffer (Intel Sapphire Rapids and later: tile instructions for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K,
Q6_K, IQ4_XS and F16 weights) and the repack buffer (Q4_0, Q4_K, IQ4_NL, ... interleaved for
AVX2/AVX-512). ``llama_model_params.use_extra_bufts = false`` keeps all weights in plain
buffers and so turns both off.

Why this matters: llama.cpp built with GCC 12 for a CPU with AMX miscompiles the AMX tile set-up
(GCC 12 declares ``_tile_loadconfig``'s operand as 8 bytes, so the rest of the 64-byte config is
never stored) and crashes with SIGSEGV on the first batch of 2 or more tokens (llama.cpp issue
20824, not fixed upstream). Our own build compiles AMX out (Makefile); a llama-cpp-python the
user built (for CUDA, Vulkan, or with -march=native) may not. crash_probe.py tests the build in
a child process; ``decide`` turns what it found into a setting and a one-line reason.

Qt-free; the facts are read once per process (the build and the CPU cannot change under us).
"""
from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from .llama_backend import ensure_backend, library_dir

# the extra buffer types' names as llama.cpp logs them ("load_tensors: AMX model buffer size")
AMX_BUFFER, REPACK_BUFFER = "AMX", "CPU_REPACK"


@dataclass(frozen=True)
class BuildFacts:
    """What the loaded llama.cpp libraries were compiled with (llama_print_system_info)."""
    features: tuple[str, ...]  # the CPU backend's features reported as "= 1", e.g. AVX2, REPACK
    identity: str  # llama-cpp-python's version and a digest of the library files' size and mtime
    library_dir: str

    @property
    def amx(self) -> bool:
        return "AMX_INT8" in self.features

    @property
    def repack(self) -> bool:
        return "REPACK" in self.features


@dataclass(frozen=True)
class CpuFacts:
    model: str
    flags: frozenset[str]

    @property
    def amx(self) -> bool:
        return "amx_int8" in self.flags and "amx_tile" in self.flags

    @property
    def identity(self) -> str:
        digest = hashlib.sha256(" ".join(sorted(self.flags)).encode()).hexdigest()[:16]
        return f"{self.model}|{digest}"


@dataclass(frozen=True)
class CpuKernels:
    """The extra-buffer-types setting to load a model with, the kernels that follow, and why."""
    use_extra_bufts: bool
    amx: bool  # AMX kernels run: the build has them, the CPU has AMX, extra buffer types on
    repack: bool  # repacked-weight kernels can run (for the weight types that have them)
    reason: str  # one line, for the user
    probe: str  # one line: what the crash check found (or why it did not run)
    # the extra buffer types this model kind's weights went to in the check ("AMX",
    # "CPU_REPACK"); None: not known. Which ones a model uses depends on its weight types
    # (SmolLM2's Q4_1 has AMX kernels but no repacked ones).
    buffers: tuple[str, ...] | None = None

    def summary(self) -> str:
        """Short: what runs, e.g. 'AMX + repacked weights' or 'plain kernels'."""
        if self.buffers is None:
            on = [n for n, flag in (("AMX", self.amx), ("repacked weights", self.repack)) if flag]
            return (" + ".join(on) + " enabled") if on else "plain kernels"
        used = [_BUFFER_LABELS.get(b, b) for b in self.buffers]
        if used:
            return " + ".join(used)
        if not self.use_extra_bufts:
            return "plain kernels (AMX and repacked weights turned off)"
        on = [n for n, flag in (("AMX", self.amx), ("repacked", self.repack)) if flag]
        if on:
            return f"plain kernels (no weight type of this model has {' or '.join(on)} kernels)"
        return "plain kernels"

    def as_dict(self) -> dict:
        return {**asdict(self), "buffers": None if self.buffers is None else list(self.buffers),
                "summary": self.summary()}


_BUFFER_LABELS = {AMX_BUFFER: "AMX", REPACK_BUFFER: "repacked weights"}


# ---- reading the facts -------------------------------------------------------------------------


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """'CPU : SSE3 = 1 | AVX2 = 1 | ... | CUDA : ARCHS = 890 | ' -> {backend: {feature: value}}."""
    backends: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for part in text.split("|"):
        part = part.strip()
        if " : " in part:  # a new backend's section starts inside this piece
            name, _, part = part.partition(" : ")
            current = backends.setdefault(name.strip(), {})
        key, sep, value = part.partition("=")
        if current is not None and sep:
            current[key.strip()] = value.strip()
    return backends


@functools.lru_cache(maxsize=1)
def build_facts() -> BuildFacts:
    import llama_cpp as L

    ensure_backend()  # with CPU levels built apart, the system info names the loaded one's features
    info = parse_system_info(L.llama_print_system_info().decode("utf-8", "replace"))
    cpu = info.get("CPU", {})
    lib_dir = library_dir()
    return BuildFacts(tuple(k for k, v in cpu.items() if v == "1"),
                      f"{L.__version__}|{_files_digest(lib_dir)}", str(lib_dir))


def _files_digest(folder: Path) -> str:
    """Size and mtime of the llama.cpp libraries in the folder (not their versioned copies): a
    rebuilt llama.cpp changes them, and a stat is cheap where hashing 10 MB on every start
    would not be."""
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.name.startswith(("libllama", "libggml", "llama", "ggml")) and p.suffix in (
                ".so", ".dylib", ".dll"):
            st = p.stat()
            h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def cpu_facts() -> CpuFacts:
    return read_cpuinfo(Path("/proc/cpuinfo"))


def read_cpuinfo(path: Path) -> CpuFacts:
    """The first processor's model name and flags from /proc/cpuinfo (Linux); elsewhere only
    what the platform module knows, with no flags."""
    model, flags = "", frozenset()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                elif not line.strip() and model and flags:
                    break  # the first processor is enough: all cores of a machine match
    except OSError:
        pass
    return CpuFacts(model or platform.processor() or platform.machine() or "unknown CPU", flags)


# ---- the decision ------------------------------------------------------------------------------

def decide(build: BuildFacts, cpu: CpuFacts, outcome: str, detail: str = "",
           buffers: tuple[str, ...] | None = None) -> CpuKernels:
    """The setting and its reason, from what the crash check found:

    - ``default``: a test decode with extra buffer types on passed;
    - ``without_extra``: it crashed with them (``detail`` names the signal) and passed without;
    - ``skipped``: no check needed (``detail`` says why);
    - ``unknown``: the check did not finish (``detail`` says why).
    """
    amx_possible = build.amx and cpu.amx
    if outcome == "default":
        use = True
    elif outcome == "without_extra":
        use = False
    else:  # unchecked: the known crash needs AMX, so only an AMX build on an AMX CPU loses it
        use = not amx_possible
    amx, repack = amx_possible and use, build.repack and use
    if outcome == "without_extra":
        what = "AMX and repacked weights are" if amx_possible else "repacked weights are"
        why = (f"{what} off: llama.cpp crashed with them in a test decode on this CPU "
               f"({detail}), and ran without them")
        if amx_possible:
            why += ("; likely the GCC 12 miscompile of its AMX code (llama.cpp issue 20824): "
                    "reinstall llama-cpp-python built with GCC 13 or without AMX to get them back")
    elif amx_possible and not use:
        why = ("AMX and repacked weights are off: this llama.cpp build has AMX kernels, which "
               "crash when built by GCC 12 (llama.cpp issue 20824), and no test decode has "
               "shown them safe here")
    elif amx:
        why = "AMX kernels on: this llama.cpp build has them, this CPU has AMX, and a test decode passed"
    elif build.amx:
        why = "no AMX: this llama.cpp build has AMX kernels but this CPU has no AMX"
    elif cpu.amx:
        why = ("no AMX: this CPU has AMX, but this llama.cpp build was compiled without it "
               "(a portable build; GCC 12 miscompiles llama.cpp's AMX code)")
    else:
        why = "no AMX: neither this CPU nor this llama.cpp build has it"
    if outcome != "without_extra" and not (amx_possible and not use):
        why += ("; repacked weights on where a weight type has them" if repack
                else "; this build has no repacked-weight kernels")
    probe = {"default": "a test decode in a separate process passed",
             "without_extra": f"a test decode crashed ({detail}) and passed without extra buffer types",
             }.get(outcome, detail)
    return CpuKernels(use, amx, repack, why, probe, None if buffers is None else tuple(buffers))
