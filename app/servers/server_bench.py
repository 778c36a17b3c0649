"""Benchmarking a server's prompt cache with a template's rows, as a real workload runs them.

Rows go in file order. For each row the warm request comes first, with the server's cache as
the rows before left it (what a deployment sees), then a cold one with the cache bypassed. Both
leave the same prompt cached, so the next row's warm request is unaffected by the cold one.
Each row reports what the server says it reused and evaluated, time to first token of both,
and, when the server runs the model KV Primer has loaded, whether its greedy output equals
KV Primer's own cold run. A row whose reuse stops short of the template's static prefix says
where it stopped and why.
"""
from __future__ import annotations

from ..engine.errors import KvPrimerError
from ..engine.llama.thread_fit import shared_fit
from ..engine.prompts.prompt_tokens import common_prefix
from ..engine.prompts.rows import Row
from ..engine.prompts.template import Template
from ..engine.runs.generation import GenerationConfig
from ..engine.runs.prompt_runs import run_prompt
from ..engine.runs.server_results import ServerBench, ServerRow
from ..engine.task_state import TaskState
from .http_stream import Completion
from .llama_server_process import server_threads
from .model_match import match_model
from .render_check import check_rendering


def expected_reuse(prefix_tokens: int, block: int) -> int:
    """The least a server that reuses the static prefix reports: one token is always evaluated
    again (llama-server), and vLLM counts whole blocks."""
    return ((prefix_tokens - 1) // block) * block


def miss_reason(cached: int | None, prefix: int, block: int, tokens: list[int],
                before: list[int] | None, hint: str) -> str:
    """Why a server reused less than the static prefix; '' when it did not."""
    if cached is None:
        return f"the server does not report reused tokens: {hint}"
    want = expected_reuse(prefix, block)
    if cached >= want:
        return ""
    where = f"reuse stopped at token {cached:,} of the {prefix:,}-token static prefix"
    if before is None:
        return (f"{where}: the server held nothing of this template yet (the first request); "
                "deploy the prefix first to have it ready")
    shared = common_prefix(before, tokens)
    if shared < prefix:
        return (f"{where}: this prompt's tokens leave the previous one's at token {shared:,}, "
                "inside the static prefix (the text before the first placeholder joins this "
                "row's value into other tokens)")
    return (f"{where} though the server had just been sent {shared:,} matching tokens: another "
            "slot took the request, the cache was evicted or the server restarted (sliding-window "
            "models need --swa-full)")


def bench_on_server(engine, template: Template, rows: list[Row], server, *,
                    max_tokens: int = 16, compare: bool = True, slot: int | None = None,
                    deployed: bool = False, task: TaskState | None = None,
                    chat=None, gen_threads: int = 0) -> ServerBench:
    """Run ``rows`` on ``server`` (a LlamaServer, OpenAIServer or ChatServer). ``engine``
    tokenizes, finds the static prefix and, when ``compare`` and the server runs its model,
    runs each row locally to compare outputs: cold, or for the chat API warm from the primed
    prefix, as the deployment's reuse. ``deployed``: the prefix was restored into the slot
    before. ``chat``: the chat API's messages (``filled(values)`` gives a row's, ``tools``),
    whose rendering ``template`` is; each row goes as its messages, after our rendering of
    every row is compared with the server's. ``gen_threads``: the server's generation
    threads (0: those `kvprimer serve` starts it with for this engine); the local runs
    generate on the same count, whatever the machine's load."""
    gen_threads = gen_threads or server_threads(engine.config)[1]
    with shared_fit().pinned(gen_threads):
        return _bench(engine, template, rows, server, max_tokens, compare, slot, deployed,
                      task or TaskState(), chat, gen_threads)


def _bench(engine, template, rows, server, max_tokens, compare, slot, deployed, task, chat,
           gen_threads) -> ServerBench:
    is_chat = server.api == "chat"
    if is_chat and chat is None:
        raise KvPrimerError("the chat API sends messages: give a chat template (.json or .yaml)")
    render = (check_rendering(lambda v: template.fill(v).text,
                              lambda v: server.apply_template(chat.filled(v), chat.tools), rows,
                              lambda text: engine.model.tokenize(text, True, True),
                              lambda t: engine.model.piece(t).decode("utf-8", "replace"))
              if is_chat else None)
    match = match_model(engine.info.path, engine.info.sha256, server.served_model())
    as_ids = server.api == "llama" and match.same is True  # else the server tokenizes text
    block = server.block_size
    hint = server.missing_report_hint()
    gen = GenerationConfig(max_tokens=max_tokens)
    out: list[ServerRow] = []
    # where reuse stops is measured in the server's own tokens: the ids we send, else its
    # /tokenize of the text we send, else (a server without one) our tokenizer's guess
    server_tokens = (lambda text: None) if as_ids else server.tokenize
    prefix_text = template.prefix_prompt().text
    prefix_ids = (server_tokens(prefix_text) or engine.tokenize(template.prefix_prompt())
                  if prefix_text else [])
    prefix = len(prefix_ids)
    before: list[int] | None = list(prefix_ids) if deployed else None
    task.begin_job("server", len(rows))  # "row 3 of 10", time left
    for i, row in enumerate(rows):
        task.check()
        task.begin_item(i + 1, len(rows), number=row.number)
        filled = template.fill(row.values)
        local = engine.tokenize(filled)
        prompt = local if as_ids else filled.text
        tokens = (None if as_ids else server_tokens(filled.text)) or local
        if is_chat:  # as an application sends them; the server renders them
            messages = chat.filled(row.values)
            warm = server.complete(messages, max_tokens, tools=chat.tools)
            cold = server.complete(messages, max_tokens, cache_prompt=False, tools=chat.tools)
        else:
            warm = server.complete(prompt, max_tokens, cache_prompt=True, slot=slot)
            cold = server.complete(prompt, max_tokens, cache_prompt=False, slot=slot)
        r = ServerRow(row=row.number, prompt_tokens=len(tokens),
                      prefix_tokens=prefix, cold_ms=cold.ttft_ms, warm_ms=warm.ttft_ms,
                      server_cached_tokens=warm.cached_tokens,
                      server_evaluated_tokens=warm.evaluated_tokens,
                      cold_cached_tokens=cold.cached_tokens, text=warm.text,
                      tokens=warm.tokens,
                      miss_reason=miss_reason(warm.cached_tokens, prefix, block, tokens, before, hint))
        r.server_cold_equal = _same_output(warm, cold)
        if compare and match.same:
            if is_chat:
                _compare_warm(engine, template, row.values, gen, warm, r, task)
            else:
                _compare_local(engine, local, gen, max_tokens, warm, r, task)
            r.output_note = output_note(r)
        before = tokens
        out.append(r)
        task.end_item()
        task.partial(r)
    return ServerBench(server.url, server.api, server.flavor, match.how,
                       match.same, out, "warm" if is_chat else "cold",
                       render.as_dict() if render else None,
                       gen_threads if compare and match.same else None)


def _whole_chars(text: str) -> str:
    """Text without a last, partial character (a server holds it back from its stream)."""
    return text.rstrip("\ufffd")


def _same_output(a: Completion, b: Completion) -> bool:
    if a.tokens and b.tokens:
        return a.tokens == b.tokens
    return _whole_chars(a.text) == _whole_chars(b.text)


def output_note(r: ServerRow) -> str:
    """What a difference from the local cold run is due to: the server's cache, or how the
    server computes (its own cold run differs the same way)."""
    if r.tokens_equal is not False:
        return ""
    if r.server_cold_equal:
        return ("the server's own cold run gives the same output: it computes otherwise than "
                "this machine's engine (batch sizes, threads, build), not its cache")
    return "the server's warm output differs from its own cold run: its cache changed the result"


def _compare_warm(engine, template, values, gen, warm: Completion, r: ServerRow, task) -> None:
    """The row run here warm from the primed static prefix, as the server runs it from the
    deployed one; the chat API streams text only, so texts are compared."""
    local = run_prompt(engine, template, values, reuse="prefix", cold=False, oneshot=False,
                       gen=gen, keep=False, task=task).warm
    r.tokens_equal = same_text(local.text, warm.text)
    r.first_diff = None if r.tokens_equal else common_prefix(local.text, warm.text)


def same_text(local: str, served: str) -> bool:
    """Whether a server streamed the text generated here. A server holds back the bytes of an
    unfinished UTF-8 sequence until more come, so the bytes from an invalid one near the end
    (decoded here as U+FFFD) are never sent."""
    return local == served or (local.startswith(served)
                               and local[len(served):].startswith("\ufffd"))


def _compare_local(engine, tokens, gen, max_tokens, warm: Completion, r: ServerRow, task) -> None:
    # a plain cold run: batches of n_batch from cell 0 ([]: no batch marks; None would be the
    # one-shot noise run, whose cells sit one further on)
    local = engine.cold.run(tokens, [], gen, max_tokens, task, "cold", 0)
    r.local_cold_ms = local.ttft_ms
    if warm.tokens:
        a, b = local.tokens, warm.tokens
    else:  # the OpenAI API streams text only
        a, b = [_whole_chars(local.text)], [_whole_chars(warm.text)]
    n = common_prefix(a, b)
    r.tokens_equal = n == len(a) == len(b)
    r.first_diff = None if r.tokens_equal else n
