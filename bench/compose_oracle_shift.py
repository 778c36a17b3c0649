"""A probe beside the compose-oracle section: the same recomputed runs with each placed part
shifted when its turn comes (as the section measures them) and with every module shifted once
for the row first (OracleContext.compose's ``shift_once``), on a few rows, paired against prefix
mode's time on the same row. `python -m bench.compose_oracle_shift` adds its figures to
results.json's "compose_oracle" section as "shift_once" (the section's table says them)."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from app.engine import Template, read_rows
from app.engine.llama.model_files import default_model_path
from app.engine.llama.native import NativeModel, ensure_backend
from app.engine.runs.verdict import compare_runs
from app.resources_path import examples_dir

from .compose_oracle import OracleContext, deviation
from .compose_oracle_run import plan_rows
from .compose_oracle_select import METHODS, choose

ROWS = (12, 36, 46)  # indices into rag-recurring.csv
SHARES = (0.1, 0.3)


def run_probe(rows=ROWS, shares=SHARES, n_threads: int = 1, log=print) -> dict:
    ensure_backend()
    model = NativeModel(default_model_path())
    tpl = Template.parse((examples_dir() / "rag.tmpl").read_text(encoding="utf-8"))
    all_rows = read_rows(examples_dir() / "rag-recurring.csv", tpl.placeholders)
    prefix, plans = plan_rows(model, tpl, [all_rows[i] for i in rows])
    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "loadavg_start": round(os.getloadavg()[0], 2), "rows": []}
    oc = OracleContext(model, 4096, 256, n_threads)
    try:
        oc.prime(prefix)
        for plan in plans:
            cold = oc.cold(plan, 8)
            dev = deviation(cold.state, oc.compose(plan, [], 8, want_state=True).state, plan)
            lengths = [e - s for s, e in plan.modules]
            pre = [oc.prefix_mode(plan)]
            cells = {}
            for m in METHODS:
                for share in shares:
                    pos = plan.positions(choose(m, share, lengths, dev))
                    a, b = oc.compose(plan, pos, 8), oc.compose(plan, pos, 8, shift_once=True)
                    ca = compare_runs(cold.tokens, cold.logits, a.tokens, a.logits)
                    cb = compare_runs(cold.tokens, cold.logits, b.tokens, b.logits)
                    cells[f"{m}@{share:g}"] = {
                        "runs": a.runs, "each_ms": round(a.ms, 2), "once_ms": round(b.ms, 2),
                        "each_equal": ca.tokens_equal, "once_equal": cb.tokens_equal,
                        "each_kl": ca.kl_divergence, "once_kl": cb.kl_divergence}
            pre.append(oc.prefix_mode(plan))
            ref = statistics.fmean(pre)
            for c in cells.values():
                c["each_vs_prefix"] = round(c["each_ms"] / ref, 4)
                c["once_vs_prefix"] = round(c["once_ms"] / ref, 4)
            out["rows"].append({"number": plan.number, "prefix_ms": pre, "cells": cells})
            log(f"shift probe: row {plan.number}")
    finally:
        oc.close()
        model.close()
    out["loadavg_end"] = round(os.getloadavg()[0], 2)
    return out


def main(argv=None) -> int:
    path = Path(__file__).resolve().parent / "results.json"
    probe = run_probe()
    res = json.loads(path.read_text(encoding="utf-8"))
    res.setdefault("compose_oracle", {})["shift_once"] = probe
    path.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
