"""A saved state into the radix cache (``RadixCache.adopt``): any state the context can hold
loads, at the context size the user gave.

- A node already holding the state's tokens, in any tier, is that state: it is used where it
  is (a run promotes it when it needs its cells). A run with a saved state adopts it again
  after its first token, so this is the common case.
- A state larger than the resident tier's cap would be evicted to RAM as soon as it landed:
  it goes to the RAM tier directly, as a snapshot of its cells in position order, which is
  also what the work context copies (cache_tiers.copy_of). Restoring it into the cache's
  cells only to copy them out again cost a second here on the default model's 7,026-token
  state, and left its cells held until the next compaction.
- Otherwise its cells are restored into the cache's context, in cells freed for it first
  (evicted nodes' held cells compacted away, unpinned nodes evicted). llama.cpp places a
  state's cells in any free cells (``find_slot`` without the contiguous flag), so the count
  is what matters; when even that cannot be freed, StateFitError names the cells needed,
  those the context has, what holds the rest and the context size that works.
"""
from __future__ import annotations

from ..errors import CacheError, StateFitError
from ..states.seq_payload import in_position_order
from .cache_tiers import APPROX_RESTORED
from .radix_tree import RadixNode


def adopt_state(cache, state, label: str) -> RadixNode:
    """``state`` (a PrefixState checked against the model) as a node of ``cache`` (a
    RadixCache)."""
    m = cache.tree.match(list(state.tokens))
    if (m.matched == state.n_tokens and m.child is None and m.node.tier != "gone"
            and (m.node.has_rs or not cache.stateful)):
        cache.touch(m.node)
        return m.node
    approx = APPROX_RESTORED if cache.windowed else ""
    if not cache.stateful and over_resident_cap(cache, state.n_tokens):
        return _to_ram(cache, state, label, approx)
    make_room_for_state(cache, state.n_tokens)
    seq = cache.tiers.take_seq()
    try:
        if not cache.parts.seqs.add_cells(state.data, seq, cache.scratch, list(state.tokens)):
            free = cache.parts.ctx.n_ctx - cache.parts.seqs.used_cells()
            raise CacheError(f"llama.cpp refused the saved state's {state.n_tokens:,} cells "
                             f"with {free:,} cells free; prime the prefix again")
        # the state's recurrent part, at its end: what a run resuming there needs
        rs = cache.parts.ctx.state_get(seq, partial=True) if cache.stateful else None
        node = cache.add(seq, label, cache.state_cuts(state), state.template_sha256, approx)
        if rs is not None and node.depth == state.n_tokens:
            cache.tiers.hold_rs(node, rs)
        if node.depth == state.n_tokens and not cache.windowed:
            cache.tiers.keep_copy(node, 0, node.depth, in_position_order(state.data))
        return node
    finally:
        cache.sequences.put_back(seq)


def over_resident_cap(cache, n_tokens: int) -> bool:
    """Would ``n_tokens`` of cells alone exceed the resident tier's cap?"""
    return n_tokens * cache.parts.kv_bytes_per_token > cache.tiers.resident_cap


def _to_ram(cache, state, label: str, approx: str) -> RadixNode:
    node = cache._insert(list(state.tokens), label, state.template_sha256,
                         cache.state_cuts(state))
    with cache.busy(node):
        if node.tier == "gone":
            cache.tiers.hold_snapshot(node, in_position_order(state.data), 0, approx)
        cache.touch(node)
        cache.tiers.enforce()
    return node


def make_room_for_state(cache, n: int) -> None:
    """Free ``n`` cells of the cache's context for a state, or raise StateFitError naming what
    holds the cells that cannot be freed."""
    n_ctx = cache.parts.ctx.n_ctx
    if n >= n_ctx:
        raise StateFitError(n, n_ctx)
    try:
        cache.tiers.ensure_free_cells(n)
    except CacheError:
        user = cache.parts.seq_tokens.count(0)
        kept = sum(1 for x in cache.tree if x.seq is not None)
        held = ([f"sequence 0 holds {user:,} tokens"] if user else []) + (
            [f"{kept} pinned or busy cached prompts stay resident"] if kept else [])
        raise StateFitError(n, n_ctx, n_ctx - cache.parts.seqs.used_cells(),
                            "; ".join(held) or "cells in use") from None
