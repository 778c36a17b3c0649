"""The server flows, written once: check a server target, deploy the template's static prefix
into a llama-server slot, and run the rows on a server. The window's Server tab
(app/ui/server_view.py) and the CLI (`kvprimer info --server`, `deploy`, `bench --server`) call
these same functions, so both have the same defaults and refuse the same input in the same words.

Like session_flows.py, a flow has two halves. Its plan is made on the caller's thread, from a
Session or from a template, rows and options (the CLI's files): it refuses what cannot run
(no static prefix, no slot directory, no row, a row not filled in) with a one-line
KvPrimerError before any model or server work, and freezes the defaults decided here:
- new tokens per row: the options' ``max_tokens`` (the local runs' count);
- the rows: all of them, in order, each filled in (``session_flows.check_filled``);
- the state deployed: the template's static prefix, primed (or found in the radix cache);
- the slot: ``DEPLOY_SLOT`` to deploy into; rows go to the slot of the last deployment to
  the same server, else wherever the server puts them.
Its body ``(engine, plan, task)`` runs where engine work runs (the window's worker, the CLI's
main thread) and returns typed results (runs/server_results.py) that the caller keeps in the
session, saved in the project. They live beside the transport, above the engine (which imports
nothing of app.servers); the HTTP clients are an optional extra, imported only once
``server_target`` has checked that they are installed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..engine.errors import KvPrimerError, RowsError
from ..engine.prompts.chat_messages import ChatTemplate
from ..engine.prompts.rows import Row
from ..engine.prompts.template import Template
from ..engine.runs.server_results import DeployResult, ServerBench
from ..engine.session import Options, Session
from ..engine.session_flows import check_filled, check_options, session_template
from ..engine.task_state import TaskState

DEPLOY_SLOT = 0  # llama-server's first slot: the only one of a server `kvprimer serve` starts


@dataclass(frozen=True)
class ServerTarget:
    """A server to talk to: its URL, which API (llama-server's own, OpenAI-compatible
    completions, or OpenAI-compatible chat: messages rendered by the server), whose server an
    OpenAI one is (auto: ask it) and a bearer token if it wants one."""
    url: str
    api: str = "llama"
    flavor: str = "auto"
    api_key: str = ""

    def connect(self):
        from ..servers import connect
        return connect(self.url, self.api, self.flavor, api_key=self.api_key)


def server_target(url: str, api: str = "llama", flavor: str = "auto",
                  api_key: str = "") -> ServerTarget:
    """A target, checked: the server clients are installed and the URL reads as one
    ('localhost:8080' is http://localhost:8080)."""
    from ..optional_extras import require_server_clients
    require_server_clients()
    from .http_stream import normalise_url
    return ServerTarget(normalise_url(url), api, flavor, api_key)


# ---- plans (the caller's thread) ------------------------------------------------------------


@dataclass(frozen=True)
class DeployPlan:
    template: Template
    target: ServerTarget
    slot: int
    slot_dir: str  # the server's --slot-save-path, as this machine sees it
    filename: str = ""  # the state file's name ("": one made from the template's hash)
    chat: ChatTemplate | None = None  # the messages ``template`` renders, for a chat template


@dataclass(frozen=True)
class ServerBenchPlan:
    template: Template
    rows: tuple[Row, ...]
    target: ServerTarget
    max_tokens: int
    slot: int | None  # None: the deployment's slot on that server, else the server chooses
    deployed: DeployResult | None  # the last deployment, if any (used when it was to this server)
    chat: ChatTemplate | None = None  # the chat API: the messages ``template`` renders
    gen_threads: int = 0  # the server's generation threads (0: as `kvprimer serve` starts it)


def deploy_plan(template: Template, target: ServerTarget, slot_dir: str,
                slot: int = DEPLOY_SLOT, filename: str = "",
                chat: ChatTemplate | None = None) -> DeployPlan:
    """A deployment of ``template``'s static prefix into ``slot``, checked. ``chat``: the
    messages of a chat template (``template`` is their rendering): the deployment is then
    checked through the server's chat endpoint. A target on the chat API deploys a chat
    template so: the slot is restored through llama-server's own API either way."""
    if target.api == "chat" and chat is not None:
        target = replace(target, api="llama")
    if target.api != "llama":
        raise KvPrimerError("deploying restores a llama-server slot, which only llama-server's "
                            "own API can do; choose the llama API")
    if not template.static_prefix:
        raise KvPrimerError("the template has no static prefix (it starts with a placeholder); "
                            "nothing to deploy")
    if not slot_dir.strip():
        raise KvPrimerError("give the server's slot directory (where it saves and restores slot "
                            "files) to deploy into")
    if slot < 0:
        raise KvPrimerError(f"a slot is numbered from 0, not {slot}")
    return DeployPlan(template, target, slot, slot_dir.strip(), filename, chat)


def session_deploy_plan(session: Session, target: ServerTarget, slot_dir: str,
                        slot: int = DEPLOY_SLOT) -> DeployPlan:
    """The session's static prefix; checked through the chat endpoint when the session's
    template is the rendering of its messages (as `deploy` does with a .json or .yaml)."""
    return deploy_plan(session_template(session), target, slot_dir, slot,
                       chat=session.chat_template())


def server_bench_plan(template: Template, rows, target: ServerTarget, options: Options, *,
                      slot: int | None = None, deployed: DeployResult | None = None,
                      chat: ChatTemplate | None = None, gen_threads: int = 0) -> ServerBenchPlan:
    """The rows on a server, checked: at least one, every one filled in, a valid token count;
    the chat API needs ``chat``, the messages of a chat template that ``template`` renders."""
    if target.api == "chat" and chat is None:
        raise KvPrimerError("the chat API sends each row as chat messages: give a chat template "
                            "(.json or .yaml), or choose the llama or openai API")
    rows = tuple(rows)
    if not rows:
        raise RowsError("there are no rows to run on the server; import or add rows first")
    check_filled(template, rows)
    check_options(options)
    if slot is not None and target.api != "llama":
        raise KvPrimerError("only llama-server's own API chooses a slot; leave the slot out "
                            "with the OpenAI API")
    if gen_threads < 0:
        raise KvPrimerError(f"a server runs on 1 thread or more, not {gen_threads}")
    return ServerBenchPlan(template, rows, target, options.max_tokens, slot, deployed, chat,
                           gen_threads)


def session_server_bench_plan(session: Session, target: ServerTarget,
                              slot: int | None = None) -> ServerBenchPlan:
    """All the session's rows with its options, after its last deployment; on the chat API,
    each as the session's messages (a text template is refused, as the CLI refuses it)."""
    return server_bench_plan(session_template(session), session.all_rows(), target,
                             session.options, slot=slot, deployed=session.deployed,
                             chat=session.chat_template())


def started(plan: ServerBenchPlan) -> ServerBench:
    """The benchmark as it starts, without rows: the session shows rows as they finish."""
    return ServerBench(plan.target.url, plan.target.api, "", "", None, [])


# ---- bodies (where engine work runs) --------------------------------------------------------


def check_target(engine, target: ServerTarget, task: TaskState | None = None):
    """The target's health, kind, model (and whether it is the one ``engine`` runs), slots,
    context and build: a ``TargetFacts``, whose ``describe()`` is one line."""
    from .server_target import target_facts
    with target.connect() as server:
        return target_facts(server, engine)


def deploy(engine, plan: DeployPlan, task: TaskState | None = None) -> DeployResult:
    """Prime the static prefix, restore it into the slot, check the server reuses it."""
    from .deploy import deploy as deploy_prefix
    with plan.target.connect() as server:
        return deploy_prefix(engine, plan.template, server, plan.slot, plan.slot_dir, task,
                             plan.filename, plan.chat)


def bench_on_server(engine, plan: ServerBenchPlan, task: TaskState | None = None) -> ServerBench:
    """Run the plan's rows on the server, warm then cold, each compared with a local cold run;
    each ServerRow goes out as a partial result as it finishes."""
    from .server_bench import bench_on_server as run_rows
    with plan.target.connect() as server:
        d = plan.deployed
        here = d if d is not None and d.url == server.url else None
        slot = plan.slot
        if slot is None and here is not None and server.api == "llama":
            slot = here.slot
        return run_rows(engine, plan.template, list(plan.rows), server,
                        max_tokens=plan.max_tokens, slot=slot,
                        deployed=here is not None and slot in (None, here.slot), task=task,
                        chat=plan.chat, gen_threads=plan.gen_threads)
