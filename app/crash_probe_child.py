"""The child process of the engine's crash check (app/engine/crash_probe.py): load a model,
decode a batch of 4 tokens and then 1, report which extra buffer types got weights.

    python -m app.crash_probe_child MODEL.gguf 1|0    (1: extra buffer types on, llama.cpp's default)

It dies by a signal where llama.cpp crashes: that is the point. It lives outside app.engine
because importing that package costs 0.3 s of the child's 0.8 s, and it needs only llama_cpp.
The last line on stdout is {"ok": true, "buffers": [...]}; exit code 3 means llama.cpp refused
the model or the decode (the real load will say why), not a crash.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import time
import sys

# Tests only: "extra" makes the child kill itself with SIGSEGV where llama.cpp's AMX kernels
# crash (after the load, before the first batch) when extra buffer types are on, "always"
# whatever the setting; a suffix such as ":SIGILL" picks another signal.
CRASH_TEST_ENV = "KVPRIMER_PROBE_CRASH"
N_BATCH = 4  # a batch of 2 or more tokens takes the AMX matrix path; 1 token the vector path
# "load_tensors:   CPU_REPACK model buffer size = 1.50 MiB": the buffer types weights went to
_BUFFER_MARK = " model buffer size"
_PLAIN_BUFFERS = {"CPU", "CPU_Mapped"}


def main(argv: list[str]) -> int:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash here is expected: no core file
    except (ImportError, ValueError, OSError):
        pass
    path, extra = argv[0], argv[1] == "1"
    import llama_cpp as L

    buffers: set[str] = set()

    @L.llama_log_callback
    def on_log(_level, text, _user_data):  # pragma: no cover - called from C
        s = text.decode("utf-8", "replace")
        if _BUFFER_MARK in s:
            name = s.split(_BUFFER_MARK)[0].split()[-1]
            if name not in _PLAIN_BUFFERS:
                buffers.add(name)

    L.llama_log_set(on_log, ctypes.c_void_p(0))
    from pathlib import Path

    from app.cpu_backends import load_cpu_backend
    from llama_cpp import llama_cpp as bindings

    load_cpu_backend(Path(bindings._lib._name).resolve().parent)  # the level the engine runs
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0  # the CPU kernels are what is checked
    mp.use_extra_bufts = extra
    model = L.llama_model_load_from_file(path.encode("utf-8"), mp)
    if not model:
        print("llama.cpp could not load the model", file=sys.stderr)
        return 3
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 256, 16, 16, 1
    # one thread: the kernels are the same, and spinning threads on a busy machine made a
    # 4-token decode of SmolLM2 take 4 s instead of 0.2 s
    cp.n_threads = cp.n_threads_batch = 1
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 3
    batch = L.llama_batch_init(16, 0, 1)
    _test_crash(extra)
    tokens = [(7919 * k) % n_vocab for k in range(1, N_BATCH + 1)]
    for entries in (list(enumerate(tokens)), [(N_BATCH, tokens[0])]):  # a batch, then one token
        for i, (pos, tok) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(entries) - 1
        batch.n_tokens = len(entries)
        rc = L.llama_decode(ctx, batch)
        if rc != 0:  # the real load will say why, in the engine's words
            print("llama.cpp refused the test batch" if rc in (-1, 1) else
                  "llama.cpp could not evaluate the test batch", file=sys.stderr)
            return 3
    print(json.dumps({"ok": True, "buffers": sorted(buffers)}), flush=True)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


def _test_crash(extra: bool) -> None:
    """For tests of the parent's handling: die by a real signal where the AMX crash would."""
    when, _, name = os.environ.get(CRASH_TEST_ENV, "").partition(":")
    if when == "hang":  # a check that never finishes, whatever the machine's speed
        time.sleep(3600)
    if when == "always" or (when == "extra" and extra):
        os.kill(os.getpid(), getattr(signal, name or "SIGSEGV"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
