"""Laying the KV cells out again, in order: how the radix cache frees evicted nodes' cells.

llama.cpp places new cells in the first free ones it finds. Freeing an evicted node's cells in
the middle of the cache would let a later run's cells land before its prefix's, and the order
of the cells a sequence attends to changes llama.cpp's arithmetic (batch_policy.py): the run
would no longer be bit-identical to its cold run. So evicted cells are held (cache_sequences.py)
and, when room is needed, every resident node's own cells are copied out, the cache is
cleared, and the nodes are put back parents first: each node's cells land after its parent's,
in position order, and the held cells are gone. The copies are bit for bit, so what the cells
hold does not change, only where they lie.
"""
from __future__ import annotations

from ..errors import CacheError


def relayout(tiers) -> None:
    """Lay every resident node's cells out again in tree order (``tiers``: CacheTiers)."""
    seqs, scratch = tiers.parts.seqs, tiers.sequences.scratch
    plan = []
    for node in tiers.tree:  # parents before children
        if node.seq is None:
            continue
        base = tiers.resident_ancestor(node)
        start = base.depth if base is not None else 0
        plan.append((node, base, seqs.cells_of(node.seq, start, node.depth, scratch)))
    user = seqs.take_out(0)
    seqs.clear_all()
    for node, base, data in plan:
        if base is not None:
            seqs.fork(base.seq, node.seq)
        # (a hybrid or recurrent node's cells come without its recurrent state: put it back)
        if not seqs.add_cells(data, node.seq, scratch, node.tokens()) or (
                node.rs is not None and not seqs.set_recurrent(node.seq, node.rs)):
            seqs.clear_all()
            tiers.lost_sequences()  # every node now says it holds nothing, as it does
            raise CacheError("llama.cpp refused cells while compacting the cache; it was "
                             "cleared, and the next runs cache their prompts again")
    if not seqs.put_back(0, user):
        raise CacheError("sequence 0 could not be put back after compacting the cache; "
                         "fork or evaluate it again")
