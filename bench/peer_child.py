"""llama-cpp-python's LlamaRAMCache on the recurring rows, as ``Llama.create_completion`` runs
them: the one loop the bench times, whichever llama-cpp-python build runs it.

In the bench's own process it runs on the venv's llama_cpp (llamacpp_paths.recurring_rows).
Run as a script, it runs on the llama_cpp of the Python that runs it: bench/native_peer.py gives
a natively built llama-cpp-python a venv of its own, because its libllama cannot share a process
with ours. That is why this file imports only llama_cpp, numpy and the standard library.

Protocol (script): one JSON request on stdin —
  {"model_path", "n_ctx", "n_batch", "n_threads", "flash_attn", "use_extra_bufts", "type_kv",
   "max_tokens", "prime": [ids] (may be empty), "rows": [[ids], ...]}
— and one JSON answer on stdout: {"ok": true, "rows": [...], "llama_cpp_python", "library",
"system_info"} or {"ok": false, "error": "one line"}. llama.cpp's own output goes to stderr.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator

import llama_cpp as L
from llama_cpp import Llama, LlamaRAMCache


def _load_cpu_level() -> None:
    """A llama.cpp built per CPU level (this project's venv) loads none by itself: register the
    best, with the project's own loader (app/cpu_backends.py, standard library only), read by
    its path so that no other part of the app is imported. A natively built llama-cpp-python
    links its one CPU backend, and this does nothing."""
    import importlib.util
    from pathlib import Path

    loader = sys.modules.get("kvprimer_cpu_backends")
    if loader is None:  # read once; a dataclass looks its module up in sys.modules
        spec = importlib.util.spec_from_file_location(
            "kvprimer_cpu_backends", Path(__file__).resolve().parents[1] / "app" / "cpu_backends.py")
        loader = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loader)
    loader.load_cpu_backend(Path(library_path()).resolve().parent)


def open_llama(model_path: str, *, n_ctx: int, n_batch: int, n_threads: int, flash_attn: bool,
               use_extra_bufts: bool, type_kv: int) -> Llama:
    """``Llama`` with the engine's threads, batch = ubatch, KV type, flash attention and CPU
    buffer types, so that every build runs the same kernels as ours."""
    _load_cpu_level()  # here, not at import: in the bench's own process the engine did it first
    with extra_buffer_types(use_extra_bufts):
        llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                    n_threads=n_threads, n_threads_batch=n_threads, flash_attn=bool(flash_attn),
                    type_k=type_kv, type_v=type_kv, verbose=False)
    if llm.model_params.use_extra_bufts != use_extra_bufts:  # a newer Llama builds them otherwise
        raise RuntimeError("llama_cpp.Llama ignored the extra buffer types setting")
    return llm


@contextlib.contextmanager
def extra_buffer_types(on: bool) -> Iterator[None]:
    """``Llama`` (llama-cpp-python 0.3.36) has no argument for llama_model_params'
    use_extra_bufts: it fills its params from ``llama_cpp.llama_cpp.llama_model_default_params()``
    and loads the model in its constructor. Construct it inside this block to have them set."""
    bindings = L.llama_cpp
    default = bindings.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = on
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = default


def recurring_rows(llm: Llama, rows: list[list[int]], max_tokens: int,
                   prime: list[int] | None = None) -> list[dict]:
    """Rows in order, as ``Llama.create_completion`` runs them with a ``LlamaRAMCache`` large
    enough for every row: look the prompt up (the longest cached prompt sharing a prefix),
    ``load_state`` it when it shares more than the context already does, generate (keeping the
    longest common prefix, evaluating the rest); after the completion, store the state under
    prompt + completion. ``prime`` (untimed) starts the cache with the static prefix, as each
    of our modes starts. Only the time to the first token is measured."""
    return list(recurring_rows_one_by_one(llm, rows, max_tokens, prime))


def recurring_rows_one_by_one(llm: Llama, rows: list[list[int]], max_tokens: int,
                              prime: list[int] | None = None):
    """The same, one row per next(), so that a caller can run its own rows between them and
    each pair of times meets the same load (bench/stateful_bench.py)."""
    counted = [0]
    inner = llm.eval  # generate() evaluates through self.eval: count what it evaluates

    def counting_eval(tokens):
        counted[0] += len(tokens)
        return inner(tokens)

    llm.eval = counting_eval
    try:
        llm.reset()
        cache = LlamaRAMCache(capacity_bytes=1 << 40)
        if prime:
            llm.eval(list(prime))
            cache[list(prime)] = llm.save_state()
        for tokens in rows:
            yield _row(llm, cache, tokens, max_tokens, counted)
    finally:
        llm.eval = inner


def _row(llm: Llama, cache: LlamaRAMCache, tokens: list[int], max_tokens: int,
         counted: list[int]) -> dict:
    t0 = time.perf_counter()
    try:
        item = cache[tokens]
        if (Llama.longest_token_prefix(item.input_ids.tolist(), tokens)
                > Llama.longest_token_prefix(llm._input_ids.tolist(), tokens)):
            llm.load_state(item)
    except KeyError:  # nothing cached shares a token with this prompt
        pass
    load_ms = (time.perf_counter() - t0) * 1000
    counted[0] = 0
    gen = llm.generate(tokens, temp=0.0, repeat_penalty=1.0)
    try:
        completion = [int(next(gen))]
        ttft_ms = (time.perf_counter() - t0) * 1000
        evaluated = counted[0]
        while (len(completion) < max_tokens
               and not L.llama_vocab_is_eog(llm._model.vocab, completion[-1])):
            completion.append(int(next(gen)))  # untimed: the verdict's tokens
    finally:
        gen.close()
    cache[tokens + completion] = llm.save_state()  # untimed, after the completion
    return {"ttft_ms": ttft_ms, "load_ms": load_ms, "evaluated_tokens": evaluated,
            "reused_tokens": len(tokens) - evaluated, "tokens": completion}


def library_path() -> str:
    lib = getattr(L.llama_cpp, "_lib", None)
    return str(getattr(lib, "_name", "") or "")


def serve(request: dict) -> dict:
    llm = open_llama(request["model_path"], n_ctx=request["n_ctx"], n_batch=request["n_batch"],
                     n_threads=request["n_threads"], flash_attn=request["flash_attn"],
                     use_extra_bufts=request["use_extra_bufts"], type_kv=request["type_kv"])
    try:
        rows = recurring_rows(llm, request["rows"], request["max_tokens"],
                              request.get("prime") or None)
    finally:
        llm.close()
    return {"ok": True, "rows": rows, "llama_cpp_python": L.__version__,
            "library": library_path(), "system_info": L.llama_print_system_info().decode()}


def main() -> int:
    # child_protocol.py's answer_request, written out: this file runs as a script, under
    # other Pythons and llama-cpp-python builds, and imports nothing of the bench
    request = json.load(sys.stdin)
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # anything llama.cpp prints goes to stderr; stdout carries the answer only
    try:
        answer = serve(request)
    except Exception as e:  # noqa: BLE001 - the parent turns it into one line for the user
        answer = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        json.dump(answer, out)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
