"""Starting a llama-server whose settings match KV Primer's states, and stopping it.

The binary is the one `make` builds from the very llama.cpp source the pinned llama-cpp-python
ships (same seq-state version, same kernels, AMX compiled out: see the Makefile), installed
next to the venv's python. ``KVPRIMER_LLAMA_SERVER`` names another; PATH is the last resort.
A binary we did not build may carry GCC 12's AMX miscompile, so on an AMX CPU it starts with
``--no-repack`` (extra buffer types off, as our crash check does for the library).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.llama.cpu_kernels import cpu_facts
from app.engine.llama.thread_count import llama_default_threads
from app.engine.errors import KvPrimerError

from .llama_server import LlamaServer

ENV_BINARY = "KVPRIMER_LLAMA_SERVER"
HOST = "127.0.0.1"


class ServeError(KvPrimerError):
    """llama-server cannot be found or did not start."""


@dataclass(frozen=True)
class ServerSettings:
    """What the server must share with the states KV Primer writes."""
    model_path: str
    flash_attn: bool  # decides V's layout in a state
    n_ctx: int = 4096
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False  # sliding-window models: keep every cell, or restores go unused
    slot_dir: str = ""
    port: int = 0  # 0: a free port
    # how the engine batches and threads, so that the server's runs compute what ours do
    n_batch: int = 256  # -b
    n_ubatch: int = 0  # -ub (0: as -b)
    n_threads: int = 0  # -tb (0: llama-server's default, one per physical core)
    n_threads_gen: int = 0  # -t (0: llama-server's default, one per physical core)
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def find_binary() -> tuple[Path, bool]:
    """(path, built by us) of the llama-server to run; ServeError when there is none."""
    named = os.environ.get(ENV_BINARY)
    if named:
        p = Path(named)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ServeError(f"{ENV_BINARY} names {p}, which is not an executable file")
        return p, False
    ours = Path(sys.executable).parent / "llama-server"
    if ours.is_file():
        return ours, True
    found = shutil.which("llama-server")
    if found:
        return Path(found), False
    raise ServeError("llama-server is not installed: run `make server` (it builds it from the "
                     f"same llama.cpp as the engine), or set {ENV_BINARY} to its path")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """ServeError when something listens on ``port`` already: its /health would answer for a
    server that failed to start."""
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise ServeError(f"port {port} on {HOST} is in use; choose another with --port, or "
                             "stop what runs there") from None


def command(binary: Path, ours: bool, s: ServerSettings, port: int) -> list[str]:
    cmd = [str(binary), "-m", s.model_path, "--host", HOST, "--port", str(port),
           "-np", "1",  # one slot, one KV stream: what a sequence state restores into
           "-fa", "on" if s.flash_attn else "off", "-c", str(s.n_ctx),
           "-ctk", s.type_k, "-ctv", s.type_v, "--no-webui"]
    if s.slot_dir:
        cmd += ["--slot-save-path", str(Path(s.slot_dir).resolve())]
    if s.swa_full:
        cmd.append("--swa-full")
    cmd += ["-b", str(s.n_batch), "-ub", str(s.n_ubatch or s.n_batch)]
    if s.n_threads > 0:
        cmd += ["-tb", str(s.n_threads)]
    if s.n_threads_gen > 0:
        cmd += ["-t", str(s.n_threads_gen)]
    if not ours and cpu_facts().amx:
        cmd.append("--no-repack")
    return cmd + list(s.extra_args)


class ServerProcess:
    """A running llama-server; ``stop()`` (or leaving ``with``) ends it."""

    def __init__(self, settings: ServerSettings, log_path: str | Path | None = None):
        self.settings = settings
        self.binary, self.ours = find_binary()
        self.port = settings.port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.cmd = command(self.binary, self.ours, settings, self.port)
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> "ServerProcess":
        check_port_free(self.port)
        if self.settings.slot_dir:
            Path(self.settings.slot_dir).mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise ServeError(f"cannot start {self.binary}: {e.strerror or e}") from None
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        with LlamaServer(self.url) as client:
            try:
                client.wait_ready(timeout_s, alive=lambda: self.proc.poll() is None)
            except KvPrimerError:
                code = self.proc.poll()
                self.stop()
                why = self._log_tail()
                raise ServeError(f"llama-server did not start (exit {code}): {why}") from None
        return self

    def _log_tail(self) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "see its output"
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errs = [ln for ln in lines if "error" in ln.lower()] or lines
        return errs[-1][:200] if errs else "it printed nothing"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # llama-server shuts down cleanly on SIGINT
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout_s)

    def __enter__(self) -> "ServerProcess":
        return self if self.proc is not None else self.start()  # `with proc.start():` works too

    def __exit__(self, *exc) -> None:
        self.stop()


def server_threads(config) -> tuple[int, int]:
    """(-tb, -t) for a server that computes what an engine of ``config`` computes: the
    engine's counts where they are set; where they are automatic, llama-server's own default
    (one per physical core), given explicitly. The engine's automatic count follows the
    machine's load, and with flash attention a one-token decode's rounding depends on it: so
    ``bench --server`` runs its local comparisons on the server's generation count
    (``server_threads(...)[1]``), not on whatever the load gives at the time."""
    batch = config.n_threads or llama_default_threads()
    gen = min(config.n_threads_gen, batch) if config.n_threads_gen > 0 else batch
    return batch, gen


def settings_for(engine, slot_dir: str = "", port: int = 0,
                 extra_args: tuple[str, ...] = ()) -> ServerSettings:
    """Server settings that restore what ``engine`` primes: its model, flash-attention
    setting, KV types and context size; --swa-full on sliding-window models. Its batch sizes
    and thread counts too: llama.cpp's results depend on how a prompt is batched and, for
    one-token decodes, on the thread count, and a server run is compared with ours."""
    info, c = engine.info, engine.config
    n_threads, n_threads_gen = server_threads(c)
    return ServerSettings(model_path=info.path, flash_attn=bool(engine.kernels.flash_attn),
                          n_ctx=info.n_ctx, type_k=info.type_k, type_v=info.type_v,
                          swa_full=info.traits.n_swa > 0, slot_dir=slot_dir, port=port,
                          n_batch=c.n_batch, n_ubatch=c.n_ubatch, n_threads=n_threads,
                          n_threads_gen=n_threads_gen, extra_args=tuple(extra_args))
