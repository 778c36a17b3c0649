"""`kvprimer serve | deploy` and `kvprimer bench --server`: the same templates and rows on
llama-server and OpenAI-compatible servers (app/servers)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from dataclasses import asdict

from ..engine import GenerationConfig, KvPrimerError
from ..optional_extras import require_server_clients
from .engine_options import open_engine, progress_printer, read_template, rows_of
from .exit_codes import ExitCode
from .output import emit, yes_no


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def server_target_options(p: argparse.ArgumentParser) -> None:
    """The options that name a server (bench --server adds them to bench's own)."""
    g = p.add_argument_group("server target")
    g.add_argument("--server", metavar="URL", help="run the rows on this server instead of locally")
    g.add_argument("--api", default="llama", choices=("llama", "openai"),
                   help="llama: llama-server's own API (token-id prompts, slots); openai: any "
                        "OpenAI-compatible /v1/completions (llama-server, vLLM, SGLang) (llama)")
    g.add_argument("--flavor", default="auto", choices=("auto", "llama", "vllm", "sglang"),
                   help="openai API: whose server it is, for how to run cold (auto: ask it)")
    g.add_argument("--api-key", default="", help="openai API: a bearer token, if the server wants one")
    g.add_argument("--slot", type=int, default=None, metavar="N",
                   help="llama-server: the slot to use (default: the server chooses)")


def serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (8080; 0: a free one)")
    p.add_argument("--slot-dir", default="slots", metavar="DIR",
                   help="where the server reads and writes slot files (./slots)")
    p.add_argument("--log", metavar="FILE", help="write the server's output to FILE")
    p.add_argument("server_args", nargs=argparse.REMAINDER,
                   help="after --: more llama-server options, passed as they are")


def deploy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("template")
    p.add_argument("--server", required=True, metavar="URL", help="the llama-server to deploy to")
    p.add_argument("--slot", type=int, default=0, metavar="N", help="the slot to restore into (0)")
    p.add_argument("--slot-dir", required=True, metavar="DIR",
                   help="the server's slot directory (its --slot-save-path)")
    p.add_argument("--name", default="", help="the state file's name (kvprimer-<template>.bin)")


def cmd_serve(args) -> int:
    require_server_clients()
    from ..servers import llama_server_process as proc_mod

    if args.port < 0 or args.port > 65535:
        raise KvPrimerError(f"--port must be 0–65535, not {args.port}")
    extra = tuple(a for a in args.server_args if a != "--")
    with open_engine(args) as eng:  # the model's kernel choice, KV types and window
        settings = proc_mod.settings_for(eng, args.slot_dir, args.port, extra)
    server = proc_mod.ServerProcess(settings, args.log)
    print(f"starting {server.binary} with {' '.join(server.cmd[1:])}", file=sys.stderr)
    server.start()
    print(f"llama-server is ready at {server.url} (slot files in {Path(args.slot_dir).resolve()}); "
          "Ctrl+C stops it", flush=True)
    try:
        # SIGINT too: a shell starts background jobs with it ignored, and Python then
        # installs no handler of its own
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("llama-server stopped", file=sys.stderr)
    return 0


def cmd_deploy(args) -> int:
    require_server_clients()
    from .. import servers
    from ..servers import deploy as deploy_mod

    tpl = read_template(args.template)
    with servers.LlamaServer(args.server) as server, open_engine(args) as eng:
        res = deploy_mod.deploy(eng, tpl, server, args.slot, args.slot_dir,
                                progress_printer(), args.name)
    emit(args, asdict(res), lambda: (print(res.describe()),
                                     print(f"state file: {res.path}; the server runs {res.model}")))
    return ExitCode.OK


def cmd_bench_server(args) -> int:
    require_server_clients()
    from .. import servers
    from ..servers import server_bench as bench_mod

    tpl = read_template(args.template)
    rows = rows_of(args, tpl)
    with servers.connect(args.server, args.api, args.flavor, api_key=args.api_key) as server, \
            open_engine(args) as eng:
        n = args.n_predict if args.n_predict is not None else GenerationConfig().max_tokens
        res = bench_mod.bench_on_server(eng, tpl, rows, server, max_tokens=n,
                                        slot=args.slot, task=progress_printer())
    emit(args, res.as_dict(), lambda: _print_server_bench(res))
    s = res.summary()
    differ = s.get("compared") and s["tokens_equal"] < s["compared"]
    return ExitCode.RUNS_DIFFER if differ else ExitCode.OK


def _print_server_bench(res) -> None:
    print(f"server {res.url} ({res.api} API, {res.flavor}); it runs {res.model}")
    print(f"{'row':>4} {'prompt':>6} {'prefix':>6} {'cached':>6} {'eval':>5} {'cold ms':>9} "
          f"{'warm ms':>8} {'speedup':>7}  same tokens as local cold")
    for r in res.rows:
        same = "" if r.tokens_equal is None else yes_no(r.tokens_equal)
        if r.tokens_equal is False:
            same += f" (first differs at {r.first_diff})"
        cached = "?" if r.server_cached_tokens is None else f"{r.server_cached_tokens}"
        evald = "?" if r.server_evaluated_tokens is None else f"{r.server_evaluated_tokens}"
        print(f"{r.row:>4} {r.prompt_tokens:>6} {r.prefix_tokens:>6} {cached:>6} {evald:>5} "
              f"{r.cold_ms:>9.1f} {r.warm_ms:>8.1f} {r.speedup or 0:>6.1f}x  {same}")
        if r.miss_reason:
            print(f"     miss: {r.miss_reason}")
        if r.output_note:
            print(f"     output: {r.output_note}")
    s = res.summary()
    if s["rows"]:
        print(f"median warm {s['median_warm_ms']:.1f} ms, cold {s['median_cold_ms']:.1f} ms "
              f"(speedup {s['median_speedup']:.1f}x); {s['misses']} of {s['rows']} rows missed "
              f"the static prefix" + (f"; {s['tokens_equal']} of {s['compared']} rows gave the "
                                      "local cold run's tokens" if s["compared"] else ""))
