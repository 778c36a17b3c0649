"""The stateful-model section of `make bench`: hybrid and recurrent models cached exactly.

No real small hybrid or recurrent GGUF can be installed here, so the section writes random-weight
models of the real architectures (lfm2 and granitehybrid: hybrid; mamba2: recurrent) with
tests/tiny_model.py's writers, big enough that timings mean something (6 layers, 256 wide, f16
attention and feed-forward weights), once, into the user's cache folder. Their text is noise;
their cost per token and their state handling are the architectures' own.

For each model, on the recurring RAG workload:
1. ``bench_rows`` (the engine's own benchmark, as `kvprimer bench --reuse prefix,chain`), every
   row warm against its cold run with every row's verdict. The tiny models have a byte
   vocabulary, so the RAG template is cut to its first lines (a static prefix of several hundred
   tokens) and keeps its context slots; the rows are rag-recurring.csv's, which share passages.
2. The peer: llama-cpp-python's ``Llama`` with a ``LlamaRAMCache`` on the same model, the same
   rows in the same order (llamacpp_paths.recurring_rows_one_by_one, as ``create_completion``
   runs them), one of its rows right after each of ours, all modes (InterleavedPeer):
   on a shared machine the load changes within minutes, and a peer run after ours would meet
   another one. ``Llama.generate`` cannot cut a recurrent state back to the shared prefix, so on
   these models it re-evaluates the whole prompt whenever its context or cache entry holds more
   than that; the tokens it reused are counted, not assumed.

Figures go under "stateful" in results.json; the ratios (medians of per-row ratios) also join
the top-level ones: stateful_<arch>_warm_vs_cold (prefix mode), stateful_<arch>_chain_vs_cold,
stateful_<arch>_chain_vs_llamacpp_ram, stateful_<arch>_prefix_vs_llamacpp_ram, and the same two
with _evaluated: the tokens each side evaluated, which no load changes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.engine import (BenchResult, Engine, EngineConfig, GenerationConfig, KvPrimerError,
                        TaskState, Template, bench_rows, read_rows)
from app.resources_path import examples_dir

from .llamacpp_paths import LlamaPaths, recurring_rows_one_by_one
from .machine import CpuShare, loadavg, machine_info
from .ratios import _ok
from .stats import pairwise_ratio

MODES = ("prefix", "chain")
# one letter a layer (tests/tiny_stateful_layers.py): A attention, C short convolution, M Mamba 2
# mixer. LFM2 and Granite 4.0-H mix few attention layers among many recurrent ones.
BENCH_LAYOUTS = {"lfm2": "CCACCA", "granitehybrid": "MMAMMA", "mamba2": "MMMMMM"}
NOTE = ("random-weight models of the real architectures (lfm2, granitehybrid: hybrid; mamba2: "
        "recurrent), written by tests/tiny_model.py's writers: no real small hybrid GGUF is "
        "installable here. Timings and exactness are the architectures'; the text is noise.")


@dataclass(frozen=True)
class StatefulConfig:
    archs: tuple[str, ...] = tuple(BENCH_LAYOUTS)
    layouts: dict | None = field(default_factory=lambda: dict(BENCH_LAYOUTS))  # None: the tests'
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 768
    weight_type: str = "f16"
    rows: int = 6  # rows 2-7 of rag-recurring.csv: row 7 repeats row 2's first two passages
    repeat: int = 1
    prefix_chars: int = 1000  # of rag.tmpl's system text kept before "# Context" (1 byte = 1 token)
    n_ctx: int = 8192
    n_batch: int = 256
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_tokens: int = 8
    model_dir: str | None = None  # None: <user cache>/kvprimer/bench-models
    rows_path: str | None = None  # None: resources/examples/rag-recurring.csv
    llamacpp: bool = True


def model_file(cfg: StatefulConfig, arch: str) -> Path:
    """The random-weight model of ``arch``, written once per set of parameters (the file name
    carries their hash, so a changed parameter writes a new file instead of reusing a stale one)."""
    from tests.tiny_model import write_arch_model

    layout = (cfg.layouts or {}).get(arch)
    params = dict(n_embd=cfg.n_embd, n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, n_ff=cfg.n_ff,
                  n_ctx=cfg.n_ctx, weight_type=cfg.weight_type, layout=layout)
    key = hashlib.sha256(json.dumps([arch, params], sort_keys=True).encode()).hexdigest()[:10]
    folder = Path(cfg.model_dir) if cfg.model_dir else _user_cache() / "bench-models"
    path = folder / f"{arch}-{key}.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_arch_model(tmp, arch, **params)
        tmp.replace(path)  # a killed run leaves a temp file, never half a model under the name
    return path


def _user_cache() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("kvprimer", appauthor=False)


def short_rag_template(full: str, prefix_chars: int) -> str:
    """rag.tmpl with its system text cut to whole lines within ``prefix_chars`` characters; the
    context slots, the question and the chat markup after "# Context" are kept as they are."""
    head, tail = full.split("# Context\n", 1)
    kept = head[:prefix_chars].rsplit("\n", 1)[0].rstrip()
    return f"{kept}\n\n# Context\n{tail}"


def run_stateful(cfg: StatefulConfig, log=print) -> dict:
    t_start = time.perf_counter()
    share = CpuShare(cfg.n_threads)  # the timings are only as good as the machine's quiet
    ex = examples_dir()
    tpl = Template.parse(short_rag_template((ex / "rag.tmpl").read_text(encoding="utf-8"),
                                            cfg.prefix_chars))
    rows_path = Path(cfg.rows_path) if cfg.rows_path else ex / "rag-recurring.csv"
    rows = read_rows(rows_path, tpl.placeholders)[:cfg.rows]
    out: dict = {"note": NOTE, "settings": {**asdict(cfg), "rows_file": rows_path.name,
                                            "template": "rag.tmpl, system text cut",
                                            "modes": list(MODES)},
                 "machine": machine_info(), "archs": {}, "ratios": {}}
    for arch in cfg.archs:
        path = model_file(cfg, arch)
        log(f"stateful: {arch} ({path.name}, {path.stat().st_size / 1e6:.1f} MB), "
            f"{len(rows)} rows, modes {','.join(MODES)}")
        try:
            a = out["archs"][arch] = _one_model(cfg, arch, path, tpl, rows, log)
        except KvPrimerError as e:  # one model's failure must not lose the others' figures
            out["archs"][arch] = {"error": str(e)}
            log(f"stateful: {arch} failed: {e}")
            continue
        out["ratios"].update({f"stateful_{arch}_{k}": v for k, v in a["ratios"].items()})
    out["duration_s"] = round(time.perf_counter() - t_start, 1)
    out["machine"].update(loadavg_end=loadavg(), cpu_share=round(share.value(), 3))
    return out


def add_section(results: dict, *, quick: bool = False, n_threads: int | None = None,
                n_batch: int = 256) -> None:
    """Run the section into ``results`` (under "stateful", its ratios beside the others) and
    print it; a failure is recorded there, so it cannot lose the figures of other sections."""
    from .suite import _Log

    cfg = StatefulConfig(n_threads=n_threads or os.cpu_count() or 1, n_batch=n_batch,
                         **({"rows": 3, "archs": ("lfm2",)} if quick else {}))
    try:
        st = results["stateful"] = run_stateful(cfg, log=_Log())
    except Exception as e:
        results["stateful"] = {"error": f"{type(e).__name__}: {e}"}
        print(f"bench: the stateful section failed: {e}", file=sys.stderr)
        return
    results.setdefault("ratios", {}).update(st["ratios"])
    print("\n" + format_stateful(st), flush=True)


def _one_model(cfg, arch, path, tpl, rows, log) -> dict:
    with Engine(EngineConfig(model_path=str(path), n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                             n_threads=cfg.n_threads)) as engine, \
            tempfile.TemporaryDirectory(prefix="kvprimer-bench-") as tmp:
        peer = InterleavedPeer(engine, tpl, rows, cfg, Path(tmp)) if cfg.llamacpp else None

        def progress(p):  # a line per row run: the section takes minutes per model
            if p.stage == "bench" and p.done:
                log(f"stateful: {arch}: {p.done}/{p.total} row runs ({p.elapsed_s:.0f} s)")

        try:
            res = bench_rows(engine, tpl, rows, modes=MODES, repeat=cfg.repeat,
                             gen=GenerationConfig(max_tokens=cfg.max_tokens),
                             task=TaskState(on_progress=progress,
                                            on_partial=peer.after if peer else None))
        finally:
            if peer:
                peer.close()
        a = {"model": res.model, "layout": (cfg.layouts or {}).get(arch),
             "weight_type": cfg.weight_type, "rows": [asdict(r) for r in res.rows],
             "summary": res.summary()}
        if peer:
            a["llamacpp_ram"] = peer.rows
    a["bit_identical"] = bit_identical_counts(a["rows"])
    a["chain_reused_past_prefix"] = sum(1 for r in _ok(a["rows"], "chain").values()
                                        if r["reused_tokens"] > r["prefix_tokens"])
    a["ratios"] = arch_ratios(a["rows"], a.get("llamacpp_ram", {}))
    return a


class InterleavedPeer:
    """llama-cpp-python with a LlamaRAMCache on the same rows in the same order, one of its rows
    right after each of ours (bench_rows hands over its result after every row, its modes run
    side by side), so that a row's times meet the same load on a shared machine. The peer runs
    each row once, from one cache, and its figure stands beside every mode of ours on that row."""

    def __init__(self, engine, tpl, rows, cfg: StatefulConfig, tmp: Path):
        self.tokens = {r.number: engine.tokenize(tpl.fill(r.values)) for r in rows}
        self.max_tokens = cfg.max_tokens
        self.llama = LlamaPaths(engine.info.path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                                n_threads=cfg.n_threads, cache_dir=tmp,
                                flash_attn=engine.kernels.flash_attn)
        self.rows: dict[str, list[dict]] = {}  # per mode, the peer's rows run beside it
        self._steps = None
        self._done: set[int] = set()  # our rows the peer ran beside

    def after(self, result) -> None:
        if not isinstance(result, BenchResult):  # runs also hand over their text as it comes
            return
        new = [r for r in result.rows if r.row not in self._done]
        if not new:
            return
        if self._steps is None:
            self._steps = recurring_rows_one_by_one(self.llama, list(self.tokens.values()),
                                                    self.max_tokens)
        figures = next(self._steps)
        for r in new:
            self.rows.setdefault(r.reuse, []).append({"row": r.row, **figures})
        self._done.update(r.row for r in new)

    def _end_pass(self) -> None:
        if self._steps is not None:
            self._steps.close()

    def close(self) -> None:
        self._end_pass()
        self.llama.close()


def bit_identical_counts(rows: list[dict]) -> dict:
    """Per mode: rows run, and rows whose warm run equalled the cold run bit for bit."""
    out = {}
    for mode in MODES:
        ok = _ok(rows, mode).values()
        out[mode] = {"rows": len(ok), "bit_identical": sum(
            1 for r in ok if r["equivalence"] == "bit-identical")}
    return out


def arch_ratios(rows: list[dict], peer: dict[str, list[dict]]) -> dict:
    """Medians of per-row ratios: each mode's warm time to first token against the same row's
    cold run, and against llama-cpp-python's time on the same row, run right after it."""
    ratios: dict[str, float | None] = {}
    for mode in MODES:
        ok = _ok(rows, mode)
        name = "warm_vs_cold" if mode == "prefix" else f"{mode}_vs_cold"
        ratios[name] = pairwise_ratio([r["warm_ms"] for r in ok.values()],
                                      [r["cold_ms"] for r in ok.values()]) if ok else None
        by_row = {p["row"]: p for p in peer.get(mode, [])}
        both = sorted(set(ok) & set(by_row))
        if both:
            ratios[f"{mode}_vs_llamacpp_ram"] = pairwise_ratio(
                [ok[n]["warm_ms"] for n in both], [by_row[n]["ttft_ms"] for n in both])
            # the tokens each side evaluated: what the time ratio means on a quiet machine
            ratios[f"{mode}_vs_llamacpp_ram_evaluated"] = pairwise_ratio(
                [ok[n]["evaluated_tokens"] for n in both],
                [by_row[n]["evaluated_tokens"] for n in both])
    return ratios


def format_stateful(st: dict) -> str:
    """The section in words: one block per architecture, a line per row and mode."""
    lines = [f"Stateful models ({st['note']})"]
    for arch, a in st["archs"].items():
        if "error" in a:
            lines.append(f"\n{arch}: failed: {a['error']}")
            continue
        m = a["model"]
        lines.append(f"\n{arch}: {m.get('n_layer')} layers ({a['layout'] or 'default'}), "
                     f"{m.get('n_embd')} wide, {a['weight_type']}, "
                     f"{m.get('file_bytes', 0) / 1e6:.1f} MB")
        peers = a.get("llamacpp_ram", {})
        lines.append(" row mode   prompt reused  eval  cold ms  warm ms  llama-cpp-python ms "
                     "(reused)  verdict")
        for r in a["rows"]:
            if r.get("error"):
                lines.append(f"{r['row']:4} {r['reuse']:6} error: {r['error']}")
                continue
            p = {q["row"]: q for q in peers.get(r["reuse"], [])}.get(r["row"])
            theirs = f"{p['ttft_ms']:9.1f} ({p['reused_tokens']:5})" if p else " " * 17
            lines.append(f"{r['row']:4} {r['reuse']:6} {r['prefix_tokens'] + r['suffix_tokens']:6} "
                         f"{r['reused_tokens']:6} {r['evaluated_tokens']:5} {r['cold_ms']:8.1f} "
                         f"{r['warm_ms']:8.1f}  {theirs}         {r['equivalence']}")
        counts = ", ".join(f"{mode} {c['bit_identical']}/{c['rows']}"
                           for mode, c in a["bit_identical"].items())
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in a["ratios"].items() if v is not None)
        lines.append(f"bit-identical: {counts}; chain reused past the static prefix on "
                     f"{a['chain_reused_past_prefix']} rows; {ratios}")
    return "\n".join(lines)
