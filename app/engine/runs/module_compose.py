"""Composed modules (opt-in, approximate): reuse each slot's value without its left context.

A module is one segment of a prompt (a placeholder's value and the template text after it)
evaluated once right after the static prefix, and cached as a radix node like any prompt. A
composed run takes the exact part the cache already holds (the static prefix, or deeper), then
for every further segment but the last places that segment's module cells after it — the
first module at its own positions shares its cells, later ones are copied and shifted with
llama.cpp's seq_add (the next decode re-rotates their K) — and evaluates only the last segment.

The module's tokens attended to the static prefix only, never to the modules before them, so
the result differs from a cold run: the verdict measures by how much. ``recompute`` evaluates
some tokens of each module in context instead of copying them (a count of first tokens, as
EPIC does, or a share chosen by a signal: recompute_choice.py), trading time for accuracy.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import CacheError
from ..prompts.prompt_segments import Segment
from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..slot.run_slot import NodeEnd, Slot
from .recompute_choice import Recompute, RecomputeChoice, module_runs
from .run_parts import RunParts


@dataclass(frozen=True)
class ModulePlan:
    hit: CacheHit  # the exact part: static prefix or deeper, ending at a segment start
    prefix: RadixNode  # the static prefix node the modules were evaluated after
    modules: tuple[tuple[Segment, RadixNode], ...]  # the segments to place, with their modules
    build_ms: float  # evaluating modules not cached yet


@dataclass(frozen=True)
class Composition:
    reused: int
    sources: tuple[tuple[str, int], ...]
    recomputed: int = 0  # tokens of modules evaluated in context, within ``reused``'s range
    choice: RecomputeChoice | None = None  # what was recomputed and why


def plan_modules(parts: RunParts, tokens: list[int], segments: list[Segment], hit: CacheHit,
                 prefix: RadixNode, task) -> ModulePlan:
    """Cache a module for every segment between the exact part and the last segment."""
    if not parts.traits.can_shift:
        raise CacheError(f"{parts.name or 'this model'} cannot shift positions in its KV "
                         "cache, which composing modules needs; use the prefix or chain reuse mode")
    starts = [s.start for s in segments]
    exact = max((b for b in starts if b <= hit.reused), default=0)
    if hit.reused != exact:
        hit = parts.cache.lookup(tokens, limit=exact)
    if hit.reused < segments[0].end:  # only a sliding-window model refuses the part it needs
        raise CacheError("the static prefix's last tokens merge with the first value's here, "
                         "and this model cannot reuse part of a cached prompt; use the chain reuse mode")
    cache = parts.cache
    p = prefix.depth
    base = prefix.tokens()
    build_s = 0.0  # only modules evaluated now: reusing cached ones costs no build time
    modules = []
    for seg in segments[1:-1]:
        if seg.start < exact:
            continue
        key = base + tokens[seg.start:seg.end]
        m = cache.tree.match(key)
        node = m.node if (m.child is None and m.node.depth == len(key) and m.node.tier != "gone") else None
        if node is None:  # built in the run's slot, like every cached prompt
            t0 = time.perf_counter()
            with parts.slot(seg.end - seg.start) as slot:
                slot.bring(CacheHit(prefix, p, (), prefix.tier, prefix.approx), key)
                end = NodeEnd(len(key), f"module {seg.label}", approx=prefix.approx)
                slot.evaluate(key[p:], slot.starts(len(key)), task, stage="module",
                              want_logits=False, nodes=[end])
                node = slot.flush()[-1]
            build_s += time.perf_counter() - t0
        modules.append((seg, node))
    return ModulePlan(hit, prefix, tuple(modules), build_s * 1000)


def compose(slot: Slot, cache: RadixCache, plan: ModulePlan, tokens: list[int],
            recompute: Recompute, task) -> Composition:
    """Fill the slot with the exact part, then each module left to right: its cached cells
    (moved to their positions in this prompt) up to the next run of tokens chosen for
    recompute (recompute_choice.py), that run evaluated in context, and so on, ready to
    evaluate the last segment. llama.cpp takes a sequence's batch only at its end, so a
    sequence is built in this order: every recomputed run sees all cells before it."""
    slot.bring(plan.hit, tokens)
    cur = plan.hit.reused
    sources = list(plan.hit.sources)
    p = plan.prefix.depth
    recomputed = runs = module_tokens = 0
    for seg, node in plan.modules:
        n = seg.end - seg.start
        module_tokens += n
        at = 0  # module tokens in the slot so far
        k = 0
        for a, b in module_runs(n, recompute):
            if a > at:
                _place(slot, cache, node, p, at, a, cur, tokens, seg.start)
            slot.evaluate(tokens[seg.start + a:seg.start + b],
                          slot.batching.module(slot.held, cur + b, windowed=slot.windowed),
                          task, stage="recompute", want_logits=False)
            k += b - a
            runs += 1
            at = b
        if at < n:
            _place(slot, cache, node, p, at, n, cur, tokens, seg.start)
        recomputed += k
        sources.append((f"module {seg.label}" + (f" (recomputed {k})" if k else ""), n - k))
        cur += n
    choice = RecomputeChoice(recompute.text, recomputed, module_tokens, runs)
    return Composition(cur, tuple(sources), recomputed, choice)


def _place(slot: Slot, cache: RadixCache, node: RadixNode, p: int, i0: int, i1: int, cur: int,
           tokens: list[int], start: int) -> None:
    """A module's cached cells i0..i1-1 (made at positions p+i0..) appended at ``cur + i0``."""
    with cache.busy(node):
        slot.place(cache.materialise(node), p + i0, p + i1, cur + i0,
                   tokens[start + i0:start + i1])
