"""llama.cpp's sampler chain, through llama-cpp-python's ctypes bindings (native.py has the
model and the context)."""
from __future__ import annotations

import llama_cpp as L

from ..errors import ContextError


class NativeSampler:
    """llama.cpp's sampler chain: greedy, or top-p then temperature then a seeded draw."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if not self.ptr:  # pragma: no cover
            raise ContextError("llama.cpp could not create a sampler")
        if temperature <= 0:
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_greedy())
        else:
            if top_p < 1.0:
                L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_top_p(top_p, 1))
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_temp(temperature))
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx, i: int = -1) -> int:  # ctx: a NativeContext
        return int(L.llama_sampler_sample(self.ptr, ctx.ptr, i))

    def close(self) -> None:
        if self.ptr:
            L.llama_sampler_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> "NativeSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
