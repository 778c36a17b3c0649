"""Composed modules (opt-in, approximate): reuse each slot's value without its left context.

A module is one segment of a prompt (a placeholder's value and the template text after it)
evaluated once right after the static prefix, and cached as a radix node like any prompt. A
composed run takes the exact part the cache already holds (the static prefix, or deeper), then
for every further segment but the last places that segment's module cells after it — copied,
and moved to their positions in this prompt with llama.cpp's seq_add where those differ (the
next decode re-rotates their K), each module once per row — and evaluates only the last segment.

The module's tokens attended to the static prefix only, never to the modules before them, so
the result differs from a cold run: the verdict measures by how much. ``recompute`` evaluates
some tokens of each module in context instead of copying them (a count of first tokens, as
EPIC does, or a share chosen by a signal: recompute_choice.py), trading time for accuracy.
The first module is the exception when it lies right after the static prefix at the positions
it was made at (``first_in_place``): its cells are what a cold run computes, so none of it is
recomputed and a share's tokens go to the later modules.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import CacheError
from ..prompts.prompt_segments import Segment
from ..cache.radix_cache import CacheHit, RadixCache
from ..cache.radix_tree import RadixNode
from ..llama.batch_policy import BatchPolicy
from ..slot.run_slot import NodeEnd, Slot
from .recompute_choice import Recompute, RecomputeChoice, row_runs
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


def first_in_place(plan: ModulePlan, tokens: list[int]) -> bool:
    """Whether the row's first composed module lies where it was made: a module's cells were
    computed by evaluating its tokens right after the static prefix's cells (``plan_modules``),
    so where the row places it there too (the exact part ends at the static prefix, the module
    starts at the prefix's depth, the row's tokens before it are the prefix's), evaluating it in
    context computes those cells again (up to batch grouping). Not so for a later module, a
    module after a deeper exact part, or a static prefix whose last tokens merged with the
    first value's (the module then starts elsewhere, after other text)."""
    if not plan.modules:
        return False
    p = plan.prefix.depth
    seg = plan.modules[0][0]
    return seg.start == p == plan.hit.reused and tokens[:p] == plan.prefix.tokens()


@dataclass(frozen=True)
class Part:
    """A stretch of a composed row, positions start..end-1: tokens evaluated in context
    (``module`` None), or cached cells of module ``module`` (its tokens from ``offset``)."""
    start: int
    end: int
    module: int | None = None
    offset: int = 0


def assembly(modules: Sequence[Segment], runs: list[list[tuple[int, int]]]) -> list[Part]:
    """The row's modules (their segments) as parts in position order: for each module, its
    cached cells up to the next run chosen for recompute (``runs``: each module's,
    recompute_choice.py), the run, and so on. Runs with no cached cell between them, within a
    module or across modules' ends, are one part: one evaluation."""
    parts: list[Part] = []
    for i, (seg, chosen) in enumerate(zip(modules, runs)):
        at = 0
        for a, b in chosen:
            if a > at:
                parts.append(Part(seg.start + at, seg.start + a, i, at))
            if parts and parts[-1].module is None and parts[-1].end == seg.start + a:
                parts[-1] = Part(parts[-1].start, seg.start + b)
            else:
                parts.append(Part(seg.start + a, seg.start + b))
            at = b
        if at < seg.end - seg.start:
            parts.append(Part(seg.start + at, seg.end, i, at))
    return parts


def part_starts(part: Part, batching: BatchPolicy, *, windowed: bool) -> list[int]:
    """Where a part's batches start: a recomputed run in a module's batches; a module's placed
    cells are one piece from its start (the slot's history gets a cut there)."""
    if part.module is None:
        return batching.module(part.start, part.end, windowed=windowed)
    return [part.start]


def composed_history(batching: BatchPolicy, head: Sequence[int], modules: Sequence[Segment],
                     runs: list[list[tuple[int, int]]], last: int, end: int) -> list[int]:
    """The batch starts of a composed row's history in the work context, as ``compose`` and
    the warm run leave it: ``head`` (the exact part's), every part of ``assembly``
    (``part_starts``), then the last segment, ``last`` to ``end``, in a warm run's batches.
    A benchmark plans its cold runs from it, so the plan and the run agree."""
    return ([*head] + [c for part in assembly(modules, runs)
                       for c in part_starts(part, batching, windowed=False)]
            + batching.warm(last, end, windowed=False))


def compose(slot: Slot, cache: RadixCache, plan: ModulePlan, tokens: list[int],
            recompute: Recompute, task) -> Composition:
    """Fill the slot with the exact part, then the modules' parts left to right (``assembly``),
    ready to evaluate the last segment. llama.cpp takes a sequence's batch only at its end, so
    the sequence is built in position order and every recomputed run sees all cells before it.

    Each placed part that moved makes the next decode re-rotate K across the whole cache, so
    where the slot can hold cells aside, the runs before any cached cell are evaluated first,
    then every module's cached cells are moved to their places in the row at once (one move per
    module, one re-rotation per row, at the next decode), and the sequence takes them in turn
    between the other runs' evaluations. Otherwise each part is moved in its turn."""
    slot.bring(plan.hit, tokens)
    in_place = first_in_place(plan, tokens)
    chosen = row_runs([seg.end - seg.start for seg, _node in plan.modules], recompute, in_place)
    parts = assembly([seg for seg, _node in plan.modules], chosen)
    p = plan.prefix.depth
    held = False
    try:
        for part in parts:
            if part.module is None:
                slot.evaluate(tokens[part.start:part.end],
                              part_starts(part, slot.batching, windowed=slot.windowed),
                              task, stage="recompute", want_logits=False)
            elif slot.can_hold:
                if not held:
                    _hold(slot, cache, plan, parts, p)
                    held = True
                slot.take_held(tokens[part.start:part.end])
            else:
                _place(slot, cache, plan.modules[part.module][1], p, part, tokens)
    finally:
        if held:
            slot.drop_held()
    sources = list(plan.hit.sources)
    recomputed = module_tokens = 0
    for (seg, _node), runs in zip(plan.modules, chosen):
        n = seg.end - seg.start
        k = sum(b - a for a, b in runs)
        module_tokens += n
        recomputed += k
        sources.append((f"module {seg.label}" + (f" (recomputed {k})" if k else ""), n - k))
    reused = plan.modules[-1][0].end if plan.modules else plan.hit.reused
    evaluations = sum(part.module is None for part in parts)
    # the first module's tokens the setting would have recomputed, had it not lain in place
    n0 = plan.modules[0][0].end - plan.modules[0][0].start if plan.modules else 0
    kept = n0 if in_place and recompute.tokens_of(n0) and not chosen[0] else 0
    choice = RecomputeChoice(recompute.text, recomputed, module_tokens, evaluations,
                             in_place=kept)
    return Composition(reused, tuple(sources), recomputed, choice)


def _hold(slot: Slot, cache: RadixCache, plan: ModulePlan, parts: list[Part], p: int) -> None:
    """Every module's cached cells of ``parts``, moved to their places in the row in one span
    per module (the cells of recomputed runs inside it are held too, and freed unused)."""
    spans: dict[int, tuple[int, int, int]] = {}  # module: first and end offsets, its start
    for part in parts:
        if part.module is not None:
            lo, hi, _s = spans.get(part.module, (part.offset, part.offset, 0))
            spans[part.module] = (min(lo, part.offset),
                                  max(hi, part.offset + part.end - part.start),
                                  part.start - part.offset)
    for i, (lo, hi, start) in spans.items():
        node = plan.modules[i][1]
        with cache.busy(node):
            slot.hold(cache.materialise(node), p + lo, p + hi, start + lo)


def _place(slot: Slot, cache: RadixCache, node: RadixNode, p: int, part: Part,
           tokens: list[int]) -> None:
    """A module's cached cells for ``part`` (made at positions p+offset..) appended there."""
    lo = p + part.offset
    with cache.busy(node):
        slot.place(cache.materialise(node), lo, lo + part.end - part.start, part.start,
                   tokens[part.start:part.end])
