"""The scale section's llama-cpp-python peer, in a process of its own so that its peak RSS is
plain llama-cpp-python's: `python -m bench.scale_peer_child`, one JSON request on stdin, one
JSON answer on stdout (llama.cpp's output goes to stderr).

Request: {"model_path", "n_ctx", "n_batch", "n_threads", "flash_attn", "tokens": [ids],
"boundary", "unrelated": [ids], "repeats"}.

1. plain: ``Llama`` (the project's build, our engine's kernels: llamacpp_paths.LlamaPaths) at the
   same n_ctx evaluates the whole prompt from an empty context and samples the first token, as
   a user of plain llama-cpp-python does: its cold time to first token, and its peak RSS then.
2. its caches: the context cut back to the prefix (the same cells a prefix-only evaluation
   leaves), ``save_state`` into a ``LlamaRAMCache`` and a ``LlamaDiskCache``; then, ``repeats``
   times, after an unrelated prompt each: the RAM cache's and the disk cache's time to first
   token on the same prompt (llamacpp_paths: what ``create_completion`` does before its first
   token).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from .child_protocol import answer_request


def serve(req: dict) -> dict:
    import llama_cpp as L

    from .llamacpp_paths import LlamaPaths
    from .scale_ours import peak_rss
    from .workload import RowTokens

    rss_imports = peak_rss()  # the same app modules as ours are loaded (LlamaPaths uses them)
    t_start = time.perf_counter()
    row = RowTokens(1, list(req["tokens"]), int(req["boundary"]))
    with tempfile.TemporaryDirectory(prefix="kvprimer-scale-peer-") as tmp:
        paths = LlamaPaths(req["model_path"], n_ctx=req["n_ctx"], n_batch=req["n_batch"],
                           n_threads=req["n_threads"], cache_dir=Path(tmp) / "disk-cache",
                           flash_attn=req["flash_attn"])
        try:
            rss_load = peak_rss()
            llm = paths.llm
            llm.reset()
            cold = paths._first(row, time.perf_counter(), 0.0)
            rss_plain = peak_rss()
            paths._close_gen()
            # cut the context back to the prefix: the state a prefix-only evaluation leaves
            L.llama_memory_seq_rm(L.llama_get_memory(llm._ctx.ctx), -1, row.boundary, -1)
            llm.n_tokens = row.boundary
            paths.entry = llm.save_state()
            paths.key = tuple(row.tokens[:row.boundary])
            paths.ram[paths.key] = paths.entry
            paths._disk_put()
            sizes = {"ram_entry_bytes": paths.ram_entry_bytes(),
                     "disk_entry_bytes": paths.disk_entry_bytes()}
            ram, disk = [], []
            for _ in range(req["repeats"]):
                for name, fn, out in (("ram", paths.ram_warm, ram), ("disk", paths.disk_warm, disk)):
                    s = fn(row, req["unrelated"])
                    out.append({"ttft_ms": s.ms, "load_ms": s.load_ms,
                                "evaluated_tokens": s.evaluated, "tokens": [s.first_token]})
            rss_end = peak_rss()
        finally:
            paths.close()
    return {"ok": True, "llama_cpp_python": L.__version__,
            "cold": {"ttft_ms": cold.ms, "evaluated_tokens": cold.evaluated,
                     "tokens": [cold.first_token]},
            "llamacpp_ram": ram, "llamacpp_disk": disk, "sizes": sizes,
            "peak_rss": {"imports": rss_imports, "load": rss_load, "plain": rss_plain, "end": rss_end},
            "seconds": round(time.perf_counter() - t_start, 1)}


def main() -> int:
    return answer_request(serve)


if __name__ == "__main__":
    sys.exit(main())
