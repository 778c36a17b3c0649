"""`kvprimer kv` and `kvprimer bench --fork K`: the KV cache view and forked batches."""
from __future__ import annotations

import argparse

from ..engine import kv_flows
from ..engine.benchmarks.forked_bench import bench_forked
from .engine_options import (load_state_file, open_engine, progress_printer, project_options,
                             read_template, rows_of, session_options)
from .exit_codes import ExitCode
from .output import emit, yes_no


def kv_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--fork", type=int, default=0, metavar="K",
                   help="fork sequence 0 into K more sequences")


def cmd_kv(args) -> int:
    tpl = read_template(args.template, args.model)
    with open_engine(args) as eng:
        view = kv_flows.fork_prefix(eng, tpl, args.fork, progress_printer())

    def words():
        print(f"{'seq':>3} {'cells':>7} {'positions':>13} {'shared':>7}")
        for u in view.sequences:
            shared = "?" if u.shared_cells is None else f"{u.shared_cells:,}"
            print(f"{u.seq:>3} {u.cells:>7,} {f'{u.pos_min}-{u.pos_max}':>13} {shared:>7}")
        used = "?" if view.used_cells is None else f"{view.used_cells:,}"
        used_b = "?" if view.used_bytes is None else f"{view.used_bytes:,}"
        print(f"used {used}/{view.n_cells:,} cells ({used_b} of {view.total_bytes:,} bytes); "
              f"source: {view.source}" + (f" ({view.note})" if view.note else ""))
        if view.stateful:  # one recurrent state per sequence, beside its attention cells
            print(f"layers: {view.layers}")
            for r in view.recurrent:
                print(f"seq {r.seq}: recurrent state at position {r.pos:,} ({r.bytes:,} bytes)")

    emit(args, view.as_dict(), words)
    return ExitCode.OK


def cmd_bench_forked(args) -> int:
    tpl = read_template(args.template, args.model)
    rows = rows_of(args, tpl)
    gen = session_options(args, project_options(args.template)).generation()
    with open_engine(args) as eng:
        state = load_state_file(eng, args.state, tpl)
        res = bench_forked(eng, tpl, rows, args.fork, state=state, gen=gen, task=progress_printer())
    s = res.summary()

    def words():
        print(f"{'rows':>12} {'eval':>5} {'gen':>4} {'decodes':>7} {'forked ms':>10} "
              f"{'one-by-one ms':>13} {'speedup':>7}  equivalence")
        for b in res.batches:
            eq = ("tokens equal" if b.tokens_equal
                  else f"TOKENS DIFFER in {b.rows_equal.count(False)} rows")
            print(f"{','.join(map(str, b.rows)):>12} {b.evaluated_tokens:>5} "
                  f"{b.generated_tokens:>4} {b.prompt_decodes:>7} {b.forked_ms:>10.1f} "
                  f"{b.sequential_ms:>13.1f} {b.speedup:>6.2f}x  {eq}, max |Δlogit| "
                  f"{b.max_logit_diff:.3g}")
        print(f"forked batches of {s['k']}: {s['forked_rows_per_s']:.2f} rows/s, "
              f"{s['forked_tokens_per_s']:.0f} tok/s; one by one warm: "
              f"{s['sequential_rows_per_s']:.2f} rows/s, {s['sequential_tokens_per_s']:.0f} "
              f"tok/s; speedup {s['speedup']:.2f}x; all tokens equal: "
              f"{yes_no(s['all_tokens_equal'])}; max |Δlogit| {s['max_logit_diff']:.3g}")

    emit(args, res.as_dict(), words)
    return ExitCode.OK if s["all_tokens_equal"] else ExitCode.RUNS_DIFFER
