"""Deploying a primed prefix to llama-server: prime, write llama.cpp's sequence-state file into
the server's slot directory, restore it into a slot, and prove with one request that the
server reuses it.

What must agree between the file and the server is read from the server itself: before
writing anything we have the slot hold one token, ask the server to save it, and read that
file's header and layout (the seq-state version, how many KV streams, whether V is stored
transposed, which is how flash attention shows, and the K/V row types and sizes). V's layout
is a byte transform, so a state primed with the other kernel is rewritten for the server's
(servers usually run llama.cpp's default, flash attention on); any other mismatch is refused
in one line that says what to change. llama-server checks less and answers a mismatched
restore with "No available space in KV cache or invalid slot save file".
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from app.engine.errors import KvPrimerError, StateFileError
from app.engine.states.llama_state_file import SUFFIX, read_llama_state, save_llama_state
from app.engine.states.prefix_state import PrefixState
from app.engine.states.seq_payload import row_layout, stream_count, v_transposed
from app.engine.states.v_layout import for_flash_attn
from app.engine.runs.server_results import DeployResult
from app.engine.task_state import TaskState
from app.engine.prompts.template import Template

from .http_stream import ServerError
from .llama_server import LlamaServer
from .chat_server import ChatServer
from .model_match import match_model
from .render_check import compare


class DeployError(KvPrimerError):
    """A prefix cannot be deployed to this server as it runs."""


@dataclass(frozen=True)
class ServerLayout:
    """What the server's own slot file says about its KV cache."""
    seq_state_version: int
    streams: int | None
    v_transposed: bool | None
    rows: tuple  # per layer: (K type, K bytes, V type, V bytes)
    type_k: str
    type_v: str


def server_layout(server: LlamaServer, slot: int, slot_dir: Path, token: int) -> ServerLayout:
    """Have ``slot`` hold one token, save it, and read the file the server wrote."""
    server.complete([token], 1, slot=slot)
    name = f"kvprimer-probe-{secrets.token_hex(4)}{SUFFIX}"
    server.slot(slot, "save", name)
    path = slot_dir / name
    try:
        if not path.is_file():
            raise DeployError(f"the server saved its slot, but not in {slot_dir}: give the "
                              "directory the server was started with (its --slot-save-path)")
        with open(path, "rb") as f:
            st = read_llama_state(f, path.stat().st_size, name)
    except StateFileError as e:
        raise DeployError(f"cannot read the server's own slot file: {e}") from None
    finally:
        path.unlink(missing_ok=True)
    layout = row_layout(st.data) or [[]]
    return ServerLayout(st.seq_state_version, stream_count(st.data), v_transposed(st.data),
                        tuple(layout[0]), st.type_k, st.type_v)


def check_layout(state: PrefixState, server: ServerLayout) -> None:
    """Raise DeployError, in one line saying what to change, unless the server can restore
    ``state`` and use it."""
    if server.seq_state_version != state.seq_state_version:
        raise DeployError(
            f"the server reads sequence states of version {server.seq_state_version} and this KV "
            f"Primer writes version {state.seq_state_version}: run a llama-server built from the "
            "same llama.cpp (kvprimer serve starts one)")
    if server.streams not in (None, 1):
        raise DeployError(
            f"the server's KV cache has {server.streams} streams (one per slot) and a state "
            "restores into one: restart it with -np 1 or with --kv-unified")
    rows = tuple((row_layout(state.data) or [[]])[0])
    if server.rows and rows and rows != server.rows:
        raise DeployError(
            f"the server's KV rows ({server.type_k}/{server.type_v}, {len(server.rows)} layers) "
            f"differ from this state's ({state.type_k}/{state.type_v}, {len(rows)} layers): start "
            f"it with the same model and KV types (-ctk {state.type_k} -ctv {state.type_v})")


def for_server_kernel(state: PrefixState, server: ServerLayout) -> PrefixState:
    """``state`` with V laid out as the server's attention kernel stores it: servers run with
    llama.cpp's default (flash attention on, V untransposed) whatever was measured faster here."""
    if server.v_transposed is None:
        return state
    try:
        return for_flash_attn(state, not server.v_transposed)
    except StateFileError:
        raise DeployError(f"the server runs flash attention off, which a {state.type_v} V cache "
                          "cannot be stored for: restart the server with -fa on (llama.cpp's "
                          "default)") from None


def sample_values(template: Template) -> dict[str, str]:
    """Values for a chat request that checks a deployment: each placeholder's own name (only
    the static prefix before them matters)."""
    return {name: name for name in template.placeholders}


def check_chat_rendering(engine, template: Template, chat, client) -> None:
    """Raise DeployError naming the first differing character and token unless the server
    renders ``chat``'s messages as ``template`` does here."""
    values = sample_values(template)
    theirs = client.apply_template(chat.filled(values), chat.tools)
    if theirs is None:
        return
    diff = compare(None, template.fill(values).text, theirs,
                   lambda text: engine.model.tokenize(text, True, True),
                   lambda t: engine.model.piece(t).decode("utf-8", "replace"))
    if diff is not None:
        raise DeployError(diff.describe())


def deploy(engine, template: Template, server: LlamaServer, slot: int, slot_dir: str | Path,
           task: TaskState | None = None, filename: str = "", chat=None) -> DeployResult:
    """Prime ``template``'s static prefix, restore it into ``slot`` and check the server reuses
    it. ``chat``: the messages ``template`` renders (``filled(values)``, ``tools``); then the
    server's rendering is compared with ours first, and the checking request goes to its chat
    endpoint as an application's would (no slot named)."""
    task = task or TaskState()
    slot_dir = Path(slot_dir)
    if not slot_dir.is_dir():
        raise DeployError(f"the slot directory {slot_dir} does not exist; give the directory "
                          "the server was started with (its --slot-save-path)")
    props = server.props()
    if props.total_slots and not 0 <= slot < props.total_slots:
        raise DeployError(f"the server has slots 0–{props.total_slots - 1}; slot {slot} is not one")
    match = match_model(engine.info.path, engine.info.sha256, props.model_path)
    if match.same is False:
        raise DeployError(f"the server runs {match.how}: start it with this model "
                          f"(-m {engine.info.path}), or load the server's model here")
    task.report("deploy", 0, 4)
    client = ChatServer(server.url) if chat is not None else None
    try:
        return _deploy(engine, template, server, slot, slot_dir, task, filename, chat, client,
                       props, match)
    finally:
        if client is not None:
            client.close()


def _deploy(engine, template, server, slot, slot_dir, task, filename, chat, client, props,
            match) -> DeployResult:
    if chat is not None:
        check_chat_rendering(engine, template, chat, client)
    prefix = engine.tokenize(template.prefix_prompt())
    if not prefix:
        raise DeployError("the template has no static prefix (it starts with a placeholder); "
                          "nothing to deploy")
    if props.n_ctx and len(prefix) >= props.n_ctx:
        raise DeployError(f"the static prefix has {len(prefix):,} tokens and the server's slots "
                          f"hold {props.n_ctx:,}: start it with a larger context (-c)")
    layout = server_layout(server, slot, slot_dir, prefix[0])
    task.report("deploy", 1, 4)
    state = engine.prime(template, task)
    check_layout(state, layout)
    state = for_server_kernel(state, layout)
    name = filename or f"kvprimer-{template.sha256[:12]}{SUFFIX}"
    if Path(name).name != name:
        raise DeployError(f"'{name}' is not a bare file name; the server reads slot files only "
                          "from its own directory")
    path = slot_dir / name
    save_llama_state(state, path)
    task.report("deploy", 2, 4)
    try:
        restored = server.slot(slot, "restore", name)
    except ServerError as e:
        raise DeployError(f"the server refused the state ({e}); check its log for the cause") from None
    task.report("deploy", 3, 4)
    check = (server.complete(list(state.tokens), 1, slot=slot) if chat is None else
             client.complete(chat.filled(sample_values(template)), 1, tools=chat.tools))
    cached = check.cached_tokens or 0
    if cached < len(state.tokens) - 1:
        hint = ("sliding-window models reuse a restored state only with --swa-full"
                if engine.info.traits.n_swa else
                # llama-server must step back one token to answer, which a recurrent state
                # cannot do; it resumes only from context checkpoints of its own runs
                "this llama-server cannot resume a restored slot of a hybrid or recurrent "
                "model (it re-evaluates the prompt)" if engine.stateful
                else "check the server's log")
        raise DeployError(f"the server restored {restored.tokens:,} tokens but reused only "
                          f"{cached:,} of {len(state.tokens):,} on the next request: {hint}")
    task.report("deploy", 4, 4)
    return DeployResult(server.url, slot, str(path), len(state.tokens), state.nbytes,
                        restored.tokens, restored.ms, cached, check.evaluated_tokens or 0,
                        match.how)


__all__ = ["DeployError", "DeployResult", "ServerLayout", "check_chat_rendering", "check_layout",
           "deploy", "sample_values", "server_layout"]
