"""The KV operations the window's KV Cache dock and `kvprimer kv` offer, written once.

Each is a plain function ``(engine, ...)`` run wherever engine work runs (the window's worker,
the CLI's main thread). Sequence 0 is the user's; every other sequence belongs to the radix
cache, so the operations that change a sequence refuse the cache's (``check_user_sequence``):
changing one behind the cache's back would corrupt what later runs reuse. The cache's own
sequences can be forked into sequence 0 instead.

What the KV grid needs from the cache tree is ``cached_sequences``: which radix node each
resident sequence holds, as small typed records (the views never walk the tree).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import KvPrimerError
from .kv.kv_view import KvCacheView
from .task_state import TaskState
from .prompts.template import Template


@dataclass(frozen=True)
class SeqNode:
    """The radix-cache node a sequence holds: its label and its own token range."""
    seq: int
    label: str  # "static prefix", "<c1> = the value…", "saved state"
    start: int  # first position of the node's own tokens (earlier ones are its ancestors')
    end: int  # tokens from position 0 to the node's end

    def describe(self) -> str:
        return f"seq {self.seq}: {self.label} ({self.end:,} tokens)"


def cached_sequences(engine) -> dict[int, SeqNode]:
    """Which radix node each resident sequence holds (engine thread)."""
    return {n.seq: SeqNode(n.seq, n.label or "cached prompt", n.start, n.depth)
            for n in engine.cache.tree if n.seq is not None}


# ---- operations on one sequence (the user's, except fork) -----------------------------------


def clear_sequence(engine, seq: int) -> None:
    engine.cache.check_user_sequence(seq)
    engine.seqs.clear(seq)


def trim(engine, seq: int, keep: int) -> None:
    """Keep the first ``keep`` positions of ``seq``."""
    engine.cache.check_user_sequence(seq)
    engine.seqs.trim(seq, keep)


def shift(engine, seq: int, p0: int, delta: int) -> None:
    """Add ``delta`` to the positions of ``seq`` from ``p0`` on (seq_add)."""
    engine.cache.check_user_sequence(seq)
    engine.seqs.shift(seq, p0, delta)


def divide(engine, seq: int, p0: int, d: int) -> None:
    """Divide the positions of ``seq`` from ``p0`` on by ``d`` (seq_div)."""
    engine.cache.check_user_sequence(seq)
    engine.seqs.divide(seq, p0, d)


def keep_only(engine, seq: int = 0) -> None:
    """Drop every sequence but the user's ``seq``: the radix cache is emptied first, so that
    none of its nodes keeps a sequence that no longer holds its cells."""
    engine.cache.check_user_sequence(seq)
    engine.cache.clear()
    engine.keep_only(seq)


def fork_to_user(engine, seq: int) -> None:
    """Share ``seq``'s cells with the user's sequence 0, which must be empty."""
    engine.seqs.fork_into_user_sequence(seq)


def clear_cache(engine) -> None:
    """Drop every cached prompt (the user's sequence 0 stays)."""
    engine.clear_cache()


def evict(engine, node_id: int) -> None:
    """Move one cached prompt a tier down (resident → RAM → file → dropped)."""
    engine.cache.evict(node_id)


def pin(engine, node_id: int, pinned: bool = True) -> None:
    """Pin a cached prompt (never evicted, by the user or by the caps), or unpin it."""
    engine.cache.pin(node_id, pinned)


# ---- `kvprimer kv`: the static prefix in sequence 0, forked into borrowed sequences ---------


def most_forks(engine) -> int:
    """How many sequences the prefix can be forked into beside sequence 0: all the context has
    but those the cache keeps (reserved_sequences) and the one its prefix node holds."""
    return engine.config.n_seq_max - len(engine.cache.reserved_sequences()) - 1


def fork_prefix(engine, template: Template, forks: int,
                task: TaskState | None = None) -> KvCacheView:
    """The template's static prefix in the cache and in sequence 0, forked into ``forks`` more
    sequences borrowed from the cache: the view of the cells while they all share them. The
    borrowed sequences go back to the cache before this returns, whatever happens."""
    most = most_forks(engine)
    if forks < 0:
        raise KvPrimerError(f"the number of forks of the static prefix is 0 or more, not {forks}")
    if forks > most:
        raise KvPrimerError(f"{forks} forks of the static prefix need {forks} more sequences; "
                            f"this context has room to fork into at most {most}")
    node = engine.prime_node(template, task)
    fork_to_user(engine, node.seq)
    borrowed: list[int] = []
    try:
        with engine.cache.busy(node):  # the prefix's node keeps its sequence while forks borrow
            for _ in range(forks):
                borrowed.append(engine.cache.take_work_seq())
                engine.seqs.fork(0, borrowed[-1])
            return engine.kv_view()
    finally:
        for seq in borrowed:
            engine.cache.give_back(seq)
