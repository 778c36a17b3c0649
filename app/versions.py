"""Versions of KV Primer and of the llama.cpp it runs on: one home for the CLI and the window."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import __version__


@dataclass(frozen=True)
class Versions:
    kvprimer: str
    llama_cpp_python: str
    llama_cpp_build: str
    system: str


@functools.lru_cache(maxsize=1)
def versions() -> Versions:
    from .engine.llama.native import versions as native_versions  # loads llama.cpp: only when asked

    v = native_versions()
    return Versions(__version__, v["llama_cpp_python"], v["llama_cpp_build"], v["system"])


def version_text() -> str:
    v = versions()
    return (f"kvprimer {v.kvprimer}\nllama-cpp-python {v.llama_cpp_python}\n"
            f"llama.cpp {v.llama_cpp_build}")
