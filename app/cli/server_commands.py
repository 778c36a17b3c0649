"""`kvprimer serve`, `deploy`, `bench --server` and `info --server`: the same templates and
rows on llama-server and OpenAI-compatible servers. `serve` starts a server (app/servers); the
others make their flow's plan (app/servers/server_flows.py, the flows the window's Server tab
runs, with the same defaults and refusals) before the model loads, then run the flow's body."""
from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from ..engine import KvPrimerError
from ..servers import server_flows as flows
from ..engine.project.project_file import SUFFIX
from ..engine.prompts.chat_messages import ChatTemplate, is_chat_file
from ..optional_extras import require_server_clients
from .engine_options import (check_save, open_engine, progress_printer, project_chat,
                             read_project, read_template, rows_of, save_results, session_options)
from .exit_codes import ExitCode
from .output import emit, yes_no


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _target_options(p: argparse.ArgumentParser, server_help: str) -> None:
    g = p.add_argument_group("server target")
    g.add_argument("--server", metavar="URL", help=server_help)
    g.add_argument("--api", default="llama", choices=("llama", "openai", "chat"),
                   help="llama: llama-server's own API (token-id prompts, slots); openai: any "
                        "OpenAI-compatible /v1/completions (llama-server, vLLM, SGLang); chat: "
                        "their /v1/chat/completions, each row as the chat template's messages "
                        "(llama)")
    g.add_argument("--flavor", default="auto", choices=("auto", "llama", "vllm", "sglang"),
                   help="openai API: whose server it is, for how to run cold (auto: ask it)")
    g.add_argument("--api-key", default="", help="openai API: a bearer token, if the server wants one")


def server_target_options(p: argparse.ArgumentParser) -> None:
    """The options that name a server (bench --server adds them to bench's own)."""
    _target_options(p, "run the rows on this server instead of locally")
    p.add_argument("--slot", type=int, default=None, metavar="N",
                   help="llama-server: the slot to use (default: the slot of the project's last "
                        "deployment to this server, else the server chooses)")
    p.add_argument("--server-threads", type=int, default=0, metavar="N",
                   help="the server's generation threads (its -t); the local runs compared with "
                        "it generate on as many (default: the count `kvprimer serve` starts it "
                        "with: -t, else one per physical core)")


def check_server_options(p: argparse.ArgumentParser) -> None:
    """info --server: what the window's Check says of a server."""
    _target_options(p, "describe this server instead: health, model (the one loaded here?), "
                       "slots, context, build")


def _target(args) -> flows.ServerTarget:
    return flows.server_target(args.server, args.api, args.flavor, args.api_key)


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
    p.add_argument("--slot", type=int, default=flows.DEPLOY_SLOT, metavar="N",
                   help=f"the slot to restore into ({flows.DEPLOY_SLOT})")
    p.add_argument("--slot-dir", required=True, metavar="DIR",
                   help="the server's slot directory (its --slot-save-path)")
    p.add_argument("--name", default="", help="the state file's name (kvprimer-<template>.bin)")
    p.add_argument("--save", action="store_true",
                   help="store the deployment in the project file given as the template")


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


def _chat(path: str):
    """A chat template file's messages (None for a text template or a project): the chat API
    sends them, and deploy checks through it."""
    return ChatTemplate.load(path) if is_chat_file(path) else None


def _template_and_chat(args):
    """The template (a file, a chat template file or a project's) and, for a chat template,
    its messages: a project's are found as the window finds them when it reopens it."""
    project = read_project(args.template) if Path(args.template).suffix == SUFFIX else None
    if project is None:
        return None, read_template(args.template, args.model), _chat(args.template)
    return project, project.template, project_chat(project, args.model)


def cmd_deploy(args) -> int:
    _project, tpl, chat = _template_and_chat(args)
    plan = flows.deploy_plan(tpl, flows.server_target(args.server), args.slot_dir, args.slot,
                             args.name, chat)
    check_save(args)
    with open_engine(args) as eng:
        res = flows.deploy(eng, plan, progress_printer())
    emit(args, asdict(res), lambda: (print(res.describe()),
                                     print(f"state file: {res.path}; the server runs {res.model}")))
    save_results(args, lambda session: session.set_deployed(res))
    return ExitCode.OK


def cmd_check_server(args) -> int:
    target = _target(args)
    with open_engine(args) as eng:
        facts = flows.check_target(eng, target)
    emit(args, asdict(facts), lambda: print(facts.describe()))
    return ExitCode.OK


def cmd_bench_server(args) -> int:
    target = _target(args)
    project, tpl, chat = _template_and_chat(args)
    plan = flows.server_bench_plan(tpl, rows_of(args, tpl), target,
                                   session_options(args, project and project.options),
                                   slot=args.slot, deployed=project and project.deployed,
                                   chat=chat, gen_threads=args.server_threads)
    check_save(args)
    with open_engine(args) as eng:
        res = flows.bench_on_server(eng, plan, progress_printer())
    emit(args, res.as_dict(), lambda: _print_server_bench(res))
    save_results(args, lambda session: session.set_server_bench(res))
    s = res.summary()
    differ = s.get("compared") and s["tokens_equal"] < s["compared"]
    return ExitCode.RUNS_DIFFER if differ else ExitCode.OK


def _print_server_bench(res) -> None:
    print(f"server {res.url} ({res.api} API, {res.flavor}); it runs {res.model}")
    if res.render is not None:
        print(f"rendering: {res.render['describe']}")
    # the chat API streams text: its outputs are compared as text
    what = "output" if res.api == "chat" else "tokens"
    print(f"{'row':>4} {'prompt':>6} {'prefix':>6} {'cached':>6} {'eval':>5} {'cold ms':>9} "
          f"{'warm ms':>8} {'speedup':>7}  same {what} as local {res.reference}")
    for r in res.rows:
        same = "" if r.tokens_equal is None else yes_no(r.tokens_equal)
        if r.tokens_equal is False:
            at = f"character {r.first_diff}" if res.api == "chat" else r.first_diff
            same += f" (first differs at {at})"
        cached = "?" if r.server_cached_tokens is None else f"{r.server_cached_tokens}"
        evald = "?" if r.server_evaluated_tokens is None else f"{r.server_evaluated_tokens}"
        print(f"{r.row:>4} {r.prompt_tokens:>6} {r.prefix_tokens:>6} {cached:>6} {evald:>5} "
              f"{r.cold_ms:>9.1f} {r.warm_ms:>8.1f} {r.speedup or 0:>6.1f}x  {same}")
        if r.miss_reason:
            print(f"     miss: {r.miss_reason}")
        if r.output_note:
            print(f"     output: {r.output_note}")
    print(res.describe())
