"""Where each radix node's cells are, and how they move: the radix cache's three tiers.

A node that holds cells is in one tier: resident (a sequence of the main context holding the
node's tokens from position 0, its cells shared with the sequence it was forked from), ram (a
snapshot of the node's own cells, from ``ram_start`` to its end; the cells before come from an
ancestor when it is promoted) or file (the same bytes in a file). Each tier has a byte cap; the
least recently used unpinned node moves down (resident → RAM → file → dropped) when a cap or the
context's cells run out, and a hit in a lower tier is promoted back to resident.

Copies for the work context: a warm run copies a resident node's cells into the work context
(work_context.py), which takes a state of them (about 30 ms for the default model's 1,761-token
prefix here) and a state_set (about 9 ms). The state of the last copy of each node is kept, so
the next run of the same template pays only the state_set. Copies count against the RAM cap and
are the first thing it drops; a node's copy is forgotten when its cells are computed again.
Where the state is at hand anyway (a node stored from the work context, a saved state adopted),
it becomes the node's copy at once.

Hybrid and recurrent models: a node also carries the recurrent state at its depth, which moves
with its cells (recurrent_snapshots.py); a promoted node's sequence gets it back after its cells.

This class owns the nodes' placement fields (``seq``, ``ram``, ``file``, ``rs``, ``nbytes``)
and the busy marks; the tree's shape is the tree's (radix_tree.py), the free sequences are CacheSequences'.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError
from ..llama.memory_budget import RAM_TIER_FLOOR
from .engine_access import EngineAccess
from .cache_sequences import CacheSequences
from .cell_compaction import relayout
from .radix_tree import RadixNode, RadixTree
from .recurrent_snapshots import RecurrentSnapshots, read_node_file

APPROX_RESTORED = ("restored from a snapshot on a sliding-window model: approximate in general "
                   "(llama.cpp may put window cells back out of place, upstream issue 25295)")


@dataclass(frozen=True)
class CacheLimits:
    resident_bytes: int = 0  # 0: three quarters of the context's cells
    # 0: room for a prefix as long as the context, within the memory left (memory_budget.py
    # resolves it before the cache opens)
    ram_bytes: int = 0
    file_bytes: int = 2 << 30
    folder: str | None = None  # None: a temporary folder, removed on close


@dataclass(frozen=True)
class TierUsage:
    name: str
    used_bytes: int  # everything the tier holds against its cap, kept copies included
    cap_bytes: int
    nodes: int
    # the ram tier also keeps the state of each node's last copy into the work context: bytes
    # that belong to no node of this tier (a resident node's copy), so they are named apart
    kept_copies: int = 0
    kept_bytes: int = 0


@dataclass
class _WorkCopy:
    p0: int
    p1: int
    data: bytes
    last_used: float


class CacheTiers(RecurrentSnapshots):
    def __init__(self, parts: EngineAccess, tree: RadixTree, sequences: CacheSequences,
                 limits: CacheLimits):
        super().__init__()
        self.parts = parts
        self.tree = tree
        self.sequences = sequences
        self.limits = limits
        self.windowed = parts.windowed
        self._busy: Counter[int] = Counter()  # node ids a running job relies on (nested uses count)
        self._copies: dict[int, _WorkCopy] = {}  # node id → the state of its last work copy
        self._own_folder = limits.folder is None
        self.folder = Path(limits.folder or tempfile.mkdtemp(prefix="kvprimer-cache-"))
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"cannot use {self.folder} for the cache's files ({e.strerror}); "
                             "choose another folder") from None

    # ---- caps
    @property
    def resident_cap(self) -> int:
        # by default three quarters of the cells, and a recurrent snapshot per sequence
        return self.limits.resident_bytes or (
            self.parts.kv_bytes_per_token * self.parts.ctx.n_ctx * 3 // 4
            + self._largest_rs * self.parts.n_seq_max)

    @property
    def ram_cap(self) -> int:
        # an engine hands the cache its resolved cap; 0 reaching here (a cache made by hand)
        # means the floor
        return self.limits.ram_bytes or RAM_TIER_FLOOR

    def tier_bytes(self, tier: str) -> int:
        if tier == "resident":  # shared cells move as ancestors come and go: count them now
            return sum(self.resident_bytes(n) + n.rs_bytes for n in self.tree if n.seq is not None)
        used = sum(n.nbytes for n in self.tree if n.tier == tier)
        return used + (self.copy_bytes() if tier == "ram" else 0)

    def copy_bytes(self) -> int:
        return sum(len(c.data) for c in self._copies.values())

    def usage(self) -> list[TierUsage]:
        caps = {"resident": self.resident_cap, "ram": self.ram_cap,
                "file": self.limits.file_bytes}
        kept = {"ram": (len(self._copies), self.copy_bytes())}
        return [TierUsage(t, self.tier_bytes(t), cap, sum(1 for n in self.tree if n.tier == t),
                          *kept.get(t, (0, 0)))
                for t, cap in caps.items()]

    # ---- the tree as the tiers see it
    @staticmethod
    def resident_ancestor(node: RadixNode) -> RadixNode | None:
        """The nearest ancestor with a sequence (whose cells ``node``'s sequence shares)."""
        a = node.parent
        while a is not None and a.seq is None:
            a = a.parent
        return a

    @staticmethod
    def holding_ancestor(node: RadixNode) -> RadixNode | None:
        """The nearest ancestor holding cells in some tier (None: the root)."""
        a = node.parent
        while a is not None and a.parent is not None and a.tier == "gone":
            a = a.parent
        return a if a is not None and a.parent is not None else None

    def resident_bytes(self, node: RadixNode) -> int:
        """Bytes a resident node adds: its tokens past its nearest resident ancestor (whose
        cells it shares)."""
        a = self.resident_ancestor(node)
        return (node.depth - (a.depth if a else 0)) * self.parts.kv_bytes_per_token

    @staticmethod
    def resident_below(node: RadixNode, usable=None) -> RadixNode | None:
        """A resident node in ``node``'s subtree (itself included), if any."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.seq is not None and (usable is None or usable(n)):
                return n
            stack.extend(n.children.values())
        return None

    @contextmanager
    def busy(self, *nodes: RadixNode | None):
        """While inside, eviction leaves these nodes where they are."""
        ids = [n.id for n in nodes if n is not None]
        self._busy.update(ids)
        try:
            yield
        finally:
            self._busy.subtract(ids)
            self._busy += Counter()  # drop the zero counts

    # ---- giving nodes cells
    def hold_resident(self, node: RadixNode, seq: int, approx: str) -> None:
        """``node`` now lives in ``seq`` (cells just computed or forked for it)."""
        self.forget_snapshot(node)
        self.forget_copy(node)
        node.seq = seq
        node.approx = approx
        node.nbytes = self.resident_bytes(node) + node.rs_bytes

    def hold_snapshot(self, node: RadixNode, data: bytes, start: int, approx: str) -> None:
        """``node`` (holding nothing) gets a RAM snapshot of its cells from position ``start``."""
        self.forget_copy(node)
        node.ram, node.ram_start, node.approx = data, start, approx
        node.nbytes = len(data) + node.rs_bytes

    def materialise(self, node: RadixNode) -> int:
        """The node's sequence, promoting it (and the ancestors it needs) from RAM or a file.
        The node stays resident until the caller's own ``busy`` ends (or the next eviction)."""
        if node.seq is not None:
            return node.seq
        if node.tier == "gone":
            raise CacheError("that cached prompt was evicted; run it again to cache it")
        data = node.ram if node.ram is not None else read_node_file(node.file)
        base = self._base(node)
        with self.busy(node, base):
            base_seq = None
            if node.ram_start > 0:
                if base is None:
                    raise CacheError("a cached prompt lost the prefix it was built on; run it again")
                base_seq = self.materialise(base)
            self.ensure_free_cells(node.depth - node.ram_start)
            seq = self.take_seq()
            if base_seq is not None:
                self.parts.seqs.fork(base.seq, seq, upto=node.ram_start)
            self.rs_from_file(node)  # the recurrent state comes back with the cells
            # cells, then the recurrent state at the node's depth: the sequence then holds
            # exactly the node's state (the cells' state carried a stale recurrent part)
            if not self.parts.seqs.add_cells(data, seq, self.sequences.scratch, node.tokens()) \
                    or (node.rs is not None
                        and not self.parts.seqs.set_recurrent(seq, node.rs)):
                self.sequences.put_back(seq)
                raise CacheError("llama.cpp refused a cached snapshot; clear the cache")
            self.forget_snapshot(node)
            node.seq = seq
            node.nbytes = self.resident_bytes(node) + node.rs_bytes
            node.last_used = time.monotonic()
            if self.windowed and not node.approx:
                node.approx = APPROX_RESTORED
            self.enforce()
        return node.seq

    def copy_of(self, node: RadixNode, p0: int, p1: int) -> bytes:
        """A state of the cells at positions p0..p1-1 of ``node``'s tokens, for the work
        context: the kept copy when the last one was of the same positions."""
        c = self._copies.get(node.id)
        if c is not None and (c.p0, c.p1) == (p0, p1):
            c.last_used = time.monotonic()  # a hit changes no tier's size: nothing to enforce
            return c.data
        whole = (node.ram_start, 0, node.depth) == (0, p0, p1)
        if whole and node.ram is not None:  # a snapshot of all its cells is that copy
            return node.ram
        if whole and node.file is not None:  # the same, from its file: read, not promoted
            data = read_node_file(node.file)
        else:
            data = self.parts.seqs.cells_of(self.materialise(node), p0, p1, self.sequences.scratch)
        self.keep_copy(node, p0, p1, data)
        return data

    def keep_copy(self, node: RadixNode, p0: int, p1: int, data: bytes) -> None:
        """``data`` (a state of the node's cells at p0..p1-1, in position order) is at hand
        already (the cells were just stored or adopted from it): keep it as the node's copy."""
        self._copies[node.id] = _WorkCopy(p0, p1, data, time.monotonic())
        self.enforce()

    def whole_copy(self, node: RadixNode, start: int = 0) -> bytes | None:
        """The kept copy of the node's cells from ``start`` to its end, if that is what is
        kept (attention-only models: the copy then holds the same cells, in position order,
        as a state of the node's sequence, whose recorded sequence id llama.cpp ignores)."""
        c = self._copies.get(node.id)
        if c is None or (c.p0, c.p1) != (start, node.depth) or self.parts.family != "attention":
            return None
        return c.data

    def forget_copy(self, node: RadixNode) -> None:
        self._copies.pop(node.id, None)

    # ---- sequences and eviction
    def take_seq(self) -> int:
        while (seq := self.sequences.pop()) is None:
            if not self._spill_one():
                raise CacheError("every sequence of the context holds a pinned or busy prompt; "
                                 "unpin some cached prompts or clear the cache")
        return seq

    def compact(self) -> bool:
        """Free the held cells; the live ones are laid out again in tree order when no run is
        using a working sequence (otherwise the held cells are simply freed)."""
        if not self.sequences.held_cells():
            return False
        if self.sequences.lent:
            self.sequences.drop_held()
        else:
            relayout(self)
        return True

    def lost_sequences(self, kept: int | None = None) -> None:
        """llama.cpp dropped every sequence but ``kept``: the nodes there lose their cells
        (their RAM and file snapshots stay usable while their base does)."""
        for n in self.tree:
            if n.seq is not None and n.seq != kept:
                self.sequences.forget(n.seq)
                n.seq = None
                if n.tier == "gone":
                    self.forget_rs(n)
                    n.nbytes = 0
                    self.forget_copy(n)
        self._prune()

    def ensure_free_cells(self, n: int) -> None:
        """Evict (and compact) until ``n`` more cells fit in the context."""
        seqs = self.sequences
        if seqs.holding is not None and not seqs.lent and self.parts.seqs.has_holes():
            relayout(self)  # cells freed in the middle (the user's sequence): put back in order
        room = self.parts.ctx.n_ctx - n
        while self.parts.seqs.used_cells() > room:
            if self.parts.seqs.used_cells(ignoring=seqs.holding) <= room:
                self.compact()
            elif not self._spill_one() and not self.compact():
                raise CacheError(
                    f"the context has no room for {n} more tokens and nothing left to evict; "
                    "raise the context size or unpin cached prompts")

    def enforce(self) -> None:
        while self.tier_bytes("resident") > self.resident_cap and self._spill_one():
            pass
        while self.tier_bytes("ram") > self.ram_cap:
            if self._copies:  # copies are only a shortcut: they go first
                oldest = min(self._copies, key=lambda k: self._copies[k].last_used)
                del self._copies[oldest]
                continue
            n = self._lru("ram")
            if n is None:
                break
            self.to_file(n)
        while self.tier_bytes("file") > self.limits.file_bytes:
            n = self._lru("file")
            if n is None:
                break
            self.drop(n)

    def _lru(self, tier: str) -> RadixNode | None:
        cands = [n for n in self.tree if n.tier == tier and not n.pinned and n.id not in self._busy]
        if tier == "resident":
            # a node whose descendants are resident frees no cells: leaves go first
            leaves = [n for n in cands if self._resident_below_children(n) is None]
            cands = leaves or cands
        return min(cands, key=lambda n: n.last_used, default=None)

    def _resident_below_children(self, node: RadixNode) -> RadixNode | None:
        for c in node.children.values():
            r = self.resident_below(c)
            if r is not None:
                return r
        return None

    def _spill_one(self) -> bool:
        n = self._lru("resident")
        if n is None:
            return False
        self.spill(n)
        return True

    # ---- moves down
    def spill(self, node: RadixNode) -> None:
        """Resident → RAM: keep the node's own cells, free its sequence. A kept copy of
        exactly those cells becomes the snapshot (RAM then holds them once, not twice: a
        snapshot of all of a node's cells serves ``copy_of`` too)."""
        anchor = self.holding_ancestor(node)
        start = anchor.depth if anchor is not None else 0
        data = self.whole_copy(node, start)
        if data is not None:
            self.forget_copy(node)
        else:
            data = self.parts.seqs.cells_of(node.seq, start, node.depth, self.sequences.scratch)
        self.sequences.release(node.seq)
        node.seq = None
        node.ram, node.ram_start, node.nbytes = data, start, len(data) + node.rs_bytes
        self.enforce()

    def to_file(self, node: RadixNode) -> None:
        path = self.folder / f"node-{node.id}.kvcells"
        path.write_bytes(node.ram)
        node.file, node.ram = str(path), None
        self.rs_to_file(node, self.folder)

    def forget_snapshot(self, node: RadixNode) -> None:
        """Drop the node's RAM and file snapshots (it is resident, or gone)."""
        node.ram = None
        if node.file:
            Path(node.file).unlink(missing_ok=True)
            node.file = None

    def drop(self, node: RadixNode) -> None:
        if node.seq is not None:
            self.sequences.release(node.seq)
            node.seq = None
        self.forget_snapshot(node)
        self.forget_copy(node)
        self.forget_rs(node)
        node.nbytes = 0
        if not node.children:
            self.tree.remove(node)
        self._prune()

    def drop_all(self) -> None:
        """Every node holds nothing, every sequence of the cache is free (the tree is kept)."""
        for n in self.tree:
            if n.seq is not None:
                self.sequences.put_back(n.seq)
            n.seq = None
            self.forget_snapshot(n)
            self.forget_rs(n)
        self._copies.clear()
        self.sequences.drop_held()

    def _prune(self) -> None:
        """Drop snapshots whose base is gone, and branching points that lead nowhere."""
        for n in list(self.tree):
            if n.parent is None:
                continue  # removed with an ancestor in this same pass
            if n.tier in ("ram", "file") and not self._restorable(n):
                self.forget_snapshot(n)
                self.forget_rs(n)
                n.nbytes = 0
            if n.tier == "gone" and not n.children and not n.pinned:
                self.forget_copy(n)
                self.tree.remove(n)

    def _base(self, node: RadixNode) -> RadixNode | None:
        """The ancestor a snapshot's cells go on top of: the nearest one holding cells, if it
        reaches the snapshot's first position."""
        a = self.holding_ancestor(node)
        return a if a is not None and a.depth >= node.ram_start else None

    def _restorable(self, node: RadixNode) -> bool:
        if node.ram_start == 0:
            return True
        base = self._base(node)
        return base is not None and (base.tier == "resident" or self._restorable(base))

    def close_folder(self) -> None:
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
