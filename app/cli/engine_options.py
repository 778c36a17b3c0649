"""What every command shares: the model and context options (named and meaning what llama.cpp's
own tools name and mean), the generation and output options, the engine they open, the session
options they set, progress on stderr. Defaults are not written here: they are EngineConfig's,
CacheLimits' and Options' own, shown in the help."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ..engine import (CacheLimits, Engine, EngineConfig, KvPrimerError, TaskState, Template,
                      read_rows)
from ..engine.byte_sizes import size_text
from ..engine.llama.ggml_types import KV_TYPES
from ..engine.llama.model_files import default_model_path
from ..engine.prompts.chat_messages import ChatTemplate, is_chat_file
from ..engine.prompts.chat_render import render_chat_file
from ..engine import state_flows
from ..engine.project.project_file import SUFFIX, ProjectFile
from ..engine.session import Options, Session
from ..engine.task_state import Progress, progress_line
from .output import output_options

_E, _O, _C = EngineConfig(), Options(), CacheLimits()
_MB = 1 << 20


def engine_options(p: argparse.ArgumentParser) -> None:
    """The model, context and radix cache options (the CLI's and the window's)."""
    g = p.add_argument_group("model and context (llama.cpp's names)")
    g.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1)")
    g.add_argument("-c", "--ctx-size", type=int, default=_E.n_ctx,
                   help=f"context size in tokens ({_E.n_ctx})")
    g.add_argument("-b", "--batch-size", type=int, default=_E.n_batch,
                   help=f"tokens per decode call ({_E.n_batch})")
    g.add_argument("-ub", "--ubatch-size", type=int, default=_E.n_ubatch, metavar="N",
                   help="tokens per physical batch inside a decode call (0: the batch size)")
    g.add_argument("-t", "--threads", type=int, default=_E.n_threads_gen, metavar="N",
                   help="threads for generation (0: as --threads-batch, and 1 on sliding-window "
                        "models, whose warm runs generate in the cache's shared cells; warm and "
                        "cold runs stay bit-identical either way)")
    g.add_argument("-tg", "--threads-gen", type=int, dest="threads", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old name of -t, kept working
    g.add_argument("-tb", "--threads-batch", type=int, default=_E.n_threads, metavar="N",
                   help="threads for prompt batches (0: auto: the cores other programs leave "
                        "free, measured as it runs, up to one per physical core)")
    g.add_argument("-ctk", "--cache-type-k", default=_E.type_k, choices=list(KV_TYPES),
                   help=f"K cache type ({_E.type_k})")
    g.add_argument("-ctv", "--cache-type-v", default=_E.type_v, choices=list(KV_TYPES),
                   help=f"V cache type ({_E.type_v})")
    g.add_argument("-fa", "--flash-attn", default=None, choices=("auto", "on", "off"),
                   help="flash attention (auto: the faster kernel, measured once per machine "
                        "and model by `kvprimer info` or the window, off until then; on, off: "
                        "as given; default: KVPRIMER_FLASH_ATTN or auto)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=_E.n_gpu_layers,
                   metavar="N", help="layers to offload to the GPU (0; -1: all); needs a GPU "
                                     "build of llama-cpp-python")
    g = p.add_argument_group("radix cache (what runs leave in the KV cache for later runs)")
    g.add_argument("--cache-resident-mb", type=float, default=_C.resident_bytes / _MB,
                   metavar="MB", help="cap on cells kept in the context (0: three quarters of it)")
    g.add_argument("--cache-ram-mb", type=float, default=_C.ram_bytes / _MB, metavar="MB",
                   help="cap on snapshots of evicted prompts kept in memory (0: room for a "
                        "prefix as long as the context, at least 512, at most half the memory "
                        "the engine leaves)")
    g.add_argument("--cache-file-mb", type=float, default=_C.file_bytes / _MB, metavar="MB",
                   help=f"cap on snapshots spilled to files ({_C.file_bytes // _MB})")


def generation_options(p: argparse.ArgumentParser) -> None:
    """How runs generate (default: the project's options, else Options' defaults)."""
    g = p.add_argument_group("generation (llama.cpp's names)")
    g.add_argument("-n", "--n-predict", type=int, default=None, metavar="N",
                   help=f"new tokens to generate at most ({_O.max_tokens})")
    g.add_argument("--max-tokens", type=int, dest="n_predict", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old name of -n, kept working
    g.add_argument("-s", "--seed", type=int, default=None, help=f"sampling seed ({_O.seed})")
    g.add_argument("--temp", type=float, default=None,
                   help=f"temperature ({_O.temperature:g}: greedy)")
    g.add_argument("--top-p", type=float, default=None, help=f"top-p sampling ({_O.top_p:g})")


def shared_options() -> argparse.ArgumentParser:
    """A parent parser with every option all commands share."""
    p = argparse.ArgumentParser(add_help=False)
    engine_options(p)
    generation_options(p)
    output_options(p)
    return p


def engine_config(args) -> EngineConfig:
    """The EngineConfig the engine options ask for; a value out of range is bad input."""
    for flag, value, low in (("--ctx-size", args.ctx_size, 16), ("--batch-size", args.batch_size, 1),
                             ("--ubatch-size", args.ubatch_size, 0), ("--threads", args.threads, 0),
                             ("--threads-batch", args.threads_batch, 0)):
        if value < low:
            raise KvPrimerError(f"{flag} must be at least {low}, not {value}")
    for flag, value in (("--cache-resident-mb", args.cache_resident_mb),
                        ("--cache-ram-mb", args.cache_ram_mb), ("--cache-file-mb", args.cache_file_mb)):
        if value < 0:
            raise KvPrimerError(f"{flag} must be 0 or more, not {value:g}")
    limits = CacheLimits(int(args.cache_resident_mb * _MB), int(args.cache_ram_mb * _MB),
                         int(args.cache_file_mb * _MB))
    return EngineConfig(model_path=args.model, n_ctx=args.ctx_size, n_batch=args.batch_size,
                        n_ubatch=args.ubatch_size, n_threads=args.threads_batch,
                        n_threads_gen=args.threads, type_k=args.cache_type_k,
                        type_v=args.cache_type_v, n_gpu_layers=args.n_gpu_layers,
                        **({"flash_attn": args.flash_attn} if args.flash_attn else {}),
                        cache=limits, remeasure_kernels=getattr(args, "remeasure", False))


def open_engine(args) -> Engine:
    """The engine the options ask for, on the attention kernel chosen so far: a command never
    waits for a kernel measurement. Without a trusted one (none yet, or provisional) it runs on
    the last choice or the safe default and says which in one stderr line. A command whose
    parser sets ``measure_kernels`` (`kvprimer info`) runs a wanted or asked-for measurement
    first, in the foreground (seconds: its passes are sized to the model, kernel_passes.py)."""
    if getattr(args, "state", None):  # read from disk while the model loads, if need be
        state_flows.prefetch_state(args.state)
    eng = Engine(engine_config(args), measure_kernels_later=True)
    try:
        k = eng.kernel_state
        if getattr(args, "measure_kernels", False) and k.wanted:
            why = k.note or "no trusted measurement yet"
            print(f"kvprimer: measuring the attention kernels first ({why})…", file=sys.stderr,
                  flush=True)
            tty = sys.stderr.isatty()
            status = eng.measure_kernels(on_status=lambda st: tty and print(
                f"\r{st.text()}   ", end="", file=sys.stderr, flush=True))
            print(f"{chr(13) if tty else ''}kvprimer: {status.text()}", file=sys.stderr)
        elif k.choice.how == "until measured" or k.choice.provisional:
            print(f"kvprimer: {kernel_line(k.choice, k.wanted)}", file=sys.stderr)
    except BaseException:
        eng.close()
        raise
    return eng


def kernel_line(choice, wanted: bool) -> str:
    """The kernel a command runs on when no trusted measurement chose it, and how to get one."""
    kernel = {True: "on", False: "off", None: "not used"}[choice.flash_attn]
    if choice.how == "until measured":
        return (f"flash attention {kernel}, the safe default: the attention kernels are not "
                "measured on this model yet (`kvprimer info` measures them, in seconds)")
    return (f"flash attention {kernel}, {choice.how} and provisional "
            f"({choice.reason.partition('; provisional: ')[2] or 'not trusted'}); "
            + ("`kvprimer info` measures again" if wanted else
               "measured again later, or now with `kvprimer info --remeasure`"))


def session_options(args, base: Options | None = None, **given) -> Options:
    """``base`` (a project's options, else the defaults) with what the command line gives:
    the generation options and a command's own (``given``; None: not given). The flows'
    plans check them."""
    given.update(max_tokens=args.n_predict, seed=args.seed, temperature=args.temp,
                 top_p=args.top_p)
    return replace(base or Options(), **{k: v for k, v in given.items() if v is not None})


def load_state_file(eng: Engine, path: str | None, tpl: Template):
    """The --state file of either format (None without one), loaded as the window's Load state
    loads it (state_flows.load_state: checked, then adopted into the cache); the user is told
    how little a llama.cpp file could be checked."""
    if not path:
        return None
    t0 = time.perf_counter()
    state = state_flows.load_state(eng, path, tpl)
    ms = (time.perf_counter() - t0) * 1000
    if state.warning:
        print(f"kvprimer: note: {state.warning}", file=sys.stderr)
    # outside the warm run's time to first token, so said here: at 32k it is seconds
    print(f"kvprimer: loaded {Path(path).name}: {state.n_tokens:,} tokens, "
          f"{size_text(state.nbytes)} in {ms:,.0f} ms", file=sys.stderr)
    return state


def read_template(path: str, model: str | None = None) -> Template:
    """A template file, a chat template file (.json, .yaml: messages, rendered with the chat
    template of ``model``, the default model when None), or the template of a project file
    (.kvproj) saved by the window."""
    if Path(path).suffix == SUFFIX:
        return read_project(path).template
    if is_chat_file(path):
        rendered = render_chat_file(path, model or default_model_path())
        if rendered.note:
            print(f"kvprimer: note: {rendered.note}", file=sys.stderr)
        return rendered.template
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


def project_chat(session: Session, model: str | None = None):
    """The messages a project's template is the rendering of, as the window finds them when
    it reopens the project: its template file is a chat template that still renders to the
    project's template with ``model``'s chat template (else the project's model, else the
    default). None for a text template; the session keeps them (``chat_template()``)."""
    path = session.template_path
    if not (is_chat_file(path) and Path(path).is_file()):
        return None
    try:
        rendered = render_chat_file(path, model or session.options.engine.model_path
                                    or default_model_path())
        chat = ChatTemplate.load(path)
    except (KvPrimerError, OSError):
        return None
    session.set_chat(chat, rendered.template.source)
    return session.chat_template()


def project_options(path: str) -> Options | None:
    """The options a project file (.kvproj) keeps; None for a plain template."""
    return read_project(path).options if Path(path).suffix == SUFFIX else None


def check_save(args) -> None:
    """--save stores results in the project given as the template: a plain template is refused
    before any work."""
    if args.save and Path(args.template).suffix != SUFFIX:
        raise KvPrimerError("--save stores results in a project file: give a .kvproj instead "
                            "of the template")


def save_results(args, keep) -> None:
    """With --save: ``keep(session)`` puts the results into the project's session, as the
    window does, and the project file is written again."""
    if not args.save:
        return
    session = read_project(args.template)
    keep(session)
    session.to_project().save(args.template)
    if not args.json:
        print(f"saved the results in {args.template}")


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


def progress_printer(stream=None) -> TaskState:
    """Progress on one rewritten line (the window's status bar's words: the whole job, the
    current pass, the time left): on stderr when it is a terminal, or on ``stream``."""
    out = stream or sys.stderr
    shown = stream is not None or out.isatty()
    width = [0]  # the longest line so far: a shorter one must blank its tail

    def show(p: Progress) -> None:
        if not shown or p.stage == "generate":
            return
        line = progress_line("", p)
        # a line of its own ends with its pass, or with the whole job when there is one
        ended = (p.whole and p.job.done >= p.job.total) if p.job else p.done >= p.total
        print("\r" + line.ljust(width[0]), end="\n" if ended else "", file=out, flush=True)
        width[0] = 0 if ended else max(width[0], len(line))

    return TaskState(on_progress=show)


@contextmanager
def cancel_on_interrupt(task: TaskState):
    """The first Ctrl+C cancels ``task`` between batches, so a benchmark stops with the rows it
    finished (printed and saved as usual); a second one interrupts at once."""
    def first(_sig, _frame):
        print("\nkvprimer: stopping after the current batch; Ctrl+C again stops at once",
              file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        task.cancel()

    try:
        old = signal.signal(signal.SIGINT, first)
    except ValueError:  # not the main thread: no handler of ours
        yield task
        return
    try:
        yield task
    finally:
        signal.signal(signal.SIGINT, old)
