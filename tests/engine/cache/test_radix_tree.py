"""The radix tree over token ids (pure Python): match, insert, split, remove, merge."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cache.radix_tree import RadixTree


def check_shape(tree: RadixTree) -> None:
    """Every edge is non-empty, children are keyed by their first token, depths add up, and no
    two siblings start alike."""
    for n in tree:
        assert n.edge and n.parent.children[n.edge[0]] is n
        assert n.depth == n.parent.depth + len(n.edge) == n.start + n.own_tokens
        assert len(n.tokens()) == n.depth
        assert n.path()[-1] is n and n.path()[0].parent is tree.root


def test_insert_then_match_whole_and_part():
    t = RadixTree()
    a, created = t.insert([1, 2, 3, 4])
    assert created and a.tokens() == [1, 2, 3, 4] and a.depth == 4 and a.start == 0
    m = t.match([1, 2, 3, 4, 5])
    assert (m.node, m.matched, m.child) == (a, 4, None)
    m = t.match([1, 2, 9])  # enters a's edge, splits nothing
    assert (m.node, m.matched, m.child) == (t.root, 2, a) and len(t) == 1
    m = t.match([7])
    assert (m.node, m.matched, m.child) == (t.root, 0, None)
    assert t.match([]).matched == 0


def test_insert_splits_an_edge_and_the_head_holds_no_cells():
    t = RadixTree()
    a, _ = t.insert([1, 2, 3, 4])
    a.seq, a.cuts, a.label = 5, (0, 2, 3), "prompt a"
    b, created = t.insert([1, 2, 9])
    assert created
    head = b.parent
    assert head.edge == (1, 2) and head.tier == "gone" and head.parent is t.root
    assert a.parent is head and a.edge == (3, 4) and a.tier == "resident"
    assert head.cuts == (0,) and a.cuts == (0, 2, 3)  # cuts stay absolute
    assert b.edge == (9,) and b.tokens() == [1, 2, 9] and b.start == 2
    assert [n.depth for n in a.path()] == [2, 4]
    check_shape(t)


def test_insert_existing_and_at_a_split_point():
    t = RadixTree()
    a, _ = t.insert([1, 2, 3])
    again, created = t.insert([1, 2, 3])
    assert again is a and not created
    mid, created = t.insert([1, 2])  # ends inside a's edge: a split makes its node
    assert created is False and mid is a.parent and mid.tokens() == [1, 2]
    with pytest.raises(ValueError):
        t.insert([])


def test_split_directly():
    t = RadixTree()
    a, _ = t.insert([5, 6, 7, 8, 9])
    a.cuts = (0, 3)
    head = t.split(a, 3)
    assert head.edge == (5, 6, 7) and a.edge == (8, 9) and head.cuts == (0,)
    assert head.depth == 3 and a.depth == 5 and a.start == 3
    with pytest.raises(AssertionError):
        t.split(a, 2)  # not inside the edge
    check_shape(t)


def test_remove_merges_a_cell_less_branching_point():
    t = RadixTree()
    a, _ = t.insert([1, 2, 3, 4])
    b, _ = t.insert([1, 2, 9])
    a.seq = b.seq = 1
    head = a.parent
    t.remove(b)
    # the branching point held no cells and has one child left: merged into it
    assert head.parent is None and a.parent is t.root and a.edge == (1, 2, 3, 4)
    assert a.cuts == () and len(t) == 1
    check_shape(t)


def test_remove_keeps_a_branching_point_that_holds_cells_or_is_pinned():
    for how in ("cells", "pinned"):
        t = RadixTree()
        a, _ = t.insert([1, 2, 3, 4])
        b, _ = t.insert([1, 2, 9])
        head = a.parent
        if how == "cells":
            head.ram = b"x"
        else:
            head.pinned = True
        t.remove(b)
        assert a.parent is head and head.parent is t.root and len(t) == 2


def test_remove_only_leaves():
    t = RadixTree()
    a, _ = t.insert([1, 2, 3, 4])
    t.insert([1, 2, 3, 4, 5])
    with pytest.raises(AssertionError):
        t.remove(a)


def _brute_match(prompts: list[list[int]], query: list[int]) -> int:
    best = 0
    for p in prompts:
        k = 0
        while k < min(len(p), len(query)) and p[k] == query[k]:
            k += 1
        best = max(best, k)
    return best


prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(prompts_st, st.lists(st.integers(0, 3), max_size=10), st.data())
def test_match_is_the_longest_shared_prefix_whatever_is_inserted_and_removed(prompts, query, data):
    t = RadixTree()
    for p in prompts:
        t.insert(p)
        check_shape(t)
    # every inserted prompt ends at a node with its own tokens
    for p in prompts:
        m = t.match(p)
        assert m.child is None and m.node.tokens() == p
    m = t.match(query)
    assert m.matched == _brute_match(prompts, query)
    assert m.node.depth <= m.matched and query[:m.node.depth] == m.node.tokens()
    if m.child is not None:
        assert m.node.depth < m.matched < m.child.depth
    # remove leaves (those holding no cells may merge their parents); what stays still matches
    for n in t:
        n.seq = 1  # every inserted node holds cells; split heads stay "gone"
    for n in list(t):
        if n.tier == "gone":
            n.seq = None
    kept = list(prompts)
    while True:
        leaves = [n for n in t if not n.children]
        if not leaves:
            break
        leaf = data.draw(st.sampled_from(leaves))
        toks = leaf.tokens()
        t.remove(leaf)
        kept = [p for p in kept if p != toks]
        check_shape(t)
        for p in kept:
            m = t.match(p)
            assert m.matched == len(p)
            # a prompt that still has its node keeps it, unless it was a merged branching point
            if m.child is None:
                assert m.node.tokens() == p
    assert len(t) == 0 or all(n.tier == "gone" for n in t)
