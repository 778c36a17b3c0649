"""A radix tree over token ids: which cached prompt shares the most leading tokens with a new one.

Each node stands for the token sequence on the path from the root to it; an edge holds the
tokens a node adds to its parent. Lookup walks the query once (O(len(query))), splitting no
edge; insertion splits an edge where a new prompt leaves it. The tree knows nothing of where a
node's KV cells live: the cache's tiers (cache_tiers.py) set their ``seq``, ``ram`` and ``file``
fields.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator

_ids = itertools.count(1)


@dataclass(eq=False)
class RadixNode:
    edge: tuple[int, ...]
    parent: "RadixNode | None" = None
    children: dict[int, "RadixNode"] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))
    depth: int = 0  # tokens from the root to this node's end
    label: str = ""  # what the node holds, for people: "static prefix", "<c1> = …"
    # positions where a decode batch started while these tokens were evaluated (absolute,
    # within this node's own range): the cold run replays them for an exact comparison
    cuts: tuple[int, ...] = ()
    # where the node's own cells are: a resident sequence, a RAM snapshot, a file
    seq: int | None = None
    ram: bytes | None = None
    file: str | None = None
    ram_start: int = 0  # first position of the cells a RAM or file snapshot holds
    # a hybrid or recurrent model's recurrent state at this node's depth (llama.cpp's partial
    # state): in memory while the node is resident or in RAM, in ``rs_file`` with its cells
    rs: bytes | None = None
    rs_file: str | None = None
    rs_bytes: int = 0  # its size wherever it is (0: none)
    approx: str = ""  # why this node's cells may differ from evaluating its tokens, if they may
    created: float = 0.0
    nbytes: int = 0  # bytes of this node's own cells (depth - parent.depth tokens)
    hits: int = 0
    last_used: float = 0.0
    pinned: bool = False
    template_sha256: str = ""

    @property
    def start(self) -> int:
        return self.parent.depth if self.parent else 0

    @property
    def own_tokens(self) -> int:
        return len(self.edge)

    def tokens(self) -> list[int]:
        """All tokens from the root to this node's end."""
        parts = []
        n: RadixNode | None = self
        while n is not None:
            parts.append(n.edge)
            n = n.parent
        return [t for part in reversed(parts) for t in part]

    def path(self) -> list["RadixNode"]:
        """Ancestors from the first under the root down to this node."""
        out = []
        n: RadixNode | None = self
        while n is not None and n.parent is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def all_cuts(self) -> list[int]:
        return sorted({c for n in self.path() for c in n.cuts})

    @property
    def has_rs(self) -> bool:
        return self.rs is not None or self.rs_file is not None

    @property
    def tier(self) -> str:
        if self.seq is not None:
            return "resident"
        if self.ram is not None:
            return "ram"
        if self.file is not None:
            return "file"
        return "gone"


@dataclass(frozen=True)
class TreeMatch:
    node: RadixNode  # the deepest node whose whole path the query starts with (root: none)
    matched: int  # tokens the query shares with the tree, possibly into one child's edge
    child: RadixNode | None  # the child whose edge the match enters, if it goes past ``node``


class RadixTree:
    def __init__(self):
        self.root = RadixNode(edge=(), depth=0, label="(root)")

    def __iter__(self) -> Iterator[RadixNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())[::-1]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(list(n.children.values())[::-1])

    def clear(self) -> None:
        """Forget every node (the tree object stays: the cache's parts share it)."""
        self.root = RadixNode(edge=(), depth=0, label="(root)")

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def match(self, tokens: list[int] | tuple[int, ...]) -> TreeMatch:
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _shared(child.edge, tokens, i)
            if k < len(child.edge):
                return TreeMatch(node, i + k, child)
            node, i = child, i + k
        return TreeMatch(node, i, None)

    def insert(self, tokens: list[int] | tuple[int, ...], **fields) -> tuple[RadixNode, bool]:
        """The node ending exactly at ``tokens``, created (splitting an edge) when missing.

        Returns (node, created). ``fields`` are set on a created node only.
        """
        m = self.match(tokens)
        parent = m.node
        if m.child is not None:
            parent = self.split(m.child, m.matched - m.node.depth)
        if parent.depth == len(tokens) and parent is not self.root:
            return parent, False
        if parent.depth == len(tokens):
            raise ValueError("the empty prompt has no node")
        node = RadixNode(edge=tuple(tokens[parent.depth:]), parent=parent, depth=len(tokens),
                         **fields)
        parent.children[node.edge[0]] = node
        return node, True

    def split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut ``node``'s edge after ``k`` tokens: a new parent holds the first part.

        The new parent holds no cells (``tier`` "gone") until its owner gives it some: the
        cells of both parts stay with ``node``.
        """
        assert 0 < k < len(node.edge)
        parent = node.parent
        head = RadixNode(edge=node.edge[:k], parent=parent, depth=node.start + k,
                         cuts=tuple(c for c in node.cuts if c < node.start + k),
                         template_sha256=node.template_sha256, last_used=node.last_used)
        parent.children[head.edge[0]] = head
        node.edge = node.edge[k:]
        node.parent = head
        head.children[node.edge[0]] = node
        return head

    def remove(self, node: RadixNode) -> None:
        """Drop a leaf, and merge its parent into the parent's only remaining child when the
        parent holds no cells of its own (it was only a branching point)."""
        assert not node.children and node.parent is not None
        parent = node.parent
        del parent.children[node.edge[0]]
        node.parent = None
        if (parent is not self.root and parent.tier == "gone" and len(parent.children) == 1
                and not parent.pinned):
            (only,) = parent.children.values()
            grand = parent.parent
            del grand.children[parent.edge[0]]
            only.edge = parent.edge + only.edge
            only.cuts = tuple(sorted(set(parent.cuts) | set(only.cuts)))
            only.parent = grand
            grand.children[only.edge[0]] = only
            parent.parent = None


def _shared(edge: tuple[int, ...], tokens, i: int) -> int:
    n = min(len(edge), len(tokens) - i)
    k = 0
    while k < n and edge[k] == tokens[i + k]:
        k += 1
    return k
