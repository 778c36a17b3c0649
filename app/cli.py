"""The `kvprimer` command line: the same engine API the window uses.

Exit codes: 0 success, 2 bad input (one line on stderr, no traceback), 130 interrupted.
Model and context options are named as llama.cpp's own tools name them.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__
from .engine import (Engine, EngineConfig, GenerationConfig, KvPrimerError, PrefixState,
                     TaskState, Template, bench_rows, read_rows, run_prompt)
from .engine.native import KV_TYPES
from .engine.task_state import Progress
from .kv_commands import cmd_bench_forked, cmd_kv


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"kvprimer: error: {message} (see kvprimer --help)\n")


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens (4096)")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (all)")
    g.add_argument("-b", "--batch-size", type=int, default=256, help="tokens per decode batch (256)")
    g.add_argument("-ctk", "--cache-type-k", default="f16", choices=list(KV_TYPES), help="K cache type")
    g.add_argument("-ctv", "--cache-type-v", default="f16", choices=list(KV_TYPES), help="V cache type")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    ap = _Parser(prog="kvprimer", description="Prime a prompt template's static prefix once; "
                 "restore it on every call and evaluate only the rest.")
    ap.add_argument("--version", action="store_true", help="print versions and exit")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("info", parents=[common], help="model facts and KV bytes per token")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("prime", parents=[common], help="evaluate a template's static prefix and save its state")
    p.add_argument("template")
    p.add_argument("-o", "--output", required=True, help="state file to write (.kvstate)")

    p = sub.add_parser("run", parents=[common], help="run a filled template cold and warm")
    p.add_argument("template")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a placeholder's value")
    p.add_argument("--set-file", action="append", default=[], metavar="NAME=PATH", help="a value read from a file")
    p.add_argument("--state", help="a saved .kvstate to restore (default: prime now)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cold", action="store_true", help="cold only")
    mode.add_argument("--warm", action="store_true", help="warm only")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", parents=[common], help="cold vs warm over rows of values")
    p.add_argument("template")
    p.add_argument("--rows", required=True, help="CSV or JSONL file of values")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--state", help="a saved .kvstate to restore (default: prime now)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--fork", type=int, default=0, metavar="K",
                   help="run the rows as forked batches of K against the same rows one by one warm")

    p = sub.add_parser("kv", parents=[common], help="prime into sequence 0, fork, show the KV cells")
    p.add_argument("template")
    p.add_argument("--fork", type=int, default=0, metavar="K", help="fork into K more sequences")
    p.add_argument("--json", action="store_true")

    sub.add_parser("demo", parents=[common], help="prime the RAG example and run its first row")
    return ap


def main(argv: list[str] | None = None) -> int:
    # llama.cpp's warnings go to the "kvprimer.llama" logger; without a handler Python would
    # print them to stderr around our one-line error (which already quotes the one that matters)
    root = logging.getLogger("kvprimer")
    if not root.handlers:
        root.addHandler(logging.NullHandler())
    args = build_parser().parse_args(argv)
    if args.version:
        print(version_text())
        return 0
    if not args.command:
        build_parser().print_help()
        return 0
    try:
        return COMMANDS[args.command](args)
    except KvPrimerError as e:
        print(f"kvprimer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvprimer: interrupted", file=sys.stderr)
        return 130


def version_text() -> str:
    from .engine.native import versions

    v = versions()
    return (f"kvprimer {__version__}\nllama-cpp-python {v['llama_cpp_python']}\n"
            f"llama.cpp {v['llama_cpp_build']}")


def _engine(args) -> Engine:
    for flag, value, low in (("--ctx-size", args.ctx_size, 16), ("--batch-size", args.batch_size, 1),
                             ("--threads", args.threads, 0)):
        if value < low:
            raise KvPrimerError(f"{flag} must be at least {low}, not {value}")
    return Engine(EngineConfig(model_path=args.model, n_ctx=args.ctx_size, n_batch=args.batch_size,
                               n_threads=args.threads, type_k=args.cache_type_k,
                               type_v=args.cache_type_v))


def read_template(path: str) -> Template:
    return Template.load(path)


def _progress_printer() -> TaskState:
    tty = sys.stderr.isatty()

    def show(p: Progress) -> None:
        if not tty or p.stage == "generate":
            return
        eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None and p.done < p.total else ""
        end = "\n" if p.done >= p.total else ""
        print(f"\r{p.stage}: {p.done}/{p.total} tokens ({p.rate:.0f} tok/s{eta})   ", end=end,
              file=sys.stderr, flush=True)

    return TaskState(on_progress=show)


def cmd_info(args) -> int:
    with _engine(args) as eng:
        info = eng.info.as_dict()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        width = max(map(len, info))
        for k, v in info.items():
            print(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")
    return 0


def cmd_prime(args) -> int:
    tpl = read_template(args.template)
    with _engine(args) as eng:
        state = eng.prime(tpl, task=_progress_printer())
        size = state.save(args.output)
        raw = state.n_tokens * eng.info.kv_bytes_per_token
    print(f"primed {state.n_tokens} prefix tokens -> {args.output} ({size:,} bytes; "
          f"raw KV {raw:,} bytes, ratio {size / raw:.4f})")
    return 0


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


def cmd_run(args) -> int:
    tpl = read_template(args.template)
    values = _values(args)
    tpl.fill(values)  # report missing/unknown values before loading the model
    gen = GenerationConfig(args.max_tokens, args.temp, args.top_p, args.seed)
    with _engine(args) as eng:
        state = eng.load_state(args.state) if args.state else None
        rep = run_prompt(eng, tpl, values, state=state, cold=not args.warm, warm=not args.cold,
                         oneshot=not (args.cold or args.warm), gen=gen, task=_progress_printer())
    if args.json:
        print(json.dumps(report_dict(rep), indent=2))
        return 0
    print(f"prompt {rep.prompt_tokens} tokens: {rep.reused_tokens} reused, "
          f"{rep.evaluated_tokens} evaluated (tokenize {rep.tokenize_ms:.1f} ms)")
    for path in (rep.cold, rep.warm):
        if path:
            print(f"{path.mode:>5}: restore {path.restore_ms:7.1f} ms  time to first token "
                  f"{path.ttft_ms:8.1f} ms  {path.tokens_per_s:6.1f} tok/s  -> {path.text!r}")
    if rep.speedup:
        print(f"speedup {rep.speedup:.1f}x")
    if rep.equivalence:
        eq = rep.equivalence
        verdict = "PASS" if eq.exact else "FAIL"
        where = "" if eq.first_diff is None else f", first difference at generated token {eq.first_diff}"
        print(f"equivalence {verdict}: tokens_equal={eq.tokens_equal} max_logit_diff="
              f"{eq.max_logit_diff:g}{where}; one-shot cold: tokens_equal={eq.oneshot_tokens_equal} "
              f"max_logit_diff={eq.oneshot_max_logit_diff:g}")
    return 0


def report_dict(rep) -> dict:
    def path(p):
        if p is None:
            return None
        return {"reused_tokens": p.reused_tokens, "evaluated_tokens": p.evaluated_tokens,
                "restore_ms": p.restore_ms, "prompt_ms": p.prompt_ms, "ttft_ms": p.ttft_ms,
                "gen_ms": p.gen_ms, "tokens_per_s": p.tokens_per_s, "tokens": p.tokens, "text": p.text}
    eq = rep.equivalence
    return {"prompt_tokens": rep.prompt_tokens, "prefix_tokens": rep.prefix_tokens,
            "reused_tokens": rep.reused_tokens, "evaluated_tokens": rep.evaluated_tokens,
            "tokenize_ms": rep.tokenize_ms, "state_bytes": rep.state_bytes, "speedup": rep.speedup,
            "cold": path(rep.cold), "warm": path(rep.warm),
            "equivalence": None if eq is None else {**eq.__dict__, "exact": eq.exact}}


def cmd_bench(args) -> int:
    if args.fork:
        return cmd_bench_forked(args)
    tpl = read_template(args.template)
    rows = read_rows(args.rows, tpl.placeholders)
    with _engine(args) as eng:
        state = eng.load_state(args.state) if args.state else None
        res = bench_rows(eng, tpl, rows, repeat=args.repeat, state=state,
                         gen=GenerationConfig(max_tokens=args.max_tokens), task=_progress_printer())
    print(f"{'row':>4} {'prefix':>6} {'suffix':>6} {'reused':>6} {'eval':>5} {'cold ms':>9} "
          f"{'warm ms':>8} {'speedup':>7}  equivalence")
    for r in res.rows:
        if r.error:
            print(f"{r.row:>4}  error: {r.error}")
            continue
        eq = "exact" if r.tokens_equal and r.max_logit_diff == 0 else (
            f"DIFF at {r.first_diff}, |Δlogit| {r.max_logit_diff:.3g}")
        print(f"{r.row:>4} {r.prefix_tokens:>6} {r.suffix_tokens:>6} {r.reused_tokens:>6} "
              f"{r.evaluated_tokens:>5} {r.cold_ms:>9.1f} {r.warm_ms:>8.1f} {r.speedup:>6.1f}x  {eq}"
              f"  (one-shot |Δlogit| {r.oneshot_max_logit_diff or 0:.3g})")
    s = res.summary()
    if s["speedup_median"] is not None:
        print(f"median: cold {s['cold_ms_median']:.1f} ms, warm {s['warm_ms_median']:.1f} ms, "
              f"speedup {s['speedup_median']:.1f}x; all tokens equal: {s['all_tokens_equal']}; "
              f"max |Δlogit| {s['max_logit_diff']:g}")
    if args.json:
        Path(args.json).write_text(json.dumps(res.as_dict(), indent=2))
        print(f"wrote {args.json}")
    return 0 if not s["failed_rows"] else 2


def cmd_demo(args) -> int:
    from .resources_path import examples_dir

    ex = examples_dir()
    tpl = read_template(str(ex / "rag.tmpl"))
    row = read_rows(ex / "rag-rows.csv", tpl.placeholders)[0]
    print(f"KV Primer demo: the RAG example ({ex / 'rag.tmpl'}), first row\n")
    with _engine(args) as eng:
        rep = run_prompt(eng, tpl, row.values, task=_progress_printer(),
                         gen=GenerationConfig(max_tokens=24))
    print(f"prefix {rep.prefix_tokens} tokens primed; prompt {rep.prompt_tokens} tokens: "
          f"{rep.reused_tokens} reused, {rep.evaluated_tokens} evaluated")
    print(f"cold {rep.cold.ttft_ms:.0f} ms, warm {rep.warm.ttft_ms:.0f} ms to first token: "
          f"{rep.speedup:.1f}x faster; equivalence "
          f"{'PASS' if rep.equivalence.exact else 'FAIL'}")
    print(f"answer: {rep.warm.text.strip()}")
    return 0


COMMANDS = {"kv": cmd_kv, "info": cmd_info, "prime": cmd_prime, "run": cmd_run, "bench": cmd_bench,
            "demo": cmd_demo}

if __name__ == "__main__":
    sys.exit(main())
