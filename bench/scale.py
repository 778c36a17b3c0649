"""The scale section of `make bench`: long prefixes on real-sized models, in one run.

Models (bench/shaped_models.py): the default model declaring a 32k context (its own weights,
context_length rewritten), at prefixes of about 2k, 8k and 32k tokens; a random-weight model of
Llama 3.2 1B's shape, at about 2k and 8k (16k with --scale-1b-sizes). The prompt: the RAG
example's handbook and its passages repeated, numbered on, to the target length (the static
prefix), and a short question (the suffix).

For each model and size (each side in a process of its own, so that its peak RSS is its own):
- ours (bench/scale_ours.py): prime, the cold and warm runs as the CLI makes them, warm with the
  prefix resident, from the RAM tier, from the cache's file tier and from a .kvstate file, the
  fastest limit, and this machine's memcpy and read limits for the same bytes;
- plain llama-cpp-python at the same n_ctx (bench/scale_peer_child.py): its cold run and peak
  RSS, and its LlamaRAMCache and LlamaDiskCache on the same prompt;
- llama-server (server_peer.slot_and_cache_ram): its --cache-ram and a slot restored from
  --slot-save-path.
Ratios per run (``run_ratios``, from that run's own figures) and the goals table for real
sizes (``goal_rows``: the worst run against each goal) go under "scale" in results.json; the
chart is bench/scale_chart.py's, the text and Markdown bench/scale_report.py's.
"""
from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .stats import goal_met, pairwise_ratio

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = (2048, 8192, 32768)
DEFAULT_1B_SIZES = (2048, 8192)
MODEL_32K, MODEL_1B = "smollm2-135m-32k", "llama3.2-1b"
# what the suffix, the generated tokens and llama.cpp's rounding need beyond the prefix
CTX_MARGIN = 256
# prefix evaluations per run: our prime, our cold run, plain llama-cpp-python, llama-server
EVALS_PER_RUN = 4

# per-run goals (upper bounds) the project sets for real sizes; restore times against the
# machine's limit times: <= 2 is "at 50% or more of the limit's speed"
RUN_GOALS = {
    "warm_ram_vs_limit": 1.1,
    "warm_file_vs_limit": 1.2,
    "restore_ram_vs_memcpy": 2.0,
    "restore_file_vs_read": 2.0,
    "rss_less_ram_tier_vs_plain": 1.25,
    "state_bytes_vs_raw_kv": 1.01,
    "not_bit_identical": 0,
    "failed_paths": 0,  # e.g. a .kvstate that fits the context, refused
}
WARM_VS_COLD_32K_GOAL = 1 / 150  # the default model's shape at its largest prefix


@dataclass(frozen=True)
class ScaleConfig:
    sizes: tuple[int, ...] = DEFAULT_SIZES  # prefix targets on the default model's 32k shape
    sizes_1b: tuple[int, ...] = DEFAULT_1B_SIZES  # on the Llama 3.2 1B shape
    n_batch: int = 256
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_tokens: int = 8
    repeats: int = 3  # warm samples per path and run
    llamacpp: bool = True
    server: bool = True
    # model name -> GGUF path, instead of bench/shaped_models.py's (the tests' tiny model)
    model_paths: dict | None = None
    head_chars: int | None = None  # rag.tmpl's handbook cut to this (None: whole; tiny models)
    timeout_s: float = 4 * 3600.0


def plan(cfg: ScaleConfig) -> list[tuple[str, int]]:
    """Shorter prefixes first, whatever the model: the longest run (minutes per evaluation at
    32k) comes last, so a run stopped early has kept every smaller size."""
    runs = [(MODEL_32K, n) for n in cfg.sizes] + [(MODEL_1B, n) for n in cfg.sizes_1b]
    return sorted(runs, key=lambda r: r[1])


def model_path(cfg: ScaleConfig, name: str) -> Path:
    if cfg.model_paths and name in cfg.model_paths:
        return Path(cfg.model_paths[name])
    from .shaped_models import shaped_model

    return shaped_model(name)


def size_label(n: int) -> str:
    return f"{n / 1024:g}k" if n >= 1024 and n % 512 == 0 else str(n)


# ---- the prompt --------------------------------------------------------------------------

def passages() -> list[str]:
    """Every distinct passage of the RAG example's row files, in file order."""
    from app.resources_path import examples_dir

    seen: dict[str, None] = {}
    for name in ("rag-rows.csv", "rag-recurring.csv"):
        with open(examples_dir() / name, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                for k in ("c1", "c2", "c3"):
                    if row.get(k):
                        seen.setdefault(row[k].strip(), None)
    return list(seen)


def question() -> str:
    from app.resources_path import examples_dir

    with open(examples_dir() / "rag-rows.csv", encoding="utf-8", newline="") as f:
        return next(csv.DictReader(f))["question"]


def build_template(target: int, count_tokens, head_chars: int | None = None) -> str:
    """rag.tmpl's handbook (its first ``head_chars`` characters, in whole lines, when given),
    then numbered passages until the static prefix is about ``target`` tokens
    (``count_tokens(text)``), then the question slot; the passages cycle, each pass marked
    with its own source line so no two lines are the same."""
    from app.resources_path import examples_dir

    from .stateful_bench import short_rag_template

    full = (examples_dir() / "rag.tmpl").read_text(encoding="utf-8")
    tail = "<|im_end|>\n<|im_start|>user\n"
    if head_chars is None:  # a target under twice the handbook: half of it handbook at most
        whole = full.split("# Context\n", 1)[0]
        n = count_tokens(whole + tail)
        head_chars = len(whole) * target // (2 * n) if 2 * n > target else None
    if head_chars is not None:
        full = short_rag_template(full, head_chars)
    head = full.split("# Context\n", 1)[0] + "# Context\n"
    lines: list[str] = []
    texts = [p.replace("<", "\\<") for p in passages()]  # a literal '<' in a template
    have = count_tokens(head + tail)
    k = 0
    while have < target:
        batch = []
        for _ in range(8):  # a few lines at a time: the count is exact, not a sum of parts
            src, text = divmod(k, len(texts))
            batch.append(f"{k + 1}. (archive {src + 1}) {texts[text]}")
            k += 1
        lines += batch
        have = count_tokens(head + "\n".join(lines) + tail)
    while len(lines) > 1 and count_tokens(head + "\n".join(lines[:-1]) + tail) >= target:
        lines.pop()
    return head + "\n".join(lines) + tail + "<question><|im_end|>\n<|im_start|>assistant\n"


def tokenizer_of(path: Path):
    """(count_tokens, n_ctx_train, the model to close) from the model's own vocabulary, loaded
    by the engine's loader."""
    import llama_cpp as L

    from app.engine.llama.native_model import NativeModel

    model = NativeModel(path)
    n_train = L.llama_model_n_ctx_train(model.ptr)
    return (lambda text: len(model.tokenize(text, add_special=True, parse_special=True))), \
        n_train, model


# ---- children ------------------------------------------------------------------------------

class ChildError(RuntimeError):
    pass


def run_child(module: str, request: dict, timeout_s: float) -> dict:
    """``python -m module`` from the repository root: the request on stdin, the JSON answer
    from stdout (ChildError on a crash, a timeout or an error it reports)."""
    try:
        r = subprocess.run([sys.executable, "-m", module], input=json.dumps(request), cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ChildError(f"{module} did not finish in {timeout_s:.0f} s") from None
    try:
        answer = json.loads(r.stdout)
    except json.JSONDecodeError:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ChildError(f"{module} ended (exit {r.returncode}) without an answer: {tail}") from None
    if not answer.get("ok"):
        raise ChildError(f"{module}: {answer.get('error')}")
    return answer


def one_run(cfg: ScaleConfig, name: str, target: int, log) -> dict:
    path = model_path(cfg, name)
    count, n_train, vocab = tokenizer_of(path)
    try:
        want = min(target, n_train - CTX_MARGIN)
        tpl = build_template(want, count, cfg.head_chars)
        prefix_est = count(tpl.split("<question>")[0])
    finally:
        vocab.close()
    n_ctx = min(-(-(prefix_est + CTX_MARGIN) // 256) * 256, max(n_train, 256))
    run: dict = {"model": name, "target": target, "label": size_label(target),
                 "path": str(path), "n_ctx": n_ctx}
    log(f"scale: {name} at about {target} tokens (n_ctx {n_ctx}): ours")
    t0 = time.perf_counter()
    ours = run_child("bench.scale_ours", {
        "model_path": str(path), "n_ctx": n_ctx, "n_batch": cfg.n_batch,
        "n_threads": cfg.n_threads, "template": tpl, "values": {"question": question()},
        "max_tokens": cfg.max_tokens, "repeats": cfg.repeats}, cfg.timeout_s)
    run["ours"] = ours
    ram = _med(s["ttft_ms"] for s in ours["samples"]["ram"])
    log(f"scale: ours {ours['prefix_tokens']} prefix tokens: cold {ours['cold']['ttft_ms']:,.0f} "
        f"ms, warm from RAM " + ("failed" if ram is None else f"{ram:,.0f} ms")
        + f" ({time.perf_counter() - t0:.0f} s)"
        + "".join(f"; {k} failed: {v}" for k, v in (ours.get("errors") or {}).items()))
    common = {"model_path": str(path), "n_ctx": n_ctx, "n_batch": cfg.n_batch,
              "n_threads": cfg.n_threads, "flash_attn": ours["flash_attn"]}
    if cfg.llamacpp:
        log("scale: plain llama-cpp-python, LlamaRAMCache, LlamaDiskCache")
        run["llamacpp"] = _peer(lambda: run_child("bench.scale_peer_child", {
            **common, "tokens": ours["tokens"], "boundary": ours["boundary"],
            "unrelated": ours["unrelated"], "repeats": cfg.repeats}, cfg.timeout_s))
    if cfg.server:
        from .server_peer import slot_and_cache_ram

        log("scale: llama-server, --cache-ram and a slot restored from --slot-save-path")
        run["llama_server"] = _peer(lambda: slot_and_cache_ram(
            **common, tokens=ours["tokens"], boundary=ours["boundary"],
            unrelated=ours["unrelated"], max_tokens=cfg.max_tokens, repeats=cfg.repeats))
    run["seconds"] = round(time.perf_counter() - t0, 1)
    for side in ("ours", "llamacpp"):  # the token lists are inputs, not figures
        for k in ("tokens", "unrelated"):
            run.get(side, {}).pop(k, None)
    run["ratios"] = run_ratios(run)
    return run


def _peer(fn) -> dict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one peer's failure must not lose the others
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0]}


# ---- ratios and goals -----------------------------------------------------------------------

def _ms(samples: list[dict], key: str = "ttft_ms") -> list[float]:
    return [s[key] for s in samples]


def _med(xs) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def _pair(a: list[float], b: list[float]) -> float | None:
    """The median of paired ratios; None when a path has no samples or lost some (failed)."""
    return pairwise_ratio(a, b) if a and len(a) == len(b) else None


def _div(a, b) -> float | None:
    return a / b if a is not None and b else None


def file_floor(ours: dict) -> dict:
    """The warm run from a .kvstate against its floor: the limit plus a sequential read of the
    same bytes from a dropped page cache, which no load can beat. Per repeat (the limit, the
    read and the warm run of one repeat), then the median and the spread of those ratios. A
    sample without its own read (a run stored before samples had one) uses the run's
    ``limits.read_cold_ms``: a file of the same size, read once at the end."""
    s, lim = ours["samples"], ours["limits"]
    files, limits = s["state_file"], s["limit"]
    if not files or len(files) != len(limits):
        return {"ratio": None, "min": None, "max": None, "read_ms": None, "paired_read": False,
                "vs_limit": None}
    reads = [x.get("read_ms", lim["read_cold_ms"]) for x in files]
    ratios = [f["ttft_ms"] / (li["ttft_ms"] + r) for f, li, r in zip(files, limits, reads)]
    # the floor itself against the limit: over a goal for the file path, no load meets it here
    over = [(li["ttft_ms"] + r) / li["ttft_ms"] for li, r in zip(limits, reads) if li["ttft_ms"]]
    return {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "read_ms": statistics.median(reads), "paired_read": all("read_ms" in x for x in files),
            "vs_limit": statistics.median(over) if over else None}


def run_ratios(run: dict) -> dict:
    """One run's ratios, each from that run's own samples (time ratios: medians of ratios of
    samples taken in the same repeat)."""
    o = run["ours"]
    s, lim, sz = o["samples"], o["limits"], o["sizes"]
    r: dict[str, float | None] = {}
    for tier, name in (("resident", "warm_resident"), ("ram", "warm_ram"),
                       ("file_tier", "warm_file_tier"), ("state_file", "warm_file")):
        r[f"{name}_vs_limit"] = _pair(_ms(s[tier]), _ms(s["limit"]))
        r[f"{name}_vs_cold"] = _div(_med(_ms(s[tier])), o["cold"]["ttft_ms"])
    # `run --state` again soon after, the file in the page cache (runs stored before: None)
    r["warm_file_cached_vs_limit"] = _pair(_ms(s.get("state_file_cached", [])), _ms(s["limit"]))
    # the spread of the file path's paired ratios, and the same against its floor (file_floor)
    per_repeat = ([f / li for f, li in zip(_ms(s["state_file"]), _ms(s["limit"]))]
                  if r["warm_file_vs_limit"] is not None else [])
    r["warm_file_vs_limit_min"] = min(per_repeat, default=None)
    r["warm_file_vs_limit_max"] = max(per_repeat, default=None)
    floor = file_floor(o)
    r["warm_file_vs_floor"] = floor["ratio"]
    r["warm_file_vs_floor_min"], r["warm_file_vs_floor_max"] = floor["min"], floor["max"]
    r["file_floor_vs_limit"] = floor["vs_limit"]
    restore_file = [x["load_ms"] + x["restore_ms"] for x in s["state_file"]]
    r["restore_ram_vs_memcpy"] = _div(_med(_ms(s["ram"], "restore_ms")), lim["memcpy_ms"])
    r["restore_file_tier_vs_read"] = _div(_med(_ms(s["file_tier"], "restore_ms")),
                                          lim["read_cold_ms"])
    if s["state_file"] and all("read_ms" in x for x in s["state_file"]):
        # each load against the read of the same file just before it (scale_ours._file_sample)
        r["restore_file_vs_read"] = _pair(restore_file, _ms(s["state_file"], "read_ms"))
    else:  # a run stored before samples had their own read: the read at the run's end
        r["restore_file_vs_read"] = _div(_med(restore_file), lim["read_cold_ms"])
    r["state_bytes_vs_raw_kv"] = _div(sz["state_file_bytes"],
                                      sz["raw_kv_bytes"] + sz["recurrent_state_bytes"])
    verdicts = [v for vs in o["verdicts"].values() for v in vs] + [o["first_verdict"]]
    r["not_bit_identical"] = float(sum(v != "bit-identical" for v in verdicts))
    r["failed_paths"] = float(len(o.get("errors") or {}))
    p = run.get("llamacpp") or {}
    if "error" not in p and p:
        r["rss_vs_plain"] = _div(o["peak_rss"]["run"], p["peak_rss"]["plain"])
        r["rss_less_ram_tier_vs_plain"] = _div(o["peak_rss"]["run"] - ram_tier_bytes(o),
                                               p["peak_rss"]["plain"])
        r["cold_vs_plain_cold"] = _div(o["cold"]["ttft_ms"], p["cold"]["ttft_ms"])
        r["warm_ram_vs_llamacpp_ram"] = _pair(_ms(s["ram"]), _ms(p["llamacpp_ram"]))
        r["warm_file_vs_llamacpp_disk"] = _pair(_ms(s["state_file"]), _ms(p["llamacpp_disk"]))
        r["state_bytes_vs_llamacpp_ram_entry"] = _div(sz["state_file_bytes"],
                                                      p["sizes"]["ram_entry_bytes"])
    q = run.get("llama_server") or {}
    if "error" not in q and q:
        r["warm_ram_vs_server_cache_ram"] = _div(_med(_ms(s["ram"])),
                                                 _med(_ms(q.get("cache_ram", []))))
        r["warm_file_vs_server_slot_restore"] = _pair(_ms(s["state_file"]),
                                                      _ms(q.get("slot_restore", [])))
    return r


def ram_tier_bytes(ours: dict) -> int:
    """The bytes the radix cache's RAM tier held through the run (its kept copies included),
    reported apart from peak RSS: the least of what it held after the prime and after the
    first run (a run that stored more there could have peaked before it did)."""
    held = [sum(t["used_bytes"] for t in ours[k] if t["name"] == "ram")
            for k in ("tiers_after_prime", "tiers_after_run") if ours.get(k) is not None]
    return min(held, default=0)


def run_goals(run: dict, largest_32k: bool) -> dict:
    goals = dict(RUN_GOALS)
    if largest_32k:
        goals["warm_ram_vs_cold"] = WARM_VS_COLD_32K_GOAL
    rs = run["ratios"]
    return {k: {"goal": f"<= {b:.4g}", "value": rs.get(k), "met": goal_met(rs.get(k), b)}
            for k, b in goals.items()}


# the goals for real sizes: (figure, ratio name, bound, the runs it applies to)
GOAL_ROWS = (
    ("warm / cold time to first token, largest prefix, the default model's 32k shape",
     "warm_ram_vs_cold", WARM_VS_COLD_32K_GOAL, "largest_32k"),
    ("warm from the RAM tier / the fastest limit, every size and model", "warm_ram_vs_limit",
     1.1, "all"),
    ("warm from a .kvstate file / the fastest limit, every size and model (page cache dropped)",
     "warm_file_vs_limit", 1.2, "all"),
    ("warm from a .kvstate file in the page cache (`run --state` again soon after) / the limit",
     "warm_file_cached_vs_limit", 1.2, "all"),
    ("restore from the RAM tier / memcpy of the same bytes (time; <= 2: >= 0.5 of its speed)",
     "restore_ram_vs_memcpy", 2.0, "all"),
    ("load from a file / sequential read of the same size (time; <= 2: >= 0.5 of its speed)",
     "restore_file_vs_read", 2.0, "all"),
    ("peak RSS less the RAM tier's bytes / plain llama-cpp-python, same n_ctx",
     "rss_less_ram_tier_vs_plain", 1.25, "all"),
    ("state bytes / raw KV, every size", "state_bytes_vs_raw_kv", 1.01, "all"),
    ("warm runs not bit-identical, every size and model", "not_bit_identical", 0, "all"),
    ("paths that failed (a state that fits the context not loaded, ...)", "failed_paths", 0,
     "all"),
)
SUMMED = ("not_bit_identical", "failed_paths")  # counts: the goals table adds them up
# goals whose run has a floor no code beats (the limit + the disk's read of the same bytes)
FLOORED = {"warm_file_vs_limit": "file_floor_vs_limit"}


def goal_rows(runs: list[dict]) -> list[dict]:
    """Each goal for real sizes against the worst run (the largest value: every goal is an
    upper bound), with the run it came from."""
    ok = [r for r in runs if "error" not in r]
    big = max((r for r in ok if r["model"] == MODEL_32K), key=lambda r: r["target"], default=None)
    out = []
    for figure, name, bound, which in GOAL_ROWS:
        pool = [big] if which == "largest_32k" and big else ok if which == "all" else []
        vals = [(r["ratios"].get(name), r) for r in pool if r["ratios"].get(name) is not None]
        if name in SUMMED:  # a count: the sum over runs
            value = sum(v for v, _ in vals) if vals else None
            where = f"{len(vals)} runs"
        elif vals:
            value, worst = max(vals, key=lambda x: x[0])
            where = f"{worst['model']} {worst['label']}"
        else:
            value, worst, where = None, None, "not measured"
        row = {"figure": figure, "ratio": name, "goal": f"<= {bound:.4g}", "value": value,
               "met": goal_met(value, bound), "worst": where}
        floor = worst and name in FLOORED and worst["ratios"].get(FLOORED[name])
        if row["met"] is False and floor and floor > bound:
            row["floor"] = floor  # the disk's read alone puts that run over the goal
        out.append(row)
    return out


# ---- the whole section -------------------------------------------------------------------

def estimate_full_run(runs: list[dict], full: ScaleConfig) -> dict:
    """The full run's duration, from this run's cold times: per model a fit of cold time
    against prefix tokens (a P + b P², attention's cost grows with the prefix; linear from one
    point), times EVALS_PER_RUN prefix evaluations per run, plus this run's other time per run."""
    per_model: dict[str, list[tuple[int, float]]] = {}
    other = []
    for r in runs:
        if "error" in r:
            continue
        p, cold_s = r["ours"]["prefix_tokens"], r["ours"]["cold"]["ttft_ms"] / 1000
        per_model.setdefault(r["model"], []).append((p, cold_s))
        other.append(max(r["seconds"] - EVALS_PER_RUN * cold_s, 0.0))
    fits = {m: _fit(pts) for m, pts in per_model.items()}

    def seconds(name: str, target: int) -> float:
        a, b = fits[name]
        return EVALS_PER_RUN * (a * target + b * target * target) + _med(other)

    missing = sorted({name for name, _ in plan(full)} - set(fits))
    if missing:
        return {"seconds": None, "note": f"no run of {', '.join(missing)} to estimate from"}
    return {"seconds": round(sum(seconds(n, t) for n, t in plan(full))),
            # 16k on the 1B shape is worth a run if it fits in about 15 minutes
            "extra_1b_16k_seconds": round(seconds(MODEL_1B, 16384)),
            "fits": {m: {"a_s_per_token": a, "b_s_per_token2": b} for m, (a, b) in fits.items()},
            "sizes": {MODEL_32K: list(full.sizes), MODEL_1B: list(full.sizes_1b)}}


def _fit(pts: list[tuple[int, float]]) -> tuple[float, float]:
    if len(pts) == 1:
        p, t = pts[0]
        return t / p, 0.0
    import numpy as np

    x = np.array([p for p, _ in pts], dtype=float)
    y = np.array([t for _, t in pts], dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.stack([x, x * x], axis=1), y, rcond=None)
    if b < 0:  # noise on small sizes: no negative growth
        a, b = float(np.sum(x * y) / np.sum(x * x)), 0.0
    return float(a), float(b)


def run_scale(cfg: ScaleConfig, log=print, on_run=None) -> dict:
    """Every model and size of ``cfg``; ``on_run(section)`` after each run (the bench writes
    results.json then, so a later failure keeps the figures)."""
    from .machine import CpuShare, loadavg, machine_info

    t_start = time.perf_counter()
    share = CpuShare(cfg.n_threads, children=True)  # the work runs in child processes
    out: dict = {"settings": {**asdict(cfg), "evals_per_run": EVALS_PER_RUN,
                              "models": {MODEL_32K: "the default model, context_length "
                                         "rewritten to 32,768", MODEL_1B: "random weights, "
                                         "Llama 3.2 1B's shape, Q4_0, the default model's "
                                         "tokenizer"}},
                 "machine": machine_info(), "runs": []}
    sizes = {MODEL_32K: max(cfg.sizes, default=0)}
    for name, target in plan(cfg):
        try:
            run = one_run(cfg, name, target, log)
            run["goals"] = run_goals(run, name == MODEL_32K and target == sizes[MODEL_32K])
        except Exception as e:  # noqa: BLE001 - one run's failure must not lose the others
            run = {"model": name, "target": target, "label": size_label(target),
                   "error": f"{type(e).__name__}: {e}".splitlines()[0]}
            log(f"scale: {name} at {target} failed: {run['error']}")
        out["runs"].append(run)
        if on_run:
            on_run(out)
    out["goal_rows"] = goal_rows(out["runs"])
    out["ratios"], out["goals"] = top_level(out["runs"])
    out["duration_s"] = round(time.perf_counter() - t_start, 1)
    out["machine"].update(loadavg_end=loadavg(), cpu_share=round(share.value(), 3))
    if (cfg.sizes, cfg.sizes_1b) != (DEFAULT_SIZES, DEFAULT_1B_SIZES):
        est = out["full_run_estimate"] = estimate_full_run(out["runs"], ScaleConfig())
        if est.get("seconds") and 0 < out["machine"]["cpu_share"] < 1:
            # on a quiet machine the same work gets all of its cores
            est["quiet_seconds"] = round(est["seconds"] * out["machine"]["cpu_share"])
    return out


def rescore(sc: dict) -> dict:
    """A stored scale section's ratios, goals and goal rows computed again from its runs' own
    figures (after a change to what the ratios or goals are); the figures are not touched."""
    largest = max(sc.get("settings", {}).get("sizes") or [0])  # as run_scale picks it
    for run in sc["runs"]:
        if "error" not in run:
            run["ratios"] = run_ratios(run)
            run["goals"] = run_goals(run, run["model"] == MODEL_32K and run["target"] == largest)
    sc["goal_rows"] = goal_rows(sc["runs"])
    sc["ratios"], sc["goals"] = top_level(sc["runs"])
    return sc


def run_key(run: dict) -> str:
    tag = {MODEL_32K: "smollm2_32k", MODEL_1B: "llama1b"}.get(run["model"], run["model"])
    return f"scale_{tag}_{run['label']}"


def top_level(runs: list[dict]) -> tuple[dict, dict]:
    """Every run's ratios and goals under scale_<model>_<size>_<ratio>, for results.json's
    top-level "ratios" and "goals"."""
    ratios, goals = {}, {}
    for r in runs:
        if "error" in r:
            continue
        key = run_key(r)
        ratios.update({f"{key}_{k}": v for k, v in r["ratios"].items()})
        goals.update({f"{key}_{k}": g for k, g in r.get("goals", {}).items()})
    return ratios, goals
