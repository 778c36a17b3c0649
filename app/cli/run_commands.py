"""`kvprimer info|prime|run|bench|demo`: a template's prefix primed once, runs cold and warm.

Each command reads its files, makes its flow's plan (app/engine/session_flows.py) before the
model loads, so bad input costs nothing, then runs the flow the window runs.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..engine import KvPrimerError, Row, read_rows, report_dict
from ..engine import session_flows as flows
from ..engine.states.llama_state_file import FORMATS, save_state
from ..engine import state_flows
from ..engine.states.v_layout import FA_CHOICES
from ..engine.byte_sizes import size_text
from ..engine.benchmarks.bench_export import results_dict, write_results
from ..engine.runs.cold_reference import ColdEstimate
from ..engine.runs.prompt_runs import check_reuse_modes
from ..engine.session import Options
from .engine_options import (cancel_on_interrupt, check_save, load_state_file, open_engine,
                             progress_printer, project_options, read_template, rows_of,
                             save_results, session_options)
from .exit_codes import ExitCode, verdicts_code
from .kv_commands import cmd_bench_forked
from .server_commands import (check_server_options, cmd_bench_server, cmd_check_server,
                              server_target_options)
from .output import emit, yes_no

_O = Options()


def info_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remeasure", action="store_true",
                   help="time both attention kernels again instead of using the cached measurement")
    p.set_defaults(measure_kernels=True)  # the one command that measures them (open_engine)
    check_server_options(p)


def prime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("-o", "--output", required=True, help="state file to write (.kvstate)")
    p.add_argument("--format", choices=FORMATS, default="kvprimer",
                   help="kvprimer (default; carries the model's identity) or llama (llama.cpp's "
                        "own sequence state, as llama_state_seq_load_file and llama-server read it)")
    p.add_argument("--for-fa", choices=FA_CHOICES, default=None, metavar="auto|on|off",
                   help="--format llama: store V as a context with flash attention on or off "
                        "reads it (auto, the default: as llama.cpp's default context and "
                        "llama-server's -fa auto pick it)")


def run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a placeholder's value")
    p.add_argument("--set-file", action="append", default=[], metavar="NAME=PATH", help="a value read from a file")
    p.add_argument("--state", help="a saved state to restore, .kvstate or llama.cpp's (default: prime now)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cold", action="store_true", help="cold only")
    mode.add_argument("--warm", action="store_true", help="warm only")
    reuse_options(p, f"one of them ({_O.reuse_mode})")
    noise_option(p)


def noise_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--noise", action="store_true", default=None,
                   help="measure the model's noise floor (a third, one-shot cold evaluation) on "
                        "every run; by default only runs whose warm result differs from the "
                        "cold one pay for it")


def reuse_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--reuse", default=None, metavar="MODE",
                   help="what a warm run reuses: prefix (the static prefix), chain (the deepest "
                        "cached prompt: exact), compose (cached modules per slot: approximate); "
                        f"{default}")
    p.add_argument("--recompute", default=None, metavar="K|P%",
                   help="compose: evaluate each module's first K tokens, or its first P%%, "
                        "again in context (a first module right after the static prefix is "
                        "the cold run's already: none of it, its P%% to the later modules) "
                        f"({str(_O.recompute).replace('%', '%%')})")


def bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template", help="template file, or a project file (.kvproj) with its rows")
    p.add_argument("--rows", help="CSV or JSONL file of values (default: the project's rows)")
    p.add_argument("--save", action="store_true",
                   help="store the results in the project file given as the template")
    p.add_argument("--repeat", type=int, default=None, help=f"runs per row ({_O.repeat})")
    p.add_argument("--state", help="a saved state to restore, .kvstate or llama.cpp's (default: "
                                   "prime now); benchmarked in prefix mode")
    p.add_argument("--fork", type=int, default=0, metavar="K",
                   help="run the rows as forked batches of K against the same rows one by one warm")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV to FILE (the "
                                                 "window's Export columns)")
    reuse_options(p, f"a comma list compares several ({','.join(_O.bench_modes)}; "
                     "prefix with --state)")
    noise_option(p)
    server_target_options(p)


def no_options(p: argparse.ArgumentParser) -> None:
    pass


def cmd_info(args) -> int:
    if args.server:
        return cmd_check_server(args)
    with open_engine(args) as eng:
        info, memory = eng.info.as_dict(), eng.info.memory

    def words():
        rest = dict(info)
        traits = rest.pop("traits")
        notes = traits.pop("notes")
        cpu = rest.pop("cpu_kernels", None)
        kernels = rest.pop("kernels", None)
        rest.pop("memory", None)  # said below, with its parts
        width = max(map(len, rest))
        for k, v in rest.items():
            if isinstance(v, bool):  # before int: a bool is an int to Python
                v = yes_no(v)
            print(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")
        # the layers and state sizes of a hybrid or recurrent model are in its notes
        for k in ("layers", "attention_layers", "recurrent_layers", "attention_bytes_per_token",
                  "recurrent_state_bytes"):
            traits.pop(k, None)
        print("architecture traits: " + ", ".join(
            f"{k} {yes_no(v) if isinstance(v, bool) else v}" for k, v in traits.items()))
        print("for caching:")
        for line in notes:
            print(f"  - {line}")
        if kernels:  # flash attention on or off: measured here, or why there was no choice
            state = {True: "on", False: "off", None: "not used"}[kernels["flash_attn"]]
            how = f"{kernels['how']}, provisional" if kernels["provisional"] else kernels["how"]
            print(f"attention kernel: flash attention {state} ({how})")
            for line in [kernels["reason"], *kernels["figures"]]:  # timings, spread, load, when
                print(f"  - {line}")
        if cpu:  # AMX / repacked weights: what llama.cpp runs here, and why (cpu_kernels.py)
            print(f"cpu kernels: {cpu['summary']}")
            print(f"  - {cpu['reason']}")
            print(f"  - crash check: {cpu['probe']}")
        if memory is not None:  # what the engine allocates, added up before it opened
            print(f"memory: {memory.text()}")
            for c in memory.contexts:
                print(f"  - {c.name} context: {c.cells:,} cells, {c.sequences} sequences: "
                      f"KV {size_text(c.kv)}" + (f", recurrent {size_text(c.recurrent)}"
                                                  if c.recurrent else "")
                      + f", compute {size_text(c.compute)}")
            how = "planned by llama.cpp" if memory.compute_source == "llama.cpp" else "estimated"
            print(f"  - compute buffers: {how}; memory available: "
                  f"{memory.available_source or 'not known here'}")

    emit(args, info, words)
    return ExitCode.OK


def cmd_prime(args) -> int:
    tpl = read_template(args.template, args.model)
    if args.for_fa is not None and args.format != "llama":
        raise KvPrimerError("--for-fa sets V's layout in a llama.cpp state file; use it with "
                            "--format llama (a .kvstate loads only here, with this kernel)")
    with open_engine(args) as eng:
        state = flows.prime(eng, tpl, progress_printer())
        fa = None  # a .kvstate keeps the engine's own layout
        if args.format == "llama":
            state, fa = state_flows.for_llama_file(eng, state, args.for_fa or "auto")
        size = save_state(state, args.output, args.format)
        raw = state.n_tokens * eng.info.kv_bytes_per_token
        rec = eng.info.traits.recurrent_state_bytes  # hybrid and recurrent models: one state
    whole = raw + rec
    data = {"path": args.output, "format": args.format, "prefix_tokens": state.n_tokens,
            "file_bytes": size, "raw_kv_bytes": raw, "recurrent_state_bytes": rec,
            "ratio": size / whole if whole else None, "for_flash_attn": fa}
    reader = "" if fa is None else f"; for contexts with flash attention {'on' if fa else 'off'}"
    emit(args, data, lambda: print(
        f"primed {state.n_tokens} prefix tokens -> {args.output} ({size:,} bytes; "
        f"raw KV {raw:,} bytes" + (f" + recurrent state {rec:,} bytes" if rec else "")
        + (f", ratio {size / whole:.4f}" if whole else "") + reader + ")"))
    return ExitCode.OK


def _values(args) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            raise KvPrimerError(f"--set {item!r}: write it as name=value")
        values[name] = value
    for item in args.set_file:
        name, sep, path = item.partition("=")
        if not sep:
            raise KvPrimerError(f"--set-file {item!r}: write it as name=PATH")
        try:
            values[name] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KvPrimerError(f"--set-file {name}: cannot read {path} ({e})") from None
    return values


def _one_mode(text: str | None) -> str | None:
    return None if text is None else check_reuse_modes(text, one=True)[0]


def _say_cold_estimates(task, hint: str):
    """Before a cold run expected to take long, one line on stderr: how long, and ``hint``."""
    def said(item) -> None:
        if isinstance(item, ColdEstimate):
            print(f"kvprimer: {item.text()}{hint}", file=sys.stderr, flush=True)
    task.on_partial = said
    return task


def cmd_run(args) -> int:
    tpl = read_template(args.template, args.model)
    opts = session_options(args, project_options(args.template), reuse_mode=_one_mode(args.reuse),
                           recompute=args.recompute, measure_noise=args.noise)
    paths = "cold" if args.cold else "warm" if args.warm else "both"
    # refuses missing, blank and unknown values before the model loads
    plan = flows.run_plan(tpl, [Row(1, _values(args))], opts, paths=paths, snapshot=False,
                          model=args.model)
    with open_engine(args) as eng:
        plan = replace(plan, restore=load_state_file(eng, args.state, tpl))
        hint = "; --warm skips it" if paths == "both" else ""
        task = _say_cold_estimates(progress_printer(), hint)
        rep = flows.run_rows(eng, plan, task).records[0].report

    def words():
        print(f"prompt {rep.prompt_tokens} tokens; reused {rep.reuse_text()} "
              f"(tokenize {rep.tokenize_ms:.1f} ms)")
        if rep.recompute:
            print(rep.recompute.describe())
        for path in (rep.cold, rep.warm):
            if path:
                kept = " (kept from an earlier run)" if path is rep.cold and rep.cold_kept else ""
                print(f"{path.mode:>5}: restore {path.restore_ms:7.1f} ms  time to first token "
                      f"{path.ttft_ms:8.1f} ms  {path.tokens_per_s:6.1f} tok/s  -> {path.text!r}"
                      f"{kept}")
        if rep.breakdown:
            print(f"warm time: {rep.breakdown.describe()}")
            if rep.breakdown.batching_note:
                print(f"note: {rep.breakdown.batching_note}")
        if rep.speedup:
            print(f"speedup {rep.speedup:.1f}x")
        if rep.oneshot and rep.cold and rep.warm:
            print(f"noise run (one-shot cold): time to first token {rep.oneshot.ttft_ms:8.1f} ms")
        if rep.verdict_text():
            print(f"verdict: {rep.verdict_text()}")

    emit(args, report_dict(rep), words)
    return verdicts_code([(rep.reuse, rep.verdict)])


def cmd_bench(args) -> int:
    if args.csv and (args.server or args.fork):
        raise KvPrimerError("--csv writes a cold/warm benchmark's rows; with --server or --fork "
                            "use --json-out")
    if args.server:
        return cmd_bench_server(args)
    if args.fork:
        return cmd_bench_forked(args)
    tpl = read_template(args.template, args.model)
    rows = rows_of(args, tpl)
    check_save(args)
    modes = check_reuse_modes(args.reuse) if args.reuse else ("prefix",) if args.state else None
    opts = session_options(args, project_options(args.template), bench_modes=modes,
                           repeat=args.repeat, recompute=args.recompute,
                           measure_noise=args.noise)
    plan = flows.bench_plan(tpl, rows, opts, snapshot=False, model=args.model)
    with open_engine(args) as eng, cancel_on_interrupt(progress_printer()) as task:
        _say_cold_estimates(task, "; Ctrl+C stops with the rows finished")
        state = load_state_file(eng, args.state, tpl)
        plan = flows.bench_plan(tpl, rows, opts, restore=state, snapshot=False)
        res = flows.bench(eng, plan, task).result

    def words():
        print(f"{'row':>4} {'reuse':<8} {'prompt':>6} {'reused':>6} {'eval':>5} {'cold ms':>9} "
              f"{'warm ms':>8} {'speedup':>7}  verdict")
        for r in res.rows:
            if r.error:
                print(f"{r.row:>4} {r.reuse:<8} error: {r.error}")
                continue
            print(f"{r.row:>4} {r.reuse:<8} {r.prefix_tokens + r.suffix_tokens:>6} "
                  f"{r.reused_tokens:>6} {r.evaluated_tokens:>5} {r.cold_ms:>9.1f} "
                  f"{r.warm_ms:>8.1f} {r.speedup:>6.1f}x  {r.verdict().describe()}"
                  + (f" · recomputed {r.recompute_share:.0%}" if r.recompute_share else "")
                  + (f" · {r.load_words()}" if r.remeasured else ""))
        for line in res.mode_lines():
            print(line)

    emit(args, results_dict(res), words)
    if args.csv:
        write_results(args.csv, res, fmt="csv")
        if not args.json:
            print(f"wrote {args.csv}")
    save_results(args, lambda session: session.set_bench(res))
    if res.cancelled:  # Ctrl+C: the rows finished are above (and saved with --save)
        return ExitCode.INTERRUPTED
    return verdicts_code([(r.reuse, r.verdict()) for r in res.rows],
                         res.summary()["failed_rows"])


def cmd_demo(args) -> int:
    from ..resources_path import examples_dir

    ex = examples_dir()
    tpl = read_template(str(ex / "rag.tmpl"))
    row = read_rows(ex / "rag-rows.csv", tpl.placeholders)[0]
    plan = flows.run_plan(tpl, [row], session_options(args), snapshot=False)
    if not args.json:
        print(f"KV Primer demo: the RAG example ({ex / 'rag.tmpl'}), first row\n")
    with open_engine(args) as eng:
        rep = flows.run_rows(eng, plan, progress_printer()).records[0].report

    def words():
        print(f"prefix {rep.prefix_tokens} tokens primed; prompt {rep.prompt_tokens} tokens; "
              f"reused {rep.reuse_text()}")
        print(f"cold {rep.cold.ttft_ms:.0f} ms, warm {rep.warm.ttft_ms:.0f} ms to first token: "
              f"{rep.speedup:.1f}x faster; verdict {rep.verdict.describe()}")
        print(f"warm time: {rep.breakdown.describe()}")
        print(f"answer: {rep.warm.text.strip()}")

    emit(args, report_dict(rep), words)
    return verdicts_code([(rep.reuse, rep.verdict)])
