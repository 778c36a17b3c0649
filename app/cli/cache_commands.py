"""`kvprimer cache`: what the radix cache holds after priming a template and running rows, and
`--clear` to empty it.

A command-line process starts with an empty cache, so this one fills it the way the window
would (prime, then each row warm in file order, the window's run flow) and lists the tiers and
the cached prompts; with ``--clear`` it then empties the cache as the Cache panel's Clear does
(engine.clear_cache) and lists what is left.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict

from ..engine import KvPrimerError, read_rows
from ..engine import session_flows as flows
from ..engine.runs.prompt_runs import check_reuse_modes
from ..engine.session import Options
from .engine_options import open_engine, progress_printer, read_template, session_options
from .exit_codes import ExitCode
from .output import emit


def cache_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template", nargs="?", help="template whose prefix (and rows) fill the cache")
    p.add_argument("--rows", help="CSV or JSONL file of values to run warm, in order")
    p.add_argument("--reuse", default=None, metavar="MODE",
                   help=f"prefix, chain or compose: what the rows reuse and leave "
                        f"({Options().reuse_mode})")
    p.add_argument("--clear", action="store_true",
                   help="empty the cache (every cached prompt, every tier) and list what is left")


def cmd_cache(args) -> int:
    if args.template is None:
        if not args.clear:
            raise KvPrimerError("give a template whose prefix and rows fill the cache, or --clear")
        # each kvprimer command starts with an empty cache and removes its files when it ends
        emit(args, {"tiers": [], "nodes": [], "rows": [], "cleared": 0}, lambda: print(
            "the cache is empty: each kvprimer command starts with an empty cache and removes "
            "its files when it ends (the window's Cache panel has Clear for its own)"))
        return ExitCode.OK
    tpl = read_template(args.template, args.model)
    rows = read_rows(args.rows, tpl.placeholders) if args.rows else []
    reuse = check_reuse_modes(args.reuse, one=True)[0] if args.reuse else None
    opts = session_options(args, reuse_mode=reuse)
    plan = flows.run_plan(tpl, rows, opts, paths="warm", oneshot=False, snapshot=False) if rows else None
    task = progress_printer()
    with open_engine(args) as eng:
        eng.prime_node(tpl, task)
        records = flows.run_rows(eng, plan, task).records if plan else ()
        cleared = None
        if args.clear:
            cleared = len(eng.cache.nodes())
            eng.clear_cache()
        tiers = [asdict(t) for t in eng.cache.tier_usage()]
        nodes = [asdict(n) for n in eng.cache.nodes()]
    hits = [{"row": r.row, "reused": r.report.reuse_text()} for r in records]

    def words():
        for h in hits:
            print(f"row {h['row']:>3}: {h['reused']}")
        if cleared is not None:
            print(f"cleared the cache: {cleared} cached prompts dropped")
        print(f"{'tier':<9} {'nodes':>5} {'used MB':>9} {'cap MB':>9}")
        for t in tiers:
            print(f"{t['name']:<9} {t['nodes']:>5} {t['used_bytes'] / 2**20:>9.1f} "
                  f"{t['cap_bytes'] / 2**20:>9.1f}")
        # hybrid and recurrent models: the recurrent state each node keeps at its depth
        stateful = any(n["recurrent_bytes"] for n in nodes)
        rs_head = f" {'rec. KiB':>9}" if stateful else ""
        print(f"\n{'id':>4} {'parent':>6} {'tier':<8} {'tokens':>6} {'own':>5} {'hits':>4}"
              f"{rs_head}  what")
        for n in nodes:
            kib = f"{n['recurrent_bytes'] / 1024:.1f}" if n["recurrent_bytes"] else "-"
            rs = f" {kib:>9}" if stateful else ""
            print(f"{n['id']:>4} {n['parent_id'] or '':>6} {n['tier']:<8} {n['tokens']:>6} "
                  f"{n['own_tokens']:>5} {n['hits']:>4}{rs}  {n['label']}")

    data = {"tiers": tiers, "nodes": nodes, "rows": hits}
    if cleared is not None:
        data["cleared"] = cleared
    emit(args, data, words)
    return ExitCode.OK
