"""The KV operations as engine flows (app/engine/kv_flows.py): what the KV Cache dock and
`kvprimer kv` both call, on the tiny model."""
import pytest

from app.engine import CacheError, KvPrimerError, Template
from app.engine import kv_flows

TPL = Template.parse("hello world of the answer and question. " * 8 + "<q>")


def test_cache_sequences_are_refused_and_the_users_are_changed(engine):
    node = engine.prime_node(TPL)
    S, P = node.seq, node.depth
    assert kv_flows.cached_sequences(engine) == {S: kv_flows.SeqNode(S, "static prefix", 0, P)}
    for flow, args in ((kv_flows.clear_sequence, ()), (kv_flows.trim, (3,)),
                       (kv_flows.shift, (0, 4)), (kv_flows.divide, (0, 2)),
                       (kv_flows.keep_only, ())):
        with pytest.raises(CacheError, match=f"sequence {S} belongs to the radix cache's "
                                             "'static prefix'; fork it into sequence 0"):
            flow(engine, S, *args)
    assert engine.kv_view().seq(S).cells == P  # nothing changed
    kv_flows.fork_to_user(engine, S)
    with pytest.raises(KvPrimerError, match="sequence 0 is in use"):
        kv_flows.fork_to_user(engine, S)
    kv_flows.trim(engine, 0, 10)
    assert engine.kv_view().seq(0).cells == 10
    kv_flows.keep_only(engine, 0)  # the cache is emptied first: no node keeps a lost sequence
    assert kv_flows.cached_sequences(engine) == {} and engine.cache.nodes() == []
    assert [u.seq for u in engine.kv_view().sequences] == [0]


def test_fork_prefix_gives_the_borrowed_sequences_back(engine):
    free = list(engine.cache.sequences.free)
    most = kv_flows.most_forks(engine)
    # the user's 0, the holding and scratch sequences, and the prefix's node
    assert engine.cache.reserved_sequences() == (0, engine.config.n_seq_max - 2,
                                                 engine.config.n_seq_max - 1)
    assert most == engine.config.n_seq_max - 4
    view = kv_flows.fork_prefix(engine, TPL, 3)
    node, = kv_flows.cached_sequences(engine)
    assert len(view.sequences) == 5  # 0, the node and 3 forks, all sharing the prefix
    assert {u.shared_cells for u in view.sequences} == {view.used_cells}
    # the forks are the cache's again, and their cells gone; the node and sequence 0 stay
    assert not engine.cache.sequences.lent
    assert sorted(engine.cache.sequences.free) == sorted(s for s in free if s != node)
    assert [u.seq for u in engine.kv_view().sequences] == [0, node]
    with pytest.raises(KvPrimerError, match=f"at most {most}"):
        kv_flows.fork_prefix(engine, TPL, most + 1)


def test_fork_prefix_gives_back_what_it_borrowed_when_a_fork_fails(engine, monkeypatch):
    kv_flows.fork_prefix(engine, TPL, 0)
    calls = []

    def fork(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KvPrimerError("llama.cpp failed")

    monkeypatch.setattr(engine.seqs, "fork", fork)
    kv_flows.clear_sequence(engine, 0)
    with pytest.raises(KvPrimerError, match="llama.cpp failed"):
        kv_flows.fork_prefix(engine, TPL, 3)
    # sequence 0, then the first borrowed sequence, which went back to the cache
    assert calls[0] == 0 and len(calls) == 2 and not engine.cache.sequences.lent
    assert calls[1] in engine.cache.sequences.free
