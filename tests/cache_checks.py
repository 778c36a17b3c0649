"""Checks shared by the engine tests: the KV cache holds what the engine and the radix cache
say it holds."""
from __future__ import annotations

from pathlib import Path


def assert_sequences_consistent(eng) -> None:
    """Every sequence holds exactly the tokens the engine says (llama.cpp's range agrees);
    the radix cache's holding sequence keeps evicted cells and no tokens of its own."""
    for seq, toks in eng.seq_tokens.items():
        if seq == eng.cache.holding:
            assert not toks
            continue
        expect = (0, len(toks) - 1) if toks else (-1, -1)
        got = eng.ctx.pos_range(seq)
        if getattr(eng, "stateful", False) and toks:
            # a hybrid's range starts at its recurrent record (llama.cpp takes the later
            # start of its two memories); a recurrent model's is that record alone
            got, expect = got[1], expect[1]
        assert got == expect, (seq, len(toks))


def assert_tree_consistent(eng) -> None:
    """Every resident node's sequence holds exactly its tokens; no two nodes share a sequence;
    every sequence holding tokens is the user's (0) or a resident node's; snapshots are where
    their tier says; the cache's folder holds only the files of file-tier nodes."""
    assert_sequences_consistent(eng)
    cache = eng.cache
    seqs = {}
    files = set()
    for n in cache.tree:
        assert n.parent is not None and n.parent.children[n.edge[0]] is n
        assert n.depth == n.start + len(n.edge) and n.edge
        if n.seq is not None:
            assert n.seq not in seqs, f"nodes {seqs.get(n.seq)} and {n.id} share sequence {n.seq}"
            seqs[n.seq] = n.id
            assert eng.seq_tokens[n.seq] == n.tokens(), f"node {n.id} in sequence {n.seq}"
            assert n.seq not in cache.sequences.free
        if n.tier == "file":
            assert Path(n.file).exists()
            files.add(Path(n.file).name)
        if n.tier == "ram":
            assert n.file is None
        if n.rs_file is not None:  # a recurrent state goes to a file with its node's cells
            assert n.tier == "file" and n.rs is None and Path(n.rs_file).exists()
            files.add(Path(n.rs_file).name)
    for s, toks in eng.seq_tokens.items():
        if toks and s != 0:
            assert s in seqs, f"sequence {s} holds {len(toks)} tokens but no node owns it"
    assert not (set(cache.sequences.free) & {0, cache.scratch, cache.holding})
    assert len(set(cache.sequences.free)) == len(cache.sequences.free)
    on_disk = {p.name for p in cache.folder.iterdir()} if cache.folder.exists() else set()
    assert on_disk == files, f"leaked files: {sorted(on_disk - files)}"
