"""What an engine will allocate, added up before any of it is spent.

An engine holds the model's weights, two contexts (the cache's, with ``n_seq_max`` sequences;
the work context, where warm and cold runs both evaluate, with three on attention-only models
and two otherwise) and the RAM tier of the radix cache. Each context holds K and V for every
cell (the KV types' row bytes × the cells llama.cpp rounds the context to), a recurrent state
per sequence on hybrid and recurrent models, an output buffer of logits and a compute buffer
for the biggest batch. All but the compute buffer follow from the model's shape; the compute
buffer is llama.cpp's own figure: it creates each context on a copy of the model loaded with
``no_alloc`` (metadata only: it plans every buffer and allocates none) and logs the sizes it
would allocate. Checked against what llama.cpp allocates for real in
tests/engine/llama/test_memory_budget.py. On an attention-only model without a sliding window
the cache's context is created only when a node's cells are first placed in it (kv_engine.py):
the budget counts it all the same, as what the engine may come to hold.

``check_budget`` refuses, in one line, a set-up whose sum exceeds the memory available
(MemAvailable on Linux), naming the context size or KV types that fit, instead of letting the
machine swap or the process be killed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import llama_cpp as L

from ..byte_sizes import size_text
from ..errors import MemoryBudgetError
from .ggml_types import kv_bytes_per_token
from .native import CELL_PAD, check_context_params, context_cells
from .llama_backend import add_log_listener, ensure_backend, expected_errors, remove_log_listener

QUANTIZED_KV = "q8_0"  # the KV type a refusal suggests (about 0.53 of f16's bytes)


@dataclass(frozen=True)
class ContextMemory:
    """One context's allocations, in bytes."""
    name: str  # "cache", "work"
    cells: int  # KV cells (the context size as llama.cpp rounds it)
    sequences: int
    kv: int  # K and V of the attention layers over every cell
    recurrent: int  # one recurrent state per sequence (hybrid and recurrent models)
    compute: int  # the compute buffer and the output buffer (logits)

    @property
    def total(self) -> int:
        return self.kv + self.recurrent + self.compute


@dataclass(frozen=True)
class MemoryBudget:
    """What an engine allocates, by part, in bytes, and the memory available for it."""
    model: int  # the weights
    contexts: tuple[ContextMemory, ...]
    tiers_cap: int  # the radix cache's RAM tier cap (its resident tier is the cache's KV cells)
    available: int  # the memory available when the engine started; 0: not known here
    available_source: str = ""  # where ``available`` comes from ("MemAvailable", ...)
    compute_source: str = "llama.cpp"  # "llama.cpp" (its planned buffers) or "estimate"

    @property
    def kv(self) -> int:
        """K, V and recurrent states of every context."""
        return sum(c.kv + c.recurrent for c in self.contexts)

    @property
    def compute(self) -> int:
        return sum(c.compute for c in self.contexts)

    @property
    def total(self) -> int:
        return self.model + self.kv + self.compute + self.tiers_cap

    @property
    def fits(self) -> bool:
        return not self.available or self.total <= self.available

    def context(self, name: str) -> ContextMemory | None:
        return next((c for c in self.contexts if c.name == name), None)

    def parts_text(self) -> str:
        kv = " + ".join(size_text(c.kv + c.recurrent) for c in self.contexts)
        return (f"model {size_text(self.model)}, KV {kv}, compute {size_text(self.compute)}, "
                f"RAM tier cap {size_text(self.tiers_cap)}")

    def text(self) -> str:
        """One line: the sum, its parts and the memory available."""
        avail = (f" of {size_text(self.available)} available" if self.available
                 else " (memory available not known here)")
        return f"{size_text(self.total)}{avail} ({self.parts_text()})"

    def as_dict(self) -> dict:
        return {**asdict(self), "kv_bytes": self.kv, "compute_bytes": self.compute,
                "total": self.total}


# ---- the memory available ----------------------------------------------------------------


def memory_available() -> tuple[int, str]:
    """Bytes the machine can give a new process without swapping, and where the figure comes
    from: Linux's MemAvailable (free memory plus the page cache it can drop); elsewhere the
    free physical pages (sysconf), which leaves out the page cache; (0, "") when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages"
    except (ValueError, OSError, AttributeError):
        return 0, ""


# ---- llama.cpp's compute buffers -----------------------------------------------------------

_BUFFER_LINE = re.compile(r"(compute|output) buffer size =\s*([0-9.]+) MiB")
_planned: dict[str, tuple[int, ...]] = {}  # plan key -> bytes per context (and on disk)
_KEPT_PLANS = 64  # plans kept on disk, the newest
_PLAN_FORMAT = "outputs-per-sequence"  # how NativeContext sizes a context (a change: plan again)


def _plans_path() -> Path:
    from .crash_probe import cache_path

    return cache_path().parent / "memory-plans.json"


def _plan_key(model, param_sets, use_extra_bufts: bool, n_gpu_layers: int) -> str:
    from .llama_backend import library_dir

    st = Path(model.path).stat()
    lib = library_dir()  # another build of the same version plans other buffers
    text = "|".join([_PLAN_FORMAT, L.__version__, str(lib), str(lib.stat().st_mtime_ns),
                     str(Path(model.path).resolve()), str(st.st_size),
                     str(st.st_mtime_ns), str(use_extra_bufts), str(n_gpu_layers),
                     *map(repr, param_sets)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _read_plans() -> dict:
    try:
        plans = json.loads(_plans_path().read_text(encoding="utf-8"))
        return plans if isinstance(plans, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(key: str, sizes: tuple[int, ...]) -> None:
    _planned[key] = sizes
    plans = _read_plans()
    plans.pop(key, None)
    plans[key] = list(sizes)
    plans = dict(list(plans.items())[-_KEPT_PLANS:])
    try:
        path = _plans_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(plans), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a plan not kept is made again next time


def planned_compute(model, param_sets, use_extra_bufts: bool = True,
                    n_gpu_layers: int = 0) -> tuple[int, ...] | None:
    """llama.cpp's compute + output buffer bytes for a context of each ContextParams in
    ``param_sets`` (host buffers and device ones alike), or None if it cannot say.

    The model is loaded again with ``no_alloc``: llama.cpp reads its metadata, plans every
    tensor and buffer and allocates none (llama_model_params.no_alloc, what llama.cpp's own
    memory fit uses), and logs the buffer sizes each context would allocate. Remembered per
    model file, settings and llama-cpp-python version, in memory and in the user's cache
    folder: loading the model's metadata again takes a few hundred ms on the default model."""
    key = _plan_key(model, param_sets, use_extra_bufts, n_gpu_layers)
    if key not in _planned:
        kept = _read_plans().get(key)
        if isinstance(kept, list) and len(kept) == len(param_sets):
            _planned[key] = tuple(int(x) for x in kept)
    if key in _planned:
        return _planned[key]
    from .native import NativeContext

    ensure_backend()
    params = L.llama_model_default_params()
    params.n_gpu_layers = 1 << 30 if n_gpu_layers == -1 else n_gpu_layers
    params.use_extra_bufts = use_extra_bufts
    params.no_alloc = True
    params.load_mode = L.LLAMA_LOAD_MODE_NONE  # llama.cpp asserts that a no_alloc load maps nothing
    me, heard = threading.get_ident(), []

    def listen(_level: int, text: str) -> None:
        if threading.get_ident() == me:  # the log is the process's: this thread's lines only
            m = _BUFFER_LINE.search(text)
            if m:
                heard.append(float(m.group(2)))

    add_log_listener(listen)
    try:
        with expected_errors():
            ptr = L.llama_model_load_from_file(str(model.path).encode("utf-8"), params)
        if not ptr:
            return None
        dry = _DryModel(ptr, model)
        try:
            out = []
            for p in param_sets:
                heard.clear()
                try:
                    ctx = NativeContext(dry, p)
                except Exception:  # noqa: BLE001 - no plan: the caller estimates instead
                    return None
                ctx.close()
                if not heard:
                    return None
                out.append(int(sum(heard) * (1 << 20)))
        finally:
            L.llama_model_free(ptr)
    finally:
        remove_log_listener(listen)
    _remember(key, tuple(out))
    return _planned[key]


class _DryModel:
    """What NativeContext uses of a model, for the no_alloc copy."""

    def __init__(self, ptr, model):
        self.ptr = ptr
        self.path = model.path
        self.meta = model.meta


def estimated_compute(facts: dict, p, flash_attn: bool | None) -> int:
    """A compute + output buffer size for when llama.cpp cannot plan one; it errs high. The
    compute buffer holds a micro-batch's logits (vocabulary × tokens, f32), its activations
    (a few rows of the model's width and of the feed-forward's per token), the attention mask
    (cells × tokens) and, without flash attention, one layer's attention scores (heads × cells
    × tokens, f32); the output buffer keeps a row of logits per sequence. (Against llama.cpp's
    plan on the default model: +16% to +77% between 4,096 and 32,768 cells.)"""
    n_batch = min(p.n_batch, p.n_ctx)
    ubatch = min(p.n_ubatch, n_batch) if p.n_ubatch else n_batch
    cells = context_cells(p.n_ctx)
    width = 8 * facts["n_embd"] + 2 * (facts.get("n_ff") or 4 * facts["n_embd"])
    scores = 0 if flash_attn else facts["n_head"] * cells * ubatch
    return 4 * (ubatch * (facts["n_vocab"] + width + cells) + scores
                + facts["n_vocab"] * p.n_seq_max)


# ---- the budget ----------------------------------------------------------------------------


def work_sequences(stateful: bool) -> int:
    """The work context's sequences: the run's and staging, and for attention-only models the
    composed modules' cells held at their places in the row until their turn (module_compose.py);
    a stateful model would pay a recurrent state for it and composes without it."""
    return 2 if stateful else 3


def context_sets(config, flash_attn: bool | None,
                 stateful: bool = False) -> list[tuple[str, object]]:
    """The contexts an engine with ``config`` (an EngineConfig) opens, by name, with their
    ContextParams."""
    return [("cache", config.context_params(config.n_seq_max, flash_attn)),
            ("work", config.context_params(work_sequences(stateful), flash_attn))]  # cold too


# the RAM tier's least cap: llama-server's --cache-ram defaults to 8 GiB, LlamaRAMCache to 2 GiB
RAM_TIER_FLOOR = 512 << 20


def ram_tier_cap(asked: int, whole_context: int, room: int | None) -> int:
    """The RAM tier's cap: ``asked`` when the user set one; else room for a prefix as long as
    the context (``whole_context`` bytes), so the longest prefix a run can have spills to RAM
    rather than to a file (a 32k prefix on the default model is 750 MB, over a fixed 512 MiB),
    at least RAM_TIER_FLOOR and at most half the memory the rest of the engine leaves
    (``room``; None: not known), so the cap alone never makes an engine refuse."""
    if asked:
        return asked
    want = max(RAM_TIER_FLOOR, whole_context)
    if room is None:
        return want
    return max(RAM_TIER_FLOOR, min(want, room // 2))


def plan_budget(model, config, flash_attn: bool | None, recurrent_state_bytes: int = 0,
                available: tuple[int, str] | None = None, use_extra_bufts: bool = True,
                facts: dict | None = None) -> MemoryBudget:
    """The budget of an engine with ``config`` on ``model`` (a NativeModel)."""
    facts = facts or model.facts()
    arch = facts.get("architecture", "")
    facts = {**facts, "n_ff": _int(model.meta(f"{arch}.feed_forward_length"))}
    per_token = kv_bytes_per_token(facts, config.type_k, config.type_v)
    sets = context_sets(config, flash_attn, stateful=recurrent_state_bytes > 0)
    for _name, p in sets:  # settings llama.cpp cannot take are refused as such, not as memory
        check_context_params(p)
    distinct = list(dict.fromkeys(p for _n, p in sets))  # one plan per distinct context
    planned = planned_compute(model, distinct, use_extra_bufts, config.n_gpu_layers)
    contexts = []
    for name, p in sets:
        cells = context_cells(p.n_ctx)
        compute = (planned[distinct.index(p)] if planned
                   else estimated_compute(facts, p, flash_attn))
        contexts.append(ContextMemory(name, cells, p.n_seq_max, per_token * cells,
                                      recurrent_state_bytes * p.n_seq_max, compute))
    avail, source = available if available is not None else memory_available()
    rest = MemoryBudget(facts["file_bytes"], tuple(contexts), 0, avail).total
    whole = per_token * context_cells(config.n_ctx) + recurrent_state_bytes
    ram = ram_tier_cap(config.cache.ram_bytes, whole, avail - rest if avail else None)
    return MemoryBudget(facts["file_bytes"], tuple(contexts), ram, avail,
                        source, "llama.cpp" if planned else "estimate")


def _int(s: str | None) -> int | None:
    try:
        return int(s) if s is not None else None
    except ValueError:  # a per-layer list, or garbage: the estimate takes 4 × the width
        return None


def check_budget(budget: MemoryBudget, model, config, flash_attn: bool | None,
                 use_extra_bufts: bool = True, facts: dict | None = None) -> None:
    """Raise MemoryBudgetError (one line) when the budget exceeds the memory available,
    naming the context size, or the KV types, that fit.

    The KV cells and the compute buffers grow with the context (the attention mask and, without
    flash attention, the scores span every cell): a second plan at half the cells gives the
    compute buffers' growth per cell, and the context size that fits follows from both.
    With layers offloaded to a GPU nothing is refused: weights, cells and buffers then live
    partly in the device's memory, which this budget of the machine's memory does not see."""
    if budget.fits or config.n_gpu_layers != 0:
        return
    facts = facts or model.facts()
    cells = budget.contexts[0].cells
    half = max(CELL_PAD, context_cells(cells // 2))
    smaller = plan_budget(model, replace(config, n_ctx=half), flash_attn,
                          budget.contexts[0].recurrent // max(budget.contexts[0].sequences, 1),
                          (budget.available, budget.available_source), use_extra_bufts, facts)
    compute_per_cell = (budget.compute - smaller.compute) / max(cells - half, 1)
    per_cell = budget.kv / cells + compute_per_cell if cells else 0  # recurrent: per sequence
    fixed = budget.total - per_cell * cells
    fixes = []
    fit = int((budget.available - fixed) // per_cell) // CELL_PAD * CELL_PAD if per_cell > 0 else 0
    if fit >= CELL_PAD:
        fixes.append(f"set the context size to {min(fit, cells - CELL_PAD):,} or less")
    if (config.type_k, config.type_v) != (QUANTIZED_KV, QUANTIZED_KV):
        q8 = kv_bytes_per_token(facts, QUANTIZED_KV, QUANTIZED_KV) * sum(
            c.cells for c in budget.contexts)
        if budget.total - sum(c.kv for c in budget.contexts) + q8 <= budget.available:
            fixes.append(f"set the KV cache types to {QUANTIZED_KV} (with flash attention on)")
    if budget.tiers_cap and budget.total - budget.tiers_cap <= budget.available:
        fixes.append("lower the RAM tier cap")
    what = " or ".join(fixes) if fixes else "load a smaller model or free memory"
    raise MemoryBudgetError(
        f"this model at a context of {config.n_ctx:,} needs {size_text(budget.total)} "
        f"({budget.parts_text()}) but {size_text(budget.available)} is available; {what}")
