"""`kvprimer kv` and `kvprimer bench --fork K`: the KV cache view and forked batches."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..engine import GenerationConfig, KvPrimerError
from ..engine.runs.forked_bench import bench_forked
from .engine_options import load_state_file, open_engine, progress_printer, read_template, rows_of


def kv_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--fork", type=int, default=0, metavar="K",
                   help="fork sequence 0 into K more sequences")
    p.add_argument("--json", action="store_true")


def cmd_kv(args) -> int:
    tpl = read_template(args.template)
    if args.fork < 0:
        raise KvPrimerError(f"--fork must be 0 or more, not {args.fork}")
    with open_engine(args) as eng:
        most = eng.config.n_seq_max - 3  # the prefix's node and the cache's scratch sequence
        if args.fork > most:
            raise KvPrimerError(f"--fork {args.fork} needs {args.fork} more sequences; this "
                                f"context has room to fork into at most {most}")
        node = eng.prime_node(tpl, progress_printer())
        eng.fork(node.seq, 0)
        for _ in range(args.fork):
            eng.fork(0, eng.cache.take_work_seq())
        view = eng.kv_view()
    if args.json:
        print(json.dumps(view.as_dict(), indent=2))
        return 0
    print(f"{'seq':>3} {'cells':>7} {'positions':>13} {'shared':>7}")
    for u in view.sequences:
        shared = "?" if u.shared_cells is None else f"{u.shared_cells:,}"
        print(f"{u.seq:>3} {u.cells:>7,} {f'{u.pos_min}-{u.pos_max}':>13} {shared:>7}")
    used = "?" if view.used_cells is None else f"{view.used_cells:,}"
    used_b = "?" if view.used_bytes is None else f"{view.used_bytes:,}"
    print(f"used {used}/{view.n_cells:,} cells ({used_b} of {view.total_bytes:,} bytes); "
          f"source: {view.source}" + (f" ({view.note})" if view.note else ""))
    return 0


def cmd_bench_forked(args) -> int:
    tpl = read_template(args.template)
    rows = rows_of(args, tpl)
    with open_engine(args) as eng:
        state = load_state_file(eng, args.state, tpl)
        res = bench_forked(eng, tpl, rows, args.fork, state=state,
                           gen=GenerationConfig(max_tokens=args.max_tokens), task=progress_printer())
    print(f"{'rows':>12} {'eval':>5} {'gen':>4} {'decodes':>7} {'forked ms':>10} "
          f"{'one-by-one ms':>13} {'speedup':>7}  equivalence")
    for b in res.batches:
        eq = "tokens equal" if b.tokens_equal else f"TOKENS DIFFER in {b.rows_equal.count(False)} rows"
        print(f"{','.join(map(str, b.rows)):>12} {b.evaluated_tokens:>5} {b.generated_tokens:>4} "
              f"{b.prompt_decodes:>7} {b.forked_ms:>10.1f} {b.sequential_ms:>13.1f} "
              f"{b.speedup:>6.2f}x  {eq}, max |Δlogit| {b.max_logit_diff:.3g}")
    s = res.summary()
    print(f"forked batches of {s['k']}: {s['forked_rows_per_s']:.2f} rows/s, "
          f"{s['forked_tokens_per_s']:.0f} tok/s; one by one warm: {s['sequential_rows_per_s']:.2f} "
          f"rows/s, {s['sequential_tokens_per_s']:.0f} tok/s; speedup {s['speedup']:.2f}x; "
          f"all tokens equal: {s['all_tokens_equal']}; max |Δlogit| {s['max_logit_diff']:.3g}")
    if args.json:
        Path(args.json).write_text(json.dumps(res.as_dict(), indent=2))
        print(f"wrote {args.json}")
    return 0 if s["all_tokens_equal"] else 2
