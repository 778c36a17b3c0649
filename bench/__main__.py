"""`python -m bench` (`make bench`): run the suite, print the table, write results.json and the
PNG chart. `--quick` is a short development run (1 row, 2 repeats, one sweep point);
`--only-reuse` runs the reuse section alone (our modes and the peers on rag-recurring.csv);
`--only-scale` the scale section alone (long prefixes on real-sized models, bench/scale.py);
`--only-compose-oracle` the compose-oracle section alone (compose with a recomputed share of
its tokens, bench/compose_oracle_run.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="1 row, 2 repeats, sweep at 256 tokens only (a few minutes)")
    ap.add_argument("--rows", type=int, help="rows of rag-rows.csv to run (2)")
    ap.add_argument("--repeats", type=int, help="repeats of every path per row (5)")
    ap.add_argument("--sweep", help="comma-separated prefix lengths, '' for none (256,512,1024)")
    ap.add_argument("--sweep-repeats", type=int, help="repeats per sweep point (3)")
    ap.add_argument("--threads", type=int, help="threads for ours and Llama (all cores)")
    ap.add_argument("--batch", type=int, default=256, help="n_batch = n_ubatch for both (256)")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama-cpp-python's paths")
    ap.add_argument("--no-q8", action="store_true", help="skip the q8_0 KV runs")
    ap.add_argument("--no-kv-bench", action="store_true",
                    help="skip bench/kv_bench.py's figures (debug-log cost, forked runs)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="skip the reuse section (prefix, chain, compose on rag-recurring.csv)")
    ap.add_argument("--reuse-rows", type=int,
                    help="rows of rag-recurring.csv the reuse section runs (all 48; --quick: 3)")
    ap.add_argument("--reuse-repeats", type=int,
                    help="resident fork / limit pairs per row in the reuse section (4)")
    ap.add_argument("--only-reuse", action="store_true",
                    help="run only the reuse section; writes bench/results-reuse.json unless "
                         "--out says otherwise (the figures under \"reuse\")")
    ap.add_argument("--peers-into", type=Path, metavar="FILE",
                    help="run only the reuse section's peers (the --no-* flags choose which) on "
                         "the rows FILE's reuse section ran, and add them to FILE")
    ap.add_argument("--no-native-peer", action="store_true",
                    help="reuse section: skip llama-cpp-python built natively (its first use "
                         "compiles it, about 11 minutes on 2 cores)")
    ap.add_argument("--no-server-peer", action="store_true",
                    help="reuse section: skip llama-server with its defaults")
    ap.add_argument("--server-slots", type=int, default=0,
                    help="reuse section: llama-server's slot count (-np; its default: auto, 4)")
    ap.add_argument("--no-kernel-table", action="store_true",
                    help="skip the kernel table (flash attention on/off x batches of 256/63)")
    ap.add_argument("--no-soak", action="store_true", help="skip the 1,000-run memory soak")
    ap.add_argument("--no-busy", action="store_true",
                    help="skip the busy-machine section (auto batch threads against every core "
                         "beside busy-loop processes)")
    ap.add_argument("--only-busy", action="store_true",
                    help="run only the busy-machine section; other figures in --out are kept")
    ap.add_argument("--no-first-start", action="store_true",
                    help="skip timing the engine's first start against a plain Llama load")
    ap.add_argument("--no-stalls", action="store_true",
                    help="skip the GUI responsiveness measure (event-loop stalls while priming)")
    ap.add_argument("--no-stateful", action="store_true",
                    help="skip the stateful-model section (random-weight lfm2, granitehybrid, mamba2)")
    ap.add_argument("--only-stateful", action="store_true",
                    help="run only the stateful-model section; other figures in --out are kept")
    ap.add_argument("--no-scale", action="store_true",
                    help="skip the scale section (2k-32k-token prefixes on the default model "
                         "declaring 32k, 2k-8k on a Llama 3.2 1B-shaped model; roughly 1-1.5 "
                         "hours on 2 quiet cores)")
    ap.add_argument("--only-scale", action="store_true",
                    help="run only the scale section; other figures in --out are kept")
    ap.add_argument("--scale-sizes",
                    help="scale section: prefix tokens on the default model's 32k shape "
                         "(2048,8192,32768; '' for none)")
    ap.add_argument("--scale-1b-sizes",
                    help="scale section: prefix tokens on the Llama 3.2 1B shape (2048,8192; "
                         "add 16384 if it fits; '' for none)")
    ap.add_argument("--scale-repeats", type=int, help="scale section: warm samples per path (3)")
    ap.add_argument("--scale-chart", type=Path, default=HERE / "results-scale.png")
    ap.add_argument("--no-compose-oracle", action="store_true",
                    help="skip the compose-oracle section (compose with 5-30%% of its tokens "
                         "recomputed, chosen three ways, against the cold run, on "
                         "rag-recurring.csv)")
    ap.add_argument("--only-compose-oracle", action="store_true",
                    help="run only the compose-oracle section; other figures in --out are kept")
    ap.add_argument("--oracle-rows", type=int,
                    help="compose-oracle section: rows of rag-recurring.csv (all 48; --quick: 2)")
    ap.add_argument("--oracle-chart", type=Path, default=HERE / "results-compose-oracle.png")
    ap.add_argument("--out", type=Path,
                    help="results file (bench/results.json; --only-reuse: results-reuse.json)")
    ap.add_argument("--chart", type=Path, default=HERE / "results.png")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = HERE / ("results-reuse.json" if args.only_reuse else "results.json")
    return args


def config_from(args):
    from .suite import BenchConfig

    quick = args.quick
    sweep = (256,) if quick else (256, 512, 1024)
    if args.sweep is not None:
        sweep = tuple(int(x) for x in args.sweep.split(",") if x.strip())
    return BenchConfig(
        rows=args.rows or (1 if quick else 2),
        repeats=args.repeats or (2 if quick else 5),
        sweep_points=sweep,
        sweep_repeats=args.sweep_repeats or (2 if quick else 3),
        n_threads=args.threads or os.cpu_count() or 1,
        n_batch=args.batch,
        llamacpp=not args.no_llamacpp,
        q8_0=not args.no_q8,
    )


def _section(results: dict, key: str, what: str, fn):
    """Run one section into ``results[key]``; its failure must not lose the figures already
    written (it is stored as an error, and said on stderr). Returns the figures or None."""
    try:
        results[key] = r = fn()
        return r
    except Exception as e:
        results[key] = {"error": f"{type(e).__name__}: {e}"}
        print(f"bench: {what} failed: {e}", file=sys.stderr)
        return None


def _section_in_steps(results: dict, args, key: str, what: str, fn):
    """A long section whose runner hands over its figures after each step (``fn(partial)``):
    results.json is written at every step, so a run stopped early keeps what it measured."""
    def partial(figures):
        results[key] = figures
        _write(results, args.out)

    figures = _section(results, key, what, lambda: fn(partial))
    if figures is None:
        _write(results, args.out)
    return figures


def _publish(results: dict, args, text: str, ratios: dict | None = None,
             goals: dict | None = None) -> None:
    """A section's ratios and goals join the others; the file is written, the text printed."""
    results.setdefault("ratios", {}).update(ratios or {})
    results.setdefault("goals", {}).update(goals or {})
    _write(results, args.out)
    print("\n" + text, flush=True)


def kv_bench_figures(results: dict, args) -> None:
    """The KV debug view's cost and forked batches (bench/kv_bench.py), under "kv_bench"."""
    if args.no_kv_bench:
        return
    from .kv_bench import run

    _section(results, "kv_bench", "bench/kv_bench.py", lambda: run(quick=args.quick))


def kernel_table(results: dict, args) -> None:
    """llama.cpp alone with each attention kernel and batch size (bench/kernel_table.py)."""
    if args.no_kernel_table or args.quick:
        return
    from .kernel_table import format_table, run

    t = _section(results, "kernel_table", "the kernel table", lambda: run(args.threads))
    if t is None:
        return
    _publish(results, args, format_table(t))


def first_start(results: dict, args) -> None:
    """The engine's first start (nothing cached) and a later one against a plain
    llama_cpp.Llama load (bench/first_start.py): first_start_s and its ratio join the ratios."""
    if args.no_first_start:
        return
    from .first_start import format_line, run

    r = _section(results, "first_start", "the first-start timing",
                 lambda: run(repeats=1 if args.quick else 3))
    if r is None:
        return
    _publish(results, args, format_line(r), {
        "first_start_s": r["first_start_s"],
        "first_start_vs_llamacpp_load": r["first_start_vs_llamacpp_load"]})


def busy_machine(results: dict, args) -> None:
    """Auto batch threads against every core, quiet and beside busy processes
    (bench/busy_machine.py): its ratios and goals join the others."""
    if args.no_busy:
        return
    from .busy_machine import format_lines, run
    from .ratios import goals_of

    r = _section(results, "busy_machine", "the busy-machine section",
                 lambda: run(samples=2 if args.quick else 5))
    if r is None:
        return
    _publish(results, args, format_lines(r), r["ratios"], goals_of(r["ratios"]))


def reuse_figures(results: dict, args) -> None:
    """The reuse section (bench/reuse_bench.py), under "reuse"; its ratios and goals also join
    the top-level ones."""
    if args.no_reuse:
        return
    from .report import format_reuse
    from .reuse_bench import ReuseConfig, run_reuse
    from .suite import _Log

    cfg = ReuseConfig(rows=args.reuse_rows or (3 if args.quick else 48),
                      fork_repeats=args.reuse_repeats or (2 if args.quick else 4),
                      n_threads=args.threads or os.cpu_count() or 1, n_batch=args.batch,
                      llamacpp=not args.no_llamacpp, native_peer=not args.no_native_peer,
                      server_peer=not args.no_server_peer, server_slots=args.server_slots)
    rz = _section(results, "reuse", "the reuse section", lambda: run_reuse(cfg, log=_Log()))
    if rz is not None:
        _publish(results, args, format_reuse(rz), rz["ratios"], rz["goals"])


def stateful_figures(results: dict, args) -> None:
    """The stateful-model section (bench/stateful_bench.py), under "stateful"."""
    if not args.no_stateful:
        from .stateful_bench import add_section

        add_section(results, quick=args.quick, n_threads=args.threads, n_batch=args.batch)
        _write(results, args.out)


def _sizes(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    return default if text is None else tuple(int(x) for x in text.split(",") if x.strip())


def scale_figures(results: dict, args) -> None:
    """The scale section (bench/scale.py), under "scale", with its chart; its ratios and goals
    join the top-level ones. results.json is written after every run of the section."""
    if args.no_scale:
        return
    from .scale import DEFAULT_1B_SIZES, DEFAULT_SIZES, ScaleConfig, run_scale
    from .scale_chart import render_scale_chart
    from .scale_report import format_scale
    from .suite import _Log

    quick = args.quick  # a short run: the default model's 32k shape at 512 tokens only
    cfg = ScaleConfig(sizes=_sizes(args.scale_sizes, (512,) if quick else DEFAULT_SIZES),
                      sizes_1b=_sizes(args.scale_1b_sizes, () if quick else DEFAULT_1B_SIZES),
                      repeats=args.scale_repeats or 3, n_batch=args.batch,
                      n_threads=args.threads or os.cpu_count() or 1,
                      llamacpp=not args.no_llamacpp, server=not args.no_server_peer)

    sc = _section_in_steps(results, args, "scale", "the scale section",
                           lambda partial: run_scale(cfg, log=_Log(), on_run=partial))
    if sc is None:
        return
    if any("error" not in r for r in sc["runs"]):
        render_scale_chart(sc, args.scale_chart)
    _publish(results, args, format_scale(sc), sc["ratios"], sc["goals"])


def compose_oracle_figures(results: dict, args) -> None:
    """The compose-oracle section (bench/compose_oracle_run.py), under "compose_oracle", with
    its chart; results.json is written after every row."""
    if args.no_compose_oracle:
        return
    from .compose_oracle_report import oracle_markdown, render_oracle_chart
    from .compose_oracle_run import OracleConfig, run_compose_oracle
    from .suite import _Log

    cfg = OracleConfig(rows=args.oracle_rows or (2 if args.quick else 48), n_batch=args.batch,
                       n_threads=args.threads or os.cpu_count() or 1)

    sec = _section_in_steps(results, args, "compose_oracle", "the compose-oracle section",
                            lambda partial: run_compose_oracle(cfg, log=_Log(), on_row=partial))
    if sec is None:
        return
    render_oracle_chart(sec, args.oracle_chart)
    _publish(results, args, oracle_markdown(sec))


def soak_and_stalls(results: dict, args) -> None:
    """The soak (RSS must not keep growing over 1,000 warm runs: bench/soak.py's leak rate) and the window's event-loop stalls
    while the default model primes the RAG prefix (goal: under 50 ms).

    The stall measure is the one part that needs Qt; app.ui is imported here only, so the rest
    of the bench runs without it."""
    if not args.no_soak:
        from .soak import soak

        r = soak(100 if args.quick else 1000)
        results["soak"] = {"runs": r.runs, "rss_start_mib": r.rss_start / (1 << 20),
                           "rss_end_mib": r.rss_end / (1 << 20), "growth_mib": r.growth / (1 << 20),
                           "leak_kib_per_run": r.leak_rate / 1024,
                           "leak_bound_kib_per_run": r.leak_bound / 1024, "seconds": r.seconds}
    if not args.no_stalls:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from app.ui.responsiveness import measure_prime_stalls

        try:
            results["gui_stalls"] = st = measure_prime_stalls(n_threads=args.threads or 0)
            print(f"GUI event loop while priming {st['prefix_tokens']} tokens ({st['prime_s']} s): "
                  f"max stall {st['max_stall_ms']} ms, p99 {st['p99_stall_ms']} ms, "
                  f"{st['stalls_over_50ms']} stalls over 50 ms")
        except RuntimeError as e:
            results["gui_stalls"] = {"error": str(e)}
            print(f"bench: GUI stall measure failed: {e}", file=sys.stderr)
    _write(results, args.out)


def only_reuse(args) -> int:
    """The reuse section alone, with the machine it ran on: a quicker run than the whole bench."""
    from .machine import loadavg, machine_info

    results = {"machine": machine_info(), "ratios": {}, "goals": {}}
    reuse_figures(results, args)
    results["machine"]["loadavg_end"] = loadavg()
    _write(results, args.out)
    print(f"\nwrote {args.out}")
    return 1 if "error" in results.get("reuse", {"error": "skipped"}) else 0


def peers_into(args) -> int:
    """The reuse section's peers added to a stored run of it (reuse_bench.add_peers)."""
    from .report import format_reuse
    from .reuse_bench import ReuseConfig, add_peers
    from .suite import _Log

    results = json.loads(args.peers_into.read_text(encoding="utf-8"))
    rz = add_peers(results["reuse"], ReuseConfig(
        llamacpp=not args.no_llamacpp, native_peer=not args.no_native_peer,
        server_peer=not args.no_server_peer, server_slots=args.server_slots), log=_Log())
    results["ratios"].update(rz["ratios"])
    results["goals"].update(rz["goals"])
    _write(results, args.peers_into)
    print("\n" + format_reuse(rz) + f"\n\nwrote {args.peers_into}", flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.peers_into:
        return peers_into(args)
    if args.only_reuse:
        return only_reuse(args)
    if args.only_stateful or args.only_busy or args.only_scale or args.only_compose_oracle:
        # the other figures stay as the last run wrote them
        results = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
        if args.only_compose_oracle:
            compose_oracle_figures(results, args)
            return 0 if "error" not in results.get("compose_oracle", {"error": ""}) else 1
        if args.only_scale:
            scale_figures(results, args)
            sc = results.get("scale", {})
            return 0 if "error" not in sc and sc.get("runs") else 1
        if args.only_busy:
            busy_machine(results, args)
            return 0 if results.get("busy_machine", {}).get("bit_identical") else 1
        stateful_figures(results, args)
        return 0 if "error" not in results.get("stateful", {}) else 1
    from .chart import render_chart
    from .report import format_report
    from .suite import run_suite

    results = run_suite(config_from(args))
    _write(results, args.out)  # first, so nothing after can lose the figures
    render_chart(results, args.chart)
    print(format_report(results), flush=True)
    kv_bench_figures(results, args)
    if "kv_bench" in results:
        _write(results, args.out)
        print("\nKV view cost and forked batches (bench/kv_bench.py):\n"
              + json.dumps(results["kv_bench"], indent=1, default=_json_default))
    kernel_table(results, args)
    first_start(results, args)
    reuse_figures(results, args)
    if "reuse" in results:
        render_chart(results, args.chart)
    stateful_figures(results, args)
    busy_machine(results, args)
    scale_figures(results, args)
    compose_oracle_figures(results, args)
    soak_and_stalls(results, args)
    print(f"\nwrote {args.out} and {args.chart}")
    return 0 if results["same_suffix_tokens"]["ok"] else 1


def _write(results: dict, path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, default=_json_default) + "\n", encoding="utf-8")


def _json_default(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


if __name__ == "__main__":
    sys.exit(main())
