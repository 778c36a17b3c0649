"""The radix cache: what was primed or run stays in the KV cells, found again by its tokens.

Every node of the radix tree (radix_tree.py) that holds cells lives in one of three tiers:
- resident: a sequence of the main context holding exactly the node's tokens from position 0,
  its cells shared with the sequence it was forked from (llama.cpp's seq_cp with a unified KV
  cache copies nothing). A node's sequence is *pristine*: it was forked at the node's end and
  never evaluated past it, so on sliding-window models its window cells are all there;
- ram: a snapshot of the node's own cells (positions ``ram_start`` to its end), small because
  the cells before ``ram_start`` come from an ancestor when the node is promoted again;
- file: the same bytes in a file of this cache's folder.

Each tier has a byte cap; the least recently used unpinned node moves down a tier (resident →
RAM → file → dropped) when a cap or the context's cells run out, and a hit in a lower tier is
promoted back to resident. A run forks a node into a working sequence instead of restoring a
snapshot and trimming it, so nothing is copied and sliding-window cells stay in place.

On hybrid and recurrent models (``stateful``) a run can resume only where a node keeps the
recurrent state of its depth (cache_tiers.py): the nodes a run stores from the work context
(the static prefix, chain segment ends) and saved states adopted. A lookup returns the deepest
such node, never a part of one.
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass

from ..errors import CacheError
from ..states.seq_payload import in_position_order
from .engine_access import EngineAccess
from .cache_sequences import CacheSequences
from .cache_tiers import APPROX_RESTORED, CacheLimits, CacheTiers, TierUsage
from .radix_tree import RadixNode, RadixTree
from .state_adoption import adopt_state, over_resident_cap
from ..llama.batch_policy import node_reuse

__all__ = ["APPROX_PART", "APPROX_RESTORED", "CacheHit", "CacheLimits", "CacheNodeInfo",
           "RadixCache", "TierUsage"]

APPROX_PART = "forked part of a longer sequence: sliding-window cells past its end are lost"


def one_change(method):
    """The cells change once, when the operation is over: a view taken while it runs (the KV
    map, the Cache panel) never shows nodes that say they are resident over cleared cells. And
    views are told when it is over even if no cell changed: its nodes, hits or kept copies may
    have (a run that reuses a resident prefix changes no cell of the cache's context)."""
    @functools.wraps(method)
    def held(self, *args, **kw):
        with self.parts.ctx.held_changes(told=True):
            return method(self, *args, **kw)
    return held


@dataclass(frozen=True)
class CacheNodeInfo:
    id: int
    parent_id: int | None
    label: str
    text: str  # the node's own tokens as text (shortened)
    tokens: int  # from the start of the prompt to the node's end
    own_tokens: int
    tier: str
    nbytes: int
    hits: int
    last_used: float
    pinned: bool
    approx: str
    recurrent_bytes: int = 0  # the recurrent state kept at its depth (hybrid, recurrent models)


@dataclass(frozen=True)
class CacheHit:
    node: RadixNode | None  # None: nothing to reuse
    reused: int  # tokens the run takes from the cache
    sources: tuple[tuple[str, int], ...]  # (what, tokens) along the path, e.g. ("static prefix", 1761)
    tier: str  # where the reused node was found: "resident", "ram", "file" or ""
    approx: str  # why reusing it may not be exact ("" when it is)

    def head_cuts(self) -> list[int]:
        """Batch starts of the reused part's history (the cold run replays them)."""
        return [c for c in self.node.all_cuts() if c < self.reused] if self.node else []


class RadixCache:
    """Lookup, insertion and the user's actions over the tree; where cells are and how they
    move is the tiers' (cache_tiers.py), which sequences are free the sequences' own."""

    def __init__(self, parts: EngineAccess, limits: CacheLimits = CacheLimits()):
        self.parts = parts
        self.windowed = parts.windowed
        self.stateful = parts.family != "attention"
        self.tree = RadixTree()
        self.sequences = CacheSequences(parts)
        self.tiers = CacheTiers(parts, self.tree, self.sequences, limits)
        self._generation = itertools.count(1)
        self._last_generation = 0
        # node id, own tokens → its text: views read nodes() many times a second during jobs,
        # and an edge's text only changes when a split or merge changes its length
        self._previews: dict[tuple[int, int], str] = {}

    # ---- what jobs use while they run (the tiers' and sequences' own operations)
    @property
    def scratch(self) -> int:
        return self.sequences.scratch

    @property
    def holding(self) -> int | None:
        return self.sequences.holding

    def reserved_sequences(self) -> tuple[int, ...]:
        """The sequences never lent to a job nor given to a node: the user's 0, scratch and
        holding (when there is one)."""
        return tuple(s for s in (0, self.holding, self.scratch) if s is not None)

    @property
    def folder(self):
        return self.tiers.folder

    def busy(self, *nodes: RadixNode | None):
        return self.tiers.busy(*nodes)

    @one_change
    def materialise(self, node: RadixNode) -> int:
        return self.tiers.materialise(node)

    @one_change
    def ensure_free_cells(self, n: int) -> None:
        self.tiers.ensure_free_cells(n)

    @one_change
    def enforce(self) -> None:
        self.tiers.enforce()

    @one_change
    def lost_sequences(self, kept: int | None = None) -> None:
        self.tiers.lost_sequences(kept)

    def tier_usage(self) -> list[TierUsage]:
        """Each tier's nodes, bytes and cap."""
        return self.tiers.usage()

    @one_change
    def take_work_seq(self) -> int:
        return self.sequences.lend(self.tiers.take_seq())

    @one_change
    def give_back(self, seq: int) -> None:
        """A working sequence is done: its own cells (the newest) are freed."""
        self.sequences.put_back(seq)

    def check_user_sequence(self, seq: int) -> None:
        """Raise unless ``seq`` is the user's own (sequence 0): every other one is the cache's,
        and changing it behind the cache's back would corrupt what later runs reuse."""
        if seq == 0:
            return
        node = next((n for n in self.tree if n.seq == seq), None)
        what = f"the radix cache's '{node.label}'" if node else "the radix cache"
        raise CacheError(f"sequence {seq} belongs to {what}; fork it into sequence 0 and work "
                         "on that")

    def nodes(self) -> list[CacheNodeInfo]:
        return [CacheNodeInfo(n.id, n.parent.id if n.parent and n.parent.parent else None,
                              n.label, self._preview(n), n.depth, n.own_tokens, n.tier, n.nbytes,
                              n.hits, n.last_used, n.pinned, n.approx, n.rs_bytes)
                for n in self.tree]

    def _preview(self, n: RadixNode, limit: int = 60) -> str:
        key = (n.id, n.own_tokens)
        text = self._previews.get(key)
        if text is None:
            if len(self._previews) > 2 * len(self.tree) + 256:
                self._previews.clear()  # nodes come and go: forget the gone ones now and then
            text = self._previews[key] = self._text(n, limit)
        return text

    def _text(self, n: RadixNode, limit: int) -> str:
        raw = b"".join(self.parts.model.piece(t, special=True) for t in n.edge[:limit])
        text = raw.decode("utf-8", "replace").replace("\n", "⏎")
        return text if n.own_tokens <= limit else text + "…"

    # ---- lookup
    @property
    def generation(self) -> int:
        """Increases with every node added: ``lookup(before=...)`` ignores later nodes."""
        return self._last_generation

    def lookup(self, tokens: list[int], limit: int | None = None,
               before: int | None = None) -> CacheHit:
        """The deepest reusable match for ``tokens[:limit]`` among nodes added before
        generation ``before`` (all when None)."""
        q = tokens if limit is None else tokens[:limit]
        m = self.tree.match(q)

        def usable(n: RadixNode) -> bool:
            return (n.tier != "gone" and (before is None or n.created < before)
                    and (n.has_rs or not self.stateful))

        node = m.node
        while node.parent is not None and not usable(node):
            node = node.parent
        best, reused = (node if node.parent is not None else None), node.depth
        # part of a resident node: fork it up to the match (exact unless window cells are lost);
        # a recurrent state cannot be cut back to a part
        if m.matched > reused and not self.stateful:
            below = self.tiers.resident_below(m.child or m.node, usable)
            if below is not None and not (self.windowed and below.depth > m.matched):
                best, reused = below, m.matched
        if best is None:
            return CacheHit(None, 0, (), "", "")
        approx = best.approx or (APPROX_PART if self.windowed and best.depth > reused else "")
        return CacheHit(best, reused, self._sources(best, reused), best.tier, approx)

    def _sources(self, node: RadixNode, reused: int) -> tuple[tuple[str, int], ...]:
        out = []
        for n in node.path():
            take = min(n.depth, reused) - n.start
            if take > 0:
                name = n.label or "cached prompt"
                out.append((name if n.depth <= reused else f"{name} (part)", take))
        return tuple(out)

    # ---- using a hit
    def whole_batches(self, hit: CacheHit) -> CacheHit:
        """The hit cut back to the last batch end of its node's history: cells are reused in
        whole batches, so a cold run replaying those batches computes the same bits (any
        position does on a grouping-exact kernel: the hit as it is)."""
        if hit.node is None:
            return hit
        n = node_reuse(hit.node.all_cuts(), hit.node.depth, hit.reused,
                       self.parts.grouping_exact())
        if n == hit.reused:
            return hit
        if n == 0:
            return CacheHit(None, 0, (), "", "")
        return CacheHit(hit.node, n, self._sources(hit.node, n), hit.tier, hit.approx)

    @one_change
    def hand_out(self, hit: CacheHit, take):
        """Hand a slot the hit's cells (``hit.node`` is not None): ``take(cuts, fetch,
        snapshot)`` gets the batch starts of the hit's history before ``hit.reused``,
        ``fetch(p0, p1)`` (a state of those positions' cells) and ``snapshot()`` (the node's
        recurrent state); returns what ``take`` returns."""
        with self.busy(hit.node):
            got = take([c for c in hit.node.all_cuts() if c < hit.reused],
                       lambda p0, p1: self.tiers.copy_of(hit.node, p0, p1),
                       lambda: self.tiers.rs_of(hit.node))
            self.touch(hit.node)
        return got

    @one_change
    def store(self, tokens: list[int], label: str, template_sha256: str = "", approx: str = "",
              *, cuts, cells, recurrent: bytes | None = None) -> RadixNode:
        """Cache ``tokens`` (ending at a batch end of the history that computed them, whose
        batch starts are ``cuts``) as a resident node (in the RAM tier when its own cells alone
        are over the resident cap), its own cells taken back from a slot:
        ``cells(p0, p1)`` gives a state of positions p0..p1-1; ``recurrent``: the recurrent
        state at its end (hybrid and recurrent models)."""
        rs = recurrent if self.stateful else None
        if self.stateful and rs is None:
            raise CacheError("no recurrent state was kept at the end of that prompt; run it again")
        node = self._insert(tokens, label, template_sha256, cuts)
        with self.busy(node):
            if node.tier == "gone":
                anchor = self.tiers.holding_ancestor(node)
                start = anchor.depth if anchor is not None else 0
                data = cells(start, node.depth)
                self.tiers.hold_snapshot(node, data, start, approx)
                if rs is not None:
                    self.tiers.hold_rs(node, rs)
                if not self.too_big_to_reside(node.depth - start):
                    self.materialise(node)
                    self.tiers.keep_copy(node, start, node.depth, data)
                # else it would spill straight back: its snapshot is the RAM tier's, and its
                # cells never take the cache's context (which a lazy one then never opens)
            elif rs is not None and not node.has_rs:
                self.tiers.hold_rs(node, rs)
            self.touch(node)
            self.enforce()
        return node

    def too_big_to_reside(self, cells: int) -> bool:
        """Are ``cells`` of a node's own alone over the resident cap? Such a node lives in the
        RAM tier: placed in the cache's context it would spill straight back. (A stateful
        model's node resides: its recurrent state comes back with its sequence.)"""
        return not self.stateful and over_resident_cap(self, cells)

    @one_change
    def fork_into(self, hit: CacheHit, work: int) -> None:
        """Make ``work`` hold the hit's first ``reused`` tokens (promoting the node if needed)."""
        self.parts.seqs.clear(work)
        if hit.node is None:
            return
        with self.busy(hit.node):
            seq = self.materialise(hit.node)
            self.parts.seqs.fork(seq, work, upto=hit.reused)
            self.touch(hit.node)

    @one_change
    def touch(self, node: RadixNode) -> None:
        node.hits += 1
        node.last_used = time.monotonic()

    # ---- adding nodes
    @one_change
    def add(self, work: int, label: str, starts: list[int], template_sha256: str = "",
            approx: str = "", upto: int | None = None) -> RadixNode:
        """Cache what ``work`` holds now (its first ``upto`` tokens) as a node.

        A node must be pristine: on a sliding-window model fork at ``upto`` = None while the
        sequence ends there (a later fork up to a position loses the window cells past it)."""
        node = self._insert(list(self.parts.seq_tokens[work][:upto]), label, template_sha256, starts)
        with self.busy(node):  # the caps hold after every addition; the new node stays
            if node.seq is None:
                seq = self.tiers.take_seq()
                self.parts.seqs.fork(work, seq, upto=upto)
                self.tiers.hold_resident(node, seq, approx)
            self.touch(node)
            self.enforce()
        return node

    def _insert(self, tokens: list[int], label: str, template_sha256: str,
                starts: list[int]) -> RadixNode:
        """The tree's node for ``tokens``, labelled and given its history's batch starts when
        it is new or holds nothing yet."""
        node, created = self.tree.insert(tokens)
        if created or node.tier == "gone":
            self._last_generation = node.created = next(self._generation)
        if created or not node.label:
            node.label = label
            node.template_sha256 = template_sha256
        if created or node.tier == "gone" or not node.cuts:
            node.cuts = tuple(c for c in starts if node.start <= c < node.depth)
        return node

    def state_cuts(self, state) -> list[int]:
        """The batch starts a saved state's cells were computed with (batch_policy.py)."""
        return self.parts.batching.saved_state(state.n_tokens)

    @one_change
    def adopt(self, state, label: str) -> RadixNode:
        """A saved state as a node (state_adoption.py). The state was checked against this
        model (``Engine.adopt`` checks it, then calls this)."""
        return adopt_state(self, state, label)

    # ---- user actions
    def find(self, node_id: int) -> RadixNode:
        for n in self.tree:
            if n.id == node_id:
                return n
        raise CacheError(f"no cached prompt has id {node_id}; refresh the list of cached prompts")

    def pin(self, node_id: int, pinned: bool = True) -> None:
        self.find(node_id).pinned = pinned

    @one_change
    def evict(self, node_id: int) -> None:
        """Move a node one tier down (a file node is dropped)."""
        n = self.find(node_id)
        if n.pinned:
            raise CacheError("that prompt is pinned; unpin it first")
        p = self.tiers
        {"resident": p.spill, "ram": p.to_file, "file": p.drop, "gone": p.drop}[n.tier](n)
        self.enforce()

    @one_change
    def clear(self) -> None:
        self.tiers.drop_all()
        self.tree.clear()

    @one_change
    def retain(self, keep: RadixNode) -> None:
        """Drop every node but ``keep`` (and the path to it), which stays resident."""
        self.materialise(keep)
        path = set(id(n) for n in keep.path())
        for n in sorted(self.tree, key=lambda n: -n.depth):
            if id(n) not in path and n.parent is not None:
                n.pinned = False
                self.tiers.drop(n)
        self.tiers.compact()

    def close(self) -> None:
        self.clear()
        self.tiers.close_folder()
