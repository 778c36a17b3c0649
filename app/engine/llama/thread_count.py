"""How many threads llama.cpp's own tools use when not told: one per physical core.

llama.cpp has two thread settings: ``n_threads`` runs one-token decodes (generation, ``-t``)
and ``n_threads_batch`` runs ubatches of two tokens or more (prompts, ``-tb``); llama-context.cpp
picks one per ubatch by its token count. The library's ``llama_context_default_params`` sets both
to GGML_DEFAULT_N_THREADS (4, marked "TODO: better default"); its tools (llama-cli,
llama-server: common/common.cpp) set ``-t`` to the number of physical cores and ``-tb`` to
``-t``. A setting of 0 in KV Primer means the tools' default, computed here.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

_TOPOLOGY = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity; empty where the system does
    not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def logical_cpus() -> int:
    """How many logical CPUs this process may run on."""
    return len(usable_cpus()) or os.cpu_count() or 1


@lru_cache(maxsize=1)
def llama_default_threads() -> int:
    """One thread per physical core this process may run on (hyper-threads share a core's
    arithmetic units: llama.cpp counts cores, not logical CPUs); the logical CPU count where
    the topology is not readable."""
    cpus = usable_cpus()
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(_TOPOLOGY.format(cpu)).read_text().strip())
        except OSError:
            return len(cpus) or os.cpu_count() or 1
    return len(cores) or os.cpu_count() or 1
