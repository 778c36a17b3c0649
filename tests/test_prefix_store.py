import pytest

from app.engine.errors import StoreError
from app.engine.prefix_state import PrefixState
from app.engine.prefix_store import PrefixStore


def state(tokens, nbytes=100):
    return PrefixState(tokens=tuple(tokens), data=b"x" * (nbytes - 4 * len(tokens)),
                       model_sha256="m", model_name="m", type_k="f16", type_v="f16",
                       seq_state_version=3)


def test_longest_prefix_prefers_the_deepest_match():
    s = PrefixStore()
    a, b = state([1, 2]), state([1, 2, 3, 4])
    s.put(a)
    s.put(b)
    m = s.longest_prefix([1, 2, 3, 4, 5])
    assert m.state is b and m.common_tokens == 4
    m = s.longest_prefix([1, 2, 9])
    assert m.state is a and m.common_tokens == 2


def test_match_shorter_than_entry_reports_common_tokens():
    # The static prefix tokenized alone may end differently from the filled prompt.
    s = PrefixStore()
    b = state([1, 2, 3, 4])
    s.put(b)
    m = s.longest_prefix([1, 2, 3, 7, 8])
    assert m.state is b and m.common_tokens == 3


def test_no_match():
    s = PrefixStore()
    s.put(state([1, 2]))
    assert s.longest_prefix([5, 6]) is None
    assert s.longest_prefix([]) is None


def test_byte_cap_is_enforced_with_lru_eviction():
    s = PrefixStore(max_bytes=250)
    a, b, c = state([1], 100), state([2], 100), state([3], 100)
    s.put(a)
    s.put(b)
    s.longest_prefix([1, 5])  # a is now the most recently used
    evicted = s.put(c)
    assert evicted == [b]
    assert s.bytes_used == 200 <= s.max_bytes
    assert s.longest_prefix([2]) is None
    assert s.longest_prefix([1]).state is a


def test_entry_larger_than_cap_is_refused_and_store_unchanged():
    s = PrefixStore(max_bytes=150)
    s.put(state([1], 100))
    with pytest.raises(StoreError, match="does not fit"):
        s.put(state([2], 200))
    assert len(s) == 1 and s.bytes_used == 100


def test_replace_and_remove_prune_the_trie():
    s = PrefixStore()
    s.put(state([1, 2, 3], 100))
    s.put(state([1, 2, 3], 120))
    assert len(s) == 1 and s.bytes_used == 120
    s.remove((1, 2, 3))
    assert len(s) == 0 and s.bytes_used == 0 and s._root.children == {}


def test_many_entries_stay_consistent():
    import random
    rnd = random.Random(1)
    s = PrefixStore(max_bytes=5_000)
    for _ in range(500):
        toks = [rnd.randrange(4) for _ in range(rnd.randrange(1, 8))]
        s.put(state(toks, 100 + rnd.randrange(200)))
        assert s.bytes_used <= s.max_bytes
        assert s.bytes_used == sum(e.nbytes for e in s)
        q = [rnd.randrange(4) for _ in range(8)]
        m = s.longest_prefix(q)
        best = max((sum(1 for _ in __import__("itertools").takewhile(lambda xy: xy[0] == xy[1], zip(e.tokens, q)))
                    for e in s), default=0)
        assert (m.common_tokens if m else 0) == best
