"""A slot: one object that owns a run's evaluation, as a llama-server slot owns its tokens,
cells and checkpoints.

A run brings the radix cache's hit into its slot (``bring``: the cache hands the cells over),
evaluates planned batches there (the batch policy plans them, batch_feed.py's loop feeds them),
steps generation (``step``), and gives the ends of its segments back to the cache as nodes
(``evaluate(..., nodes=...)`` then ``flush``). Nothing else touches the slot's cells.

Two slots stand behind this one interface:
- ``WorkSlot`` (work_slot.py): the work context, whose cells lie where a cold run puts them;
  every model without sliding-window layers runs there;
- ``ForkedSlot`` (forked_slot.py): a working sequence of the cache's own context, forked from a
  resident node; sliding-window models run there (their window cells do not survive a copy).
``runs_forked`` is the one place that decides which: the engine's slot accessors
(``Engine.runs_in_work_context``, ``Engine.slot``), its generation threads and its kernel choice
ask it; every other module asks the engine or takes the slot it opens.

A forked batch's rows, evaluated and generated together, run in its multi-sequence form,
``ForkedRows`` (forked_rows.py): k sequences forked from one node, fed in the decodes the batch
policy plans for them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..llama.batch_policy import BatchPolicy, chain_node_ends
from ..llama.model_traits import ModelTraits
from ..llama.native import NativeContext
from ..task_state import TaskState


def runs_forked(traits: ModelTraits) -> bool:
    """A model's runs evaluate in a sequence the cache lends (ForkedSlot), not in the work
    context (WorkSlot): a model with a sliding window, whose window cells do not survive a trim
    or a copy into another context (llama.cpp restores them approximately)."""
    return traits.n_swa > 0


@dataclass(frozen=True)
class NodeEnd:
    """A prefix of the run's tokens to give back to the cache as a node."""
    pos: int  # the node ends here: a batch end of the run's history
    label: str
    template_sha256: str = ""
    approx: str = ""


class Slot(ABC):
    windowed: bool  # a sliding-window model's slot: small batches, nodes forked as they end

    def __init__(self, cache: RadixCache, batching: BatchPolicy):
        self.cache, self.batching = cache, batching
        self._pending: list[tuple[list[int], NodeEnd]] = []  # nodes to store at ``flush``
        self._stored: list[RadixNode] = []  # nodes stored while evaluating, since ``flush``

    # ---- what the slot holds
    @property
    @abstractmethod
    def ctx(self) -> NativeContext:
        """The context its logits and thread counts are read from."""

    @property
    @abstractmethod
    def held(self) -> int:
        """Tokens the slot holds, from position 0."""

    @abstractmethod
    def history(self, end: int) -> list[int]:
        """The batch starts before ``end`` of the history that computed its cells: the cold
        run replays them."""

    # ---- bringing a cache hit in
    @abstractmethod
    def whole(self, hit: CacheHit) -> CacheHit:
        """The part of ``hit`` this slot reuses exactly (whole batches where that matters)."""

    @abstractmethod
    def bring(self, hit: CacheHit, tokens: list[int]) -> int:
        """Hold ``tokens[:hit.reused]`` from the cache's hit; returns the tokens copied."""

    @abstractmethod
    def place(self, src: int, p0: int, p1: int, at: int, tokens: list[int]) -> None:
        """Append the cells of the cache's sequence ``src`` at positions p0..p1-1, moved to
        start at position ``at`` (the slot's end): a composed module."""

    # ---- composing modules shifted once per row
    @property
    def can_hold(self) -> bool:
        """Composed modules' cells can wait at their places in the row (``hold``) until the
        sequence reaches them (``take_held``); otherwise each part is placed in its turn."""
        return False

    def hold(self, src: int, p0: int, p1: int, at: int) -> None:
        """Keep the cells of the cache's sequence ``src`` at positions p0..p1-1, moved to start
        at position ``at``, aside until the sequence reaches them."""
        raise NotImplementedError

    def take_held(self, tokens: list[int]) -> None:
        """Append the held cells of the next ``len(tokens)`` positions."""
        raise NotImplementedError

    def drop_held(self) -> None:
        """Free what is held and was not taken."""

    # ---- planning and evaluating
    @abstractmethod
    def marks(self, segment_starts: Sequence[int], reused: int, end: int,
              storing: bool, reusable: int | None = None) -> list[int]:
        """Where the run's batches also start (batch_policy.py: chain or fork marks;
        ``reusable``: the most another row of the job could reuse of the prompt, None when the
        job's rows are not known)."""

    def node_ends(self, segment_ends: Sequence[int], reused: int, end: int,
                  marks: Sequence[int]) -> list[int]:
        """The segment ends the run stores as nodes: where its batches end (batch_policy.py)."""
        return chain_node_ends(segment_ends, reused, end, marks, grouping_exact=False)

    def starts(self, end: int, marks: Sequence[int] = ()) -> list[int]:
        """The batch starts to evaluate up to ``end`` after what the slot holds: a warm run's,
        a module's or a recomputed part's (batch_policy.py)."""
        return self.batching.warm(self.held, end, marks, windowed=self.windowed)

    @abstractmethod
    def prime_starts(self, end: int) -> list[int]:
        """The batch starts to prime a static prefix up to ``end``."""

    @abstractmethod
    def evaluate(self, tokens: list[int], starts: list[int], task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True,
                 nodes: Sequence[NodeEnd] = ()) -> np.ndarray | None:
        """Append ``tokens`` in batches starting at ``starts``; return the last logits (or
        None). ``nodes`` end inside or at the end of them: they go back to the cache at
        ``flush`` (or as soon as the sequence ends there, where a later fork would lose cells)."""

    @abstractmethod
    def step(self, token: int) -> None:
        """One generated token."""

    # ---- giving cells back to the cache
    def flush(self) -> list[RadixNode]:
        """Store the nodes ``evaluate`` was given that are not in the cache yet (after the
        first token: the bookkeeping stays out of its time); returns every node given back
        since the last flush, in order."""
        pending, self._pending = self._pending, []
        stored, self._stored = self._stored, []
        return stored + [self._store(tokens, end) for tokens, end in pending]

    @abstractmethod
    def _store(self, tokens: list[int], end: NodeEnd) -> RadixNode:
        """Give ``tokens`` (a prefix of what the slot holds) to the cache as a node."""
