"""llama-cpp-python as `pip install llama-cpp-python` builds it on this machine, as a peer.

pip compiles llama.cpp from the sdist with its defaults, GGML_NATIVE on (`-march=native`): that
is what its users run, and on a CPU with more than AVX2 it is faster than the portable build
the project ships. The bench builds it once per version, Python, CPU and compiler, in a venv of
its own in the user's cache (~/.cache/kvprimer/peers/<key>/; about 11 minutes on 2 cores), and
reuses it after. Its libllama cannot share a process with ours, so it runs bench/peer_child.py
in a subprocess: the same token ids and loop, the answer as JSON on stdout.

On an AMX CPU it runs with extra buffer types off: GCC 12's native build crashes in the AMX
kernels on the first batch of 2 or more tokens (llama.cpp issue 20824).

`python -m bench.native_peer` builds it ahead of a bench run (under `nice -n 19` on a shared
machine: the compilers inherit it).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from app.engine.llama.cpu_kernels import cpu_facts

CHILD = Path(__file__).resolve().parent / "peer_child.py"
DONE = "built.json"  # written last: a folder without it is a build that did not finish
# What would change what pip builds, or load our library instead of the peer's: left out of the
# build's and the child's environment.
STRIPPED_ENV = ("CMAKE_ARGS", "FORCE_CMAKE", "PYTHONPATH", "PYTHONHOME", "LLAMA_CPP_LIB_PATH",
                "LLAMA_CPP_LIB")


class PeerError(RuntimeError):
    """The native peer could not be built or did not answer."""


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or ""
    if not cc:
        return "no compiler"
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "no compiler"
    return (out.stdout.splitlines() or [""])[0]


def venv_key(version: str) -> str:
    """One build per llama-cpp-python version, Python, CPU (model and flags) and compiler."""
    parts = [version, platform.python_version(), platform.machine(), cpu_facts().identity,
             compiler_version()]
    return f"{version}-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def peers_home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kvprimer" / "peers"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}


def venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def install_command(python: Path, version: str) -> list[str]:
    # --no-binary: a wheel from an index or a find-links folder would not be built here;
    # --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and may hold another build's wheel
    return [str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir",
            "--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}"]


def native_python(version: str, log=print, home: Path | None = None) -> Path:
    """The python of the native build's venv, built first if needed (PeerError if it fails)."""
    root = (home or peers_home()) / venv_key(version)
    if (root / DONE).is_file():
        return venv_python(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another bench building the same venv: wait for it
        if not (root / DONE).is_file():
            log(f"native peer: compiling llama-cpp-python {version} as pip builds it on this "
                f"machine (-march=native), about 11 minutes on 2 cores, once; in {root}")
            _build(root, version)
    return venv_python(root)


def _build(root: Path, version: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    _step([base, "-m", "venv", str(root)], root, "creating its venv")
    py = venv_python(root)
    _step(install_command(py, version), root, "pip install llama-cpp-python")
    info = json.loads(_step([str(py), "-c", "import json, llama_cpp as L; print(json.dumps("
                             "{'version': L.__version__, "
                             "'system_info': L.llama_print_system_info().decode()}))"],
                            root, "importing it").strip().splitlines()[-1])
    if info["version"] != version:
        raise PeerError(f"the native peer's venv holds llama-cpp-python {info['version']}, "
                        f"not {version}; delete {root} and run the bench again")
    (root / DONE).write_text(json.dumps(info) + "\n", encoding="utf-8")


def _step(cmd: list[str], root: Path, what: str) -> str:
    log = root.parent / f"{root.name}.log"
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=clean_env())
        f.write(r.stdout)
    if r.returncode != 0:
        raise PeerError(f"native peer: {what} failed (exit {r.returncode}); see {log}")
    return r.stdout


def run_peer(python: str | Path, request: dict, timeout_s: float) -> dict:
    """bench/peer_child.py under ``python``: the request in, its answer out (PeerError on a
    crash, a timeout or an error it reports)."""
    try:
        r = subprocess.run([str(python), str(CHILD)], input=json.dumps(request),
                           capture_output=True, text=True, timeout=timeout_s, env=clean_env())
    except subprocess.TimeoutExpired:
        raise PeerError(f"the peer process did not finish in {timeout_s:.0f} s") from None
    try:
        answer = json.loads(r.stdout)
    except json.JSONDecodeError:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise PeerError(f"the peer process ended (exit {r.returncode}) without an answer: "
                        f"{tail}") from None
    if not answer.get("ok"):
        raise PeerError(f"the peer process failed: {answer.get('error')}")
    return answer


def main() -> int:
    import llama_cpp

    py = native_python(llama_cpp.__version__)
    print(py)
    print((py.parent.parent / DONE).read_text(encoding="utf-8").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
