"""What a warm run takes from the engine, and nothing else: the radix cache, the model, the
run's slot, and the node of the prefix it reuses (primed for a template, or adopted from a
saved state). The warm path (warm_runs.py) and compose's modules (module_compose.py) receive
these beside a typed request, never the engine itself."""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable

from ..cache.radix_cache import RadixCache
from ..cache.radix_tree import RadixNode
from ..llama.model_traits import ModelTraits
from ..llama.native import NativeModel
from ..slot.run_slot import Slot
from ..states.prefix_state import PrefixState


@dataclass(frozen=True)
class RunParts:
    cache: RadixCache
    model: NativeModel
    # the run's slot, with room for ``cells`` more cells once the nodes in ``promote`` are
    # resident: slot(cells, promote=())
    slot: Callable[..., AbstractContextManager[Slot]]
    # the template's static prefix node, evaluated if needed: prime_node(template, task, resident)
    prime_node: Callable[..., RadixNode]
    adopt: Callable[[PrefixState], RadixNode]  # a saved state, checked and cached as a node
    traits: ModelTraits  # what the model's architecture allows (compose shifts positions)
    name: str  # the model's name, for messages ("" when unknown)

    @classmethod
    def of(cls, engine) -> "RunParts":
        """The parts of a loaded engine (kv_engine.Engine)."""
        return cls(engine.cache, engine.model, engine.slot, engine.prime_node, engine.adopt,
                   engine.info.traits, engine.info.name)
