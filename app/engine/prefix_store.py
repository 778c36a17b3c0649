"""An in-memory store of prefix states: longest-prefix lookup through a token trie, a byte cap
that is enforced on every insert, and least-recently-used eviction.

Lookup walks the query's tokens down the trie once (O(len(query))), unlike llama-cpp-python's
LlamaRAMCache, which compares the query with every key.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator

from .errors import StoreError
from .prefix_state import PrefixState


@dataclass
class _Node:
    children: dict[int, "_Node"] = field(default_factory=dict)
    key: tuple[int, ...] | None = None  # set when an entry ends here
    below: int = 0  # entries ending in this node's subtree, itself included


@dataclass(frozen=True)
class Match:
    state: PrefixState
    common_tokens: int  # tokens shared with the query, from the start


class PrefixStore:
    def __init__(self, max_bytes: int = 1 << 30):
        if max_bytes <= 0:
            raise StoreError("the store's byte cap must be positive")
        self.max_bytes = max_bytes
        self._root = _Node()
        self._lru: OrderedDict[tuple[int, ...], PrefixState] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __iter__(self) -> Iterator[PrefixState]:
        return iter(list(self._lru.values()))

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def put(self, state: PrefixState) -> list[PrefixState]:
        """Insert (or replace) a state; returns the states evicted to make room."""
        size = state.nbytes
        if size > self.max_bytes:
            raise StoreError(
                f"a state of {size:,} bytes does not fit the store's cap of {self.max_bytes:,} bytes; "
                "raise the cap or save the state to a file instead"
            )
        key = tuple(state.tokens)
        if key in self._lru:
            self.remove(key)
        evicted = []
        while self._bytes + size > self.max_bytes:
            oldest = next(iter(self._lru))
            evicted.append(self._lru[oldest])
            self.remove(oldest)
        self._insert_path(key)
        self._lru[key] = state
        self._bytes += size
        return evicted

    def remove(self, key: tuple[int, ...]) -> None:
        state = self._lru.pop(key)
        self._bytes -= state.nbytes
        path = [self._root]
        for t in key:
            path.append(path[-1].children[t])
        path[-1].key = None
        for node in path:
            node.below -= 1
        # prune branches that no longer lead to an entry
        for depth in range(len(key), 0, -1):
            if path[depth].below == 0:
                del path[depth - 1].children[key[depth - 1]]
            else:
                break

    def clear(self) -> None:
        self._root = _Node()
        self._lru.clear()
        self._bytes = 0

    def longest_prefix(self, query: list[int] | tuple[int, ...]) -> Match | None:
        """The entry sharing the most leading tokens with ``query`` (marked as just used)."""
        node, depth = self._root, 0
        best_node, best_depth = None, 0
        for t in query:
            child = node.children.get(t)
            if child is None or child.below == 0:
                break
            node, depth = child, depth + 1
            best_node, best_depth = node, depth
        if best_node is None:
            return None
        # Any entry below the deepest node reached shares exactly best_depth tokens;
        # prefer one ending right there, else descend to the nearest.
        n = best_node
        while n.key is None:
            n = next(c for c in n.children.values() if c.below > 0)
        self._lru.move_to_end(n.key)
        return Match(self._lru[n.key], best_depth)

    def _insert_path(self, key: tuple[int, ...]) -> None:
        node = self._root
        node.below += 1
        for t in key:
            node = node.children.setdefault(t, _Node())
            node.below += 1
        node.key = key
