"""`kvprimer info|prime|run|bench|demo`: a template's prefix primed once, runs cold and warm."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..engine import (GenerationConfig, KvPrimerError, bench_rows, read_rows, report_dict,
                      run_prompt)
from ..engine.files.llama_state_file import FORMATS, save_state
from ..engine.files.project_file import SUFFIX
from .engine_options import (load_state_file, open_engine, progress_printer, read_project,
                             read_template, reuse_mode, reuse_modes, rows_of)
from .kv_commands import cmd_bench_forked
from .server_commands import cmd_bench_server, server_target_options


def info_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--remeasure", action="store_true",
                   help="time both attention kernels again instead of using the cached measurement")


def prime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("-o", "--output", required=True, help="state file to write (.kvstate)")
    p.add_argument("--format", choices=FORMATS, default="kvprimer",
                   help="kvprimer (default; carries the model's identity) or llama (llama.cpp's "
                        "own sequence state, as llama_state_seq_load_file and llama-server read it)")


def run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a placeholder's value")
    p.add_argument("--set-file", action="append", default=[], metavar="NAME=PATH", help="a value read from a file")
    p.add_argument("--state", help="a saved state to restore, .kvstate or llama.cpp's (default: prime now)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cold", action="store_true", help="cold only")
    mode.add_argument("--warm", action="store_true", help="warm only")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    _reuse_options(p, "chain")
    p.add_argument("--json", action="store_true")


def _reuse_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--reuse", default=default, metavar="MODE",
                   help=f"what a warm run reuses: prefix (the static prefix), chain (the deepest "
                        f"cached prompt: exact), compose (cached modules per slot: approximate)"
                        f"{'; a comma list compares several' if default == 'prefix' else ''} "
                        f"({default})")
    p.add_argument("--recompute", type=int, default=0, metavar="K",
                   help="compose: evaluate the first K tokens of each module in context (0)")


def bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template", help="template file, or a project file (.kvproj) with its rows")
    p.add_argument("--rows", help="CSV or JSONL file of values (default: the project's rows)")
    p.add_argument("--save", action="store_true",
                   help="store the results in the project file given as the template")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--state", help="a saved state to restore, .kvstate or llama.cpp's (default: prime now)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--fork", type=int, default=0, metavar="K",
                   help="run the rows as forked batches of K against the same rows one by one warm")
    _reuse_options(p, "prefix")
    server_target_options(p)


def no_options(p: argparse.ArgumentParser) -> None:
    pass


def cmd_info(args) -> int:
    with open_engine(args) as eng:
        info = eng.info.as_dict()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        traits = info.pop("traits")
        notes = traits.pop("notes")
        cpu = info.pop("cpu_kernels", None)
        kernels = info.pop("kernels", None)
        width = max(map(len, info))
        for k, v in info.items():
            if isinstance(v, bool):  # before int: a bool is an int to Python
                v = "yes" if v else "no"
            print(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")
        print("architecture traits: " + ", ".join(
            f"{k} {('yes' if v else 'no') if isinstance(v, bool) else v}" for k, v in traits.items()))
        print("for caching:")
        for line in notes:
            print(f"  - {line}")
        if kernels:  # flash attention on or off: measured here, or why there was no choice
            state = {True: "on", False: "off", None: "not used"}[kernels["flash_attn"]]
            print(f"attention kernel: flash attention {state} ({kernels['how']})")
            print(f"  - {kernels['reason']}")
        if cpu:  # AMX / repacked weights: what llama.cpp runs here, and why (cpu_kernels.py)
            print(f"cpu kernels: {cpu['summary']}")
            print(f"  - {cpu['reason']}")
            print(f"  - crash check: {cpu['probe']}")
    return 0


def cmd_prime(args) -> int:
    tpl = read_template(args.template)
    with open_engine(args) as eng:
        state = eng.prime(tpl, task=progress_printer())
        size = save_state(state, args.output, args.format)
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
    mode = reuse_mode(args.reuse)
    gen = GenerationConfig(args.max_tokens, args.temp, args.top_p, args.seed)
    with open_engine(args) as eng:
        state = load_state_file(eng, args.state, tpl)
        rep = run_prompt(eng, tpl, values, reuse=mode, state=state, cold=not args.warm,
                         warm=not args.cold, oneshot=not (args.cold or args.warm), gen=gen,
                         recompute=args.recompute, task=progress_printer())
    if args.json:
        print(json.dumps(report_dict(rep), indent=2))
        return 0
    print(f"prompt {rep.prompt_tokens} tokens; reused {rep.reuse_text()} "
          f"(tokenize {rep.tokenize_ms:.1f} ms)")
    for path in (rep.cold, rep.warm):
        if path:
            print(f"{path.mode:>5}: restore {path.restore_ms:7.1f} ms  time to first token "
                  f"{path.ttft_ms:8.1f} ms  {path.tokens_per_s:6.1f} tok/s  -> {path.text!r}")
    if rep.speedup:
        print(f"speedup {rep.speedup:.1f}x")
    if rep.verdict:
        print(f"verdict: {rep.verdict.describe()}")
    return 0


def cmd_bench(args) -> int:
    if args.server:
        return cmd_bench_server(args)
    if args.fork:
        return cmd_bench_forked(args)
    tpl = read_template(args.template)
    rows = rows_of(args, tpl)
    if args.save and Path(args.template).suffix != SUFFIX:
        raise KvPrimerError("--save stores results in a project file: give a .kvproj instead "
                            "of the template")
    modes = reuse_modes(args.reuse)
    with open_engine(args) as eng:
        state = load_state_file(eng, args.state, tpl)
        res = bench_rows(eng, tpl, rows, repeat=args.repeat, modes=modes, recompute=args.recompute,
                         state=state, gen=GenerationConfig(max_tokens=args.max_tokens),
                         task=progress_printer())
    print(f"{'row':>4} {'reuse':<8} {'prompt':>6} {'reused':>6} {'eval':>5} {'cold ms':>9} "
          f"{'warm ms':>8} {'speedup':>7}  verdict")
    for r in res.rows:
        if r.error:
            print(f"{r.row:>4} {r.reuse:<8} error: {r.error}")
            continue
        print(f"{r.row:>4} {r.reuse:<8} {r.prefix_tokens + r.suffix_tokens:>6} "
              f"{r.reused_tokens:>6} {r.evaluated_tokens:>5} {r.cold_ms:>9.1f} {r.warm_ms:>8.1f} "
              f"{r.speedup:>6.1f}x  {_verdict_cell(r)}")
    s = res.summary()
    for mode in res.modes:
        m = s[mode]
        if m["warm_ms_median"] is None:
            continue
        counts = ", ".join(f"{n} {w}" for w, n in m["equivalence"].items() if n)
        print(f"{mode}: median warm {m['warm_ms_median']:.1f} ms (cold {m['cold_ms_median']:.1f} ms, "
              f"speedup {m['speedup_median']:.1f}x), reused {m['reused_tokens_median']:.0f} "
              f"tokens; {counts}; max |Δlogit| {m['max_logit_diff']:.3g}"
              + (f"; modules built in {m['build_ms_total']:.0f} ms" if m["build_ms_total"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(res.as_dict(), indent=2))
        print(f"wrote {args.json}")
    if args.save:
        session = read_project(args.template)
        session.set_bench(res)
        session.to_project().save(args.template)
        print(f"saved the results in {args.template}")
    return 0 if not s["failed_rows"] else 2


def _verdict_cell(r) -> str:
    if r.equivalence == "bit-identical":
        return "bit-identical"
    if r.equivalence == "within-noise":
        return f"within-noise (|Δlogit| {r.max_logit_diff:.3g} ≤ {r.noise_max_logit_diff:.3g})"
    where = "tokens equal" if r.first_diff is None else f"first diff at token {r.first_diff}"
    return (f"diverged ({where}, |Δlogit| {r.max_logit_diff:.3g}, KL {r.kl_divergence:.2g}, "
            f"top-1 {r.top1_agree:.0%})")


def cmd_demo(args) -> int:
    from ..resources_path import examples_dir

    ex = examples_dir()
    tpl = read_template(str(ex / "rag.tmpl"))
    row = read_rows(ex / "rag-rows.csv", tpl.placeholders)[0]
    print(f"KV Primer demo: the RAG example ({ex / 'rag.tmpl'}), first row\n")
    with open_engine(args) as eng:
        rep = run_prompt(eng, tpl, row.values, task=progress_printer(),
                         gen=GenerationConfig(max_tokens=24))
    print(f"prefix {rep.prefix_tokens} tokens primed; prompt {rep.prompt_tokens} tokens; "
          f"reused {rep.reuse_text()}")
    print(f"cold {rep.cold.ttft_ms:.0f} ms, warm {rep.warm.ttft_ms:.0f} ms to first token: "
          f"{rep.speedup:.1f}x faster; verdict {rep.verdict.describe()}")
    print(f"answer: {rep.warm.text.strip()}")
    return 0
