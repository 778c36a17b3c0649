"""The engine's settings (``EngineConfig``) and what it reports about the model it loaded
(``ModelInfo``): plain values, shared by the engine, the session, the CLI and the window."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, is_dataclass, replace

from .cache.cache_tiers import CacheLimits
from .llama.crash_probe import CpuKernels
from .llama.kernel_choice import KernelChoice
from .llama.memory_budget import MemoryBudget
from .llama.model_traits import ModelTraits
from .llama.ggml_types import kv_bytes_per_token
from .llama.llama_backend import cpu_backend
from .llama.native import ContextParams, gpu_offload_supported
from .slot.run_slot import runs_forked

# sequences of a hybrid or recurrent model's cache context (EngineConfig.for_model): the user's,
# the cache's scratch and holding ones, and a few resident nodes
STATEFUL_SEQ_MAX = 8


_CTX = ContextParams  # the context settings' defaults are defined once, there


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings: the CLI's shared options, the window's model panel and a project
    file's "engine" settings all make one of these."""
    model_path: str | None = None  # None: the default model
    n_ctx: int = _CTX.n_ctx
    n_batch: int = _CTX.n_batch
    n_threads: int = _CTX.n_threads  # batch threads (llama.cpp's -tb); 0: auto (thread_fit.py)
    # generation threads (llama.cpp's -t); 0: as the batch threads, held for a run, but 1 on
    # sliding-window models (for_model; ContextParams says why)
    n_threads_gen: int = _CTX.n_threads_gen
    type_k: str = _CTX.type_k
    type_v: str = _CTX.type_v
    n_seq_max: int = 64  # sequence 0 is the user's, the radix cache uses the rest
    cache: CacheLimits = CacheLimits()
    kv_debug_log: bool = True  # LLAMA_KV_CACHE_DEBUG=3: the cell map behind the KV view
    n_gpu_layers: int = 0  # layers offloaded to a GPU (llama.cpp's -ngl); -1: all of them
    # flash attention: "auto" measures which kernel is faster here (kernel_choice.py); the
    # default can be set with KVPRIMER_FLASH_ATTN (as llama.cpp's tools take LLAMA_ARG_FLASH_ATTN)
    flash_attn: str = field(default_factory=lambda: os.environ.get("KVPRIMER_FLASH_ATTN", "auto"))
    remeasure_kernels: bool = False  # measure again even when a measurement is cached
    n_ubatch: int = _CTX.n_ubatch  # micro-batch (llama.cpp's -ub); 0: the batch size

    @classmethod
    def from_stored(cls, d) -> "EngineConfig | None":
        """The settings a project file stored; fields this version does not know are left out."""
        if not isinstance(d, dict):
            return None
        defaults, kw = cls(), {}
        for f in fields(cls):
            if f.name in d:
                v, default = d[f.name], getattr(defaults, f.name)
                if is_dataclass(default) and isinstance(v, dict):  # nested settings, as a dict
                    names = {g.name for g in fields(default)}
                    v = replace(default, **{k: x for k, x in v.items() if k in names})
                kw[f.name] = v
        try:
            return cls(**kw)
        except (TypeError, ValueError):
            return None

    def for_model(self, traits) -> "EngineConfig":
        """These settings for a model with these traits (model_traits.py): llama.cpp keeps a
        recurrent state for every sequence a context has room for, whether it holds tokens or
        not (tens of MB each on a real hybrid), so a stateful model's cache context gets at most
        STATEFUL_SEQ_MAX sequences; its RAM and file tiers keep the nodes that find none.
        A model whose runs fork in the cache's context (a sliding-window model: run_slot.py)
        generates in the cache's shared cells, where a split over several threads is not the
        cold run's: the default (0) gives it one thread."""
        config = self
        if (traits.recurrent or traits.hybrid) and self.n_seq_max > STATEFUL_SEQ_MAX:
            config = replace(config, n_seq_max=STATEFUL_SEQ_MAX)
        if runs_forked(traits) and self.n_threads_gen == 0:
            config = replace(config, n_threads_gen=1)
        return config

    def context_params(self, n_seq_max: int, flash_attn: bool | None = None) -> ContextParams:
        """These settings as a context's, for a context of ``n_seq_max`` sequences."""
        return ContextParams(self.n_ctx, self.n_batch, self.n_threads, self.type_k, self.type_v,
                             n_seq_max, self.n_threads_gen, flash_attn, self.n_ubatch)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    architecture: str
    description: str
    sha256: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    n_ctx_train: int
    n_vocab: int
    n_params: int
    file_bytes: int
    n_ctx: int
    n_batch: int
    n_seq_max: int
    type_k: str
    type_v: str
    kv_bytes_per_token: int
    traits: ModelTraits  # what the architecture means for caching
    gpu_offload: bool = False  # this llama.cpp build can offload layers to a GPU
    kernels: KernelChoice | None = None  # the attention kernel, and why
    cpu_kernels: CpuKernels | None = None  # AMX / repacked weights, and why (cpu_kernels.py)
    n_ubatch: int = 0  # the micro-batch llama.cpp runs
    cpu_backend: str = ""  # the CPU instruction-set level llama.cpp loaded (app/cpu_backends.py)
    batch_threads: str = ""  # how prompt batches get their threads (thread_fit.py)
    # what the engine allocates (model, each context's KV and compute, the RAM tier's cap)
    # and the memory available when it started (memory_budget.py)
    memory: MemoryBudget | None = None

    def as_dict(self) -> dict:
        return {**self.__dict__, "traits": self.traits.as_dict(),
                "memory": self.memory.as_dict() if self.memory else None,
                "kernels": self.kernels.as_dict() if self.kernels else None,
                "cpu_kernels": self.cpu_kernels.as_dict() if self.cpu_kernels else None}


def model_info(model, ctx, config: EngineConfig, path, sha256: str, traits: ModelTraits,
               kernels: KernelChoice, cpu_kernels: CpuKernels,
               memory: MemoryBudget | None = None) -> ModelInfo:
    """What an engine reports about the model it loaded and the context it opened."""
    facts = model.facts()
    return ModelInfo(
        path=str(path), sha256=sha256, n_ctx=ctx.n_ctx, kernels=kernels, cpu_kernels=cpu_kernels,
        n_batch=config.n_batch, n_ubatch=ctx.n_ubatch, n_seq_max=config.n_seq_max,
        type_k=config.type_k, type_v=config.type_v,
        kv_bytes_per_token=kv_bytes_per_token(facts, config.type_k, config.type_v),
        traits=traits, gpu_offload=gpu_offload_supported(), cpu_backend=cpu_backend().describe(),
        batch_threads=ctx.thread_reading().describe(), memory=memory,
        **{k: facts[k] for k in ("name", "architecture", "description", "n_layer", "n_head",
                                 "n_head_kv", "n_embd", "n_ctx_train", "n_vocab", "n_params",
                                 "file_bytes")})
