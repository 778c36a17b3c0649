"""What every command shares: the model and context options, the engine they open, progress on
stderr. Options are named as llama.cpp's own tools name them."""
from __future__ import annotations

import argparse
import sys

from pathlib import Path

from ..engine import (CacheLimits, Engine, EngineConfig, KvPrimerError, TaskState, Template,
                      read_rows)
from ..engine.files.project_file import SUFFIX, ProjectFile
from ..engine.session import Session
from ..engine.llama.ggml_types import KV_TYPES
from ..engine.files.llama_state_file import load_any_state
from ..engine.task_state import Progress


def model_options() -> argparse.ArgumentParser:
    """A parent parser with the model and context options."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens (4096)")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (all)")
    g.add_argument("-tg", "--threads-gen", type=int, default=1, metavar="N",
                   help="threads for generating tokens (1: warm and cold generate bit-identically "
                        "however full the cache is; 0: as --threads, faster, may differ slightly)")
    g.add_argument("-b", "--batch-size", type=int, default=256, help="tokens per decode batch (256)")
    g.add_argument("-ctk", "--cache-type-k", default="f16", choices=list(KV_TYPES), help="K cache type")
    g.add_argument("-ctv", "--cache-type-v", default="f16", choices=list(KV_TYPES), help="V cache type")
    g.add_argument("-fa", "--flash-attn", default=None, choices=("auto", "on", "off"),
                   help="flash attention (auto: the faster kernel, measured once per machine "
                        "and model; on, off: as given; default: KVPRIMER_FLASH_ATTN or auto)")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N",
                   help="layers to offload to the GPU (0; -1: all); needs a GPU build of llama-cpp-python")
    g = p.add_argument_group("radix cache (what runs leave in the KV cache for later runs)")
    g.add_argument("--cache-resident-mb", type=float, default=0, metavar="MB",
                   help="cap on cells kept in the context (0: three quarters of it)")
    g.add_argument("--cache-ram-mb", type=float, default=512, metavar="MB",
                   help="cap on snapshots of evicted prompts kept in memory (512)")
    g.add_argument("--cache-file-mb", type=float, default=2048, metavar="MB",
                   help="cap on snapshots spilled to files (2048)")
    return p


def open_engine(args) -> Engine:
    for flag, value, low in (("--ctx-size", args.ctx_size, 16), ("--batch-size", args.batch_size, 1),
                             ("--threads", args.threads, 0), ("--threads-gen", args.threads_gen, 0)):
        if value < low:
            raise KvPrimerError(f"{flag} must be at least {low}, not {value}")
    for flag, value in (("--cache-resident-mb", args.cache_resident_mb),
                        ("--cache-ram-mb", args.cache_ram_mb), ("--cache-file-mb", args.cache_file_mb)):
        if value < 0:
            raise KvPrimerError(f"{flag} must be 0 or more, not {value:g}")
    mb = 1 << 20
    limits = CacheLimits(int(args.cache_resident_mb * mb), int(args.cache_ram_mb * mb),
                         int(args.cache_file_mb * mb))
    return Engine(EngineConfig(model_path=args.model, n_ctx=args.ctx_size, n_batch=args.batch_size,
                               n_threads=args.threads, n_threads_gen=args.threads_gen,
                               type_k=args.cache_type_k,
                               type_v=args.cache_type_v, n_gpu_layers=args.n_gpu_layers,
                               **({"flash_attn": args.flash_attn} if args.flash_attn else {}),
                               cache=limits,
                               remeasure_kernels=getattr(args, "remeasure", False)))


def reuse_mode(text: str) -> str:
    """--reuse for a command that runs one mode."""
    modes = reuse_modes(text)
    if len(modes) > 1:
        raise KvPrimerError(f"--reuse {text!r}: this command runs one mode; compare several "
                            "with kvprimer bench")
    return modes[0]


def reuse_modes(text: str) -> tuple[str, ...]:
    """--reuse: one mode or a comma list."""
    from ..engine import REUSE_MODES

    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in REUSE_MODES]
    if bad or not modes:
        raise KvPrimerError(f"--reuse {text!r}: use one or more of {', '.join(REUSE_MODES)}, "
                            "comma-separated")
    return tuple(dict.fromkeys(modes))


def load_state_file(eng: Engine, path: str | None, tpl: Template):
    """The --state file of either format (None without one); a llama.cpp file is checked
    against the template's prefix, and the user is told how little it could be checked."""
    if not path:
        return None
    state = load_any_state(eng, path, tpl)
    if state.warning:
        print(f"kvprimer: note: {state.warning}", file=sys.stderr)
    return state


def read_template(path: str) -> Template:
    """A template file, or the template of a project file (.kvproj) saved by the window."""
    if Path(path).suffix == SUFFIX:
        return read_project(path).template
    return Template.load(path)


def read_project(path: str) -> Session:
    """A project file opened as the window opens it: template, rows, options, results."""
    session = Session()
    for problem in session.apply_project(ProjectFile.load(path), path):
        print(f"kvprimer: note: {path}: {problem}", file=sys.stderr)
    if session.template is None:
        raise KvPrimerError(f"{path}: the project's template has an error "
                            f"({session.template_error}); fix it in the window first")
    return session


def rows_of(args, tpl: Template) -> list:
    """--rows, else the rows of the project given as the template."""
    if args.rows:
        return read_rows(args.rows, tpl.placeholders)
    if Path(args.template).suffix == SUFFIX:
        rows = read_project(args.template).all_rows()
        if rows:
            return rows
        raise KvPrimerError(f"{args.template} has no rows; add some in the window or give --rows")
    raise KvPrimerError("give the rows to run with --rows FILE (CSV or JSONL), or a project "
                        "file with rows instead of the template")


def progress_printer() -> TaskState:
    """Progress on one rewritten stderr line, only when stderr is a terminal."""
    tty = sys.stderr.isatty()

    def show(p: Progress) -> None:
        if not tty or p.stage == "generate":
            return
        eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None and p.done < p.total else ""
        end = "\n" if p.done >= p.total else ""
        print(f"\r{p.stage}: {p.done}/{p.total} tokens ({p.rate:.0f} tok/s{eta})   ", end=end,
              file=sys.stderr, flush=True)

    return TaskState(on_progress=show)
