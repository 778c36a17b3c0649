"""`kvprimer cache`: what the radix cache holds after priming a template and running rows.

A command-line process starts with an empty cache, so this one fills it the way the window
would (prime, then each row warm in file order) and lists the tiers and the cached prompts.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..engine import GenerationConfig, read_rows, run_prompt
from .engine_options import open_engine, progress_printer, read_template, reuse_mode


def cache_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--rows", help="CSV or JSONL file of values to run warm, in order")
    p.add_argument("--reuse", default="chain", metavar="MODE",
                   help="prefix, chain or compose: what the rows reuse and leave (chain)")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--json", action="store_true")


def cmd_cache(args) -> int:
    tpl = read_template(args.template)
    rows = read_rows(args.rows, tpl.placeholders) if args.rows else []
    mode = reuse_mode(args.reuse)
    task = progress_printer()
    with open_engine(args) as eng:
        eng.prime_node(tpl, task)
        hits = []
        for row in rows:
            rep = run_prompt(eng, tpl, row.values, reuse=mode, cold=False, oneshot=False,
                             gen=GenerationConfig(max_tokens=args.max_tokens), task=task)
            hits.append({"row": row.number, "reused": rep.reuse_text()})
        tiers = [asdict(t) for t in eng.cache.tiers()]
        nodes = [asdict(n) for n in eng.cache.nodes()]
    if args.json:
        print(json.dumps({"tiers": tiers, "nodes": nodes, "rows": hits}, indent=2))
        return 0
    for h in hits:
        print(f"row {h['row']:>3}: {h['reused']}")
    print(f"{'tier':<9} {'nodes':>5} {'used MB':>9} {'cap MB':>9}")
    for t in tiers:
        print(f"{t['name']:<9} {t['nodes']:>5} {t['used_bytes'] / 2**20:>9.1f} "
              f"{t['cap_bytes'] / 2**20:>9.1f}")
    print(f"\n{'id':>4} {'parent':>6} {'tier':<8} {'tokens':>6} {'own':>5} {'hits':>4}  what")
    for n in nodes:
        print(f"{n['id']:>4} {n['parent_id'] or '':>6} {n['tier']:<8} {n['tokens']:>6} "
              f"{n['own_tokens']:>5} {n['hits']:>4}  {n['label']}")
    return 0
