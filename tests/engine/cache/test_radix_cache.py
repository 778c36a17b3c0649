"""The radix cache's tiers on the tiny model: caps hold, nodes move resident → RAM → file →
dropped, promoted nodes give bit-identical runs, a full context evicts, pins hold, no file leaks."""
from __future__ import annotations

import pytest

from app.engine import CacheError, CacheLimits, Engine, EngineConfig, GenerationConfig, Template
from app.engine import run_prompt
from tests.cache_checks import assert_tree_consistent

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 4
                     + "\n<c1>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
GEN = GenerationConfig(max_tokens=4)
WORDS = ["hello", "world", "answer", "question", "context", "assistant", "the", "of"]


def value(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 3 + k * (i + 1)) % len(WORDS)] for k in range(n)) + f" {i}"


def rows(n: int) -> list[dict]:
    return [{"c1": value(i), "question": f"why {i}?"} for i in range(n)]


def make(tiny_model, tmp_path, n_ctx=1024, **caps) -> Engine:
    return Engine(EngineConfig(model_path=str(tiny_model), n_ctx=n_ctx, n_batch=32, n_threads=1,
                               cache=CacheLimits(folder=str(tmp_path / "cache"), **caps)))


def assert_caps_hold(eng) -> dict:
    tiers = {t.name: t for t in eng.cache.tier_usage()}
    assert list(tiers) == ["resident", "ram", "file"]
    for t in tiers.values():
        assert t.used_bytes <= t.cap_bytes, t
    return tiers


def test_overfilled_tiers_stay_under_their_caps_and_nothing_leaks(tiny_model, tmp_path):
    with make(tiny_model, tmp_path) as probe:
        kv = probe.info.kv_bytes_per_token
    # the static prefix (191 tokens) and two rows' own tokens resident (~60 each), about two
    # rows' worth of RAM and of files
    eng = make(tiny_model, tmp_path, resident_bytes=320 * kv, ram_bytes=130 * kv,
               file_bytes=130 * kv)
    try:
        seen = set()
        for vals in rows(14):
            rep = run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False)
            assert rep.verdict.exact, rep.verdict.describe()  # evictions change no bit
            tiers = assert_caps_hold(eng)
            assert_tree_consistent(eng)  # the folder holds only the files of file-tier nodes
            seen |= {n.tier for n in eng.cache.tree}
            assert tiers["resident"].nodes >= 1
        assert {"resident", "ram", "file"} <= seen
        # some rows' nodes were dropped altogether: fewer nodes than rows were cached
        assert len([n for n in eng.cache.tree if n.tier != "gone"]) < 1 + 2 * 14
    finally:
        eng.close()
    assert (tmp_path / "cache").is_dir()  # a folder the user chose stays


def _evict_down(eng, nodes, tier: str) -> None:
    for n in nodes:
        while n.tier != tier:
            eng.cache.evict(n.id)


@pytest.mark.parametrize("tier", ["ram", "file"])
def test_a_promoted_node_gives_a_bit_identical_run(tiny_model, tmp_path, tier):
    eng = make(tiny_model, tmp_path)
    try:
        a = {"c1": value(1), "question": "why?"}
        b = {**a, "question": "and then, what?"}
        run_prompt(eng, TPL, a, reuse="chain", gen=GEN, oneshot=False)
        base = run_prompt(eng, TPL, b, reuse="chain", gen=GEN, oneshot=False)
        assert base.verdict.exact and any(s.startswith("<c1>") for s, _ in base.sources)
        prefix = [n for n in eng.cache.tree if n.label == "static prefix"]
        others = sorted((n for n in eng.cache.tree if n.label != "static prefix" and n.tier != "gone"),
                        key=lambda n: -n.depth)
        assert prefix and len(others) >= 3  # <c1>'s node and both rows' whole prompts
        _evict_down(eng, others, tier)
        assert_tree_consistent(eng)
        assert all(n.tier == tier for n in others) and prefix[0].tier == "resident"
        eng.work.reset()  # the work context forgets b: its cells must come from the cache
        rep = run_prompt(eng, TPL, b, reuse="chain", gen=GEN, oneshot=False)
        assert rep.hit_tier == tier and rep.reused_tokens == base.reused_tokens
        assert rep.verdict.equivalence == "bit-identical", rep.verdict.describe()
        assert rep.warm.tokens == base.warm.tokens
        assert_tree_consistent(eng)
        c1 = next(n for n in eng.cache.tree if n.label.startswith("<c1>"))
        assert c1.tier == "resident"  # promoted
    finally:
        eng.close()


def test_evict_moves_one_tier_down_and_pin_keeps_a_node_resident(tiny_model, tmp_path):
    eng = make(tiny_model, tmp_path)
    try:
        run_prompt(eng, TPL, rows(1)[0], reuse="chain", gen=GEN, oneshot=False, cold=False)
        leaf = max(eng.cache.tree, key=lambda n: n.depth)
        path = []
        for _ in range(3):
            eng.cache.evict(leaf.id)
            path.append(leaf.tier)
            assert_tree_consistent(eng)
        assert path == ["ram", "file", "gone"] and leaf not in list(eng.cache.tree)
        prefix = next(n for n in eng.cache.tree if n.label == "static prefix")
        eng.cache.pin(prefix.id)
        with pytest.raises(CacheError, match="pinned"):
            eng.cache.evict(prefix.id)
        with pytest.raises(CacheError, match="no cached prompt has id"):
            eng.cache.evict(10 ** 9)
        info = {i.id: i for i in eng.cache.nodes()}
        assert info[prefix.id].pinned and info[prefix.id].tier == "resident"
    finally:
        eng.close()


def test_pinned_prefix_stays_resident_under_pressure(tiny_model, tmp_path):
    with make(tiny_model, tmp_path) as probe:
        kv = probe.info.kv_bytes_per_token
    eng = make(tiny_model, tmp_path, resident_bytes=250 * kv, ram_bytes=70 * kv, file_bytes=70 * kv)
    try:
        node = eng.prime_node(TPL)
        eng.cache.pin(node.id)
        for vals in rows(8):
            rep = run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False)
            assert node.tier == "resident" and rep.verdict.exact, rep.verdict.describe()
            assert rep.sources[0] == ("static prefix", node.depth)
            assert_caps_hold(eng)
            assert_tree_consistent(eng)
    finally:
        eng.close()


def test_runs_after_evictions_stay_bit_identical(tiny_model, tmp_path):
    with make(tiny_model, tmp_path) as probe:
        kv = probe.info.kv_bytes_per_token
    eng = make(tiny_model, tmp_path, resident_bytes=250 * kv, ram_bytes=70 * kv, file_bytes=70 * kv)
    try:
        verdicts = [run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False).verdict
                    for vals in rows(8)]
        assert [v.equivalence for v in verdicts] == ["bit-identical"] * 8
    finally:
        eng.close()


def test_a_full_context_evicts_instead_of_failing(tiny_model, tmp_path):
    # the resident cap is far above the context: only running out of cells evicts
    eng = make(tiny_model, tmp_path, n_ctx=512, resident_bytes=1 << 40)
    try:
        for vals in rows(8):  # the static prefix (191 tokens) and ~60 more tokens a row
            rep = run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False)
            assert rep.verdict.exact, rep.verdict.describe()
            assert eng.seqs.used_cells() <= eng.ctx.n_ctx
            assert_tree_consistent(eng)
        # 191 + 8 rows of ~66 tokens do not fit in 512 cells: nodes went to RAM on the way
        assert any(n.tier == "ram" for n in eng.cache.tree)
    finally:
        eng.close()


def test_cache_clear_and_close_remove_an_own_folder(tiny_model):
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_batch=32, n_threads=1))
    run_prompt(eng, TPL, rows(1)[0], reuse="chain", gen=GEN, oneshot=False, cold=False)
    leaf = max(eng.cache.tree, key=lambda n: n.depth)
    eng.cache.evict(leaf.id)
    eng.cache.evict(leaf.id)
    folder = eng.cache.folder
    assert [p.name for p in folder.iterdir()] == [f"node-{leaf.id}.kvcells"]
    eng.cache.clear()
    assert len(eng.cache.tree) == 0 and list(folder.iterdir()) == [] and eng.seqs.used_cells() == 0
    eng.close()
    assert not folder.exists()


def test_a_node_promoted_over_the_cap_stays_until_the_run_has_forked_it(tiny_model, tmp_path):
    """The resident cap leaves room for the static prefix alone: every row's nodes go to RAM
    after its run, and a repeated row promotes them back over the cap. The promoted node must
    not be evicted again before the run forks it (nested uses of one node count)."""
    with make(tiny_model, tmp_path) as probe:
        kv = probe.info.kv_bytes_per_token
    eng = make(tiny_model, tmp_path, resident_bytes=200 * kv)
    try:
        vals = rows(1)[0]
        first = run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False)
        assert any(n.tier == "ram" for n in eng.cache.tree)
        again = run_prompt(eng, TPL, vals, reuse="chain", gen=GEN, oneshot=False)
        assert again.hit_tier == "ram" and again.reused_tokens > first.reused_tokens
        assert again.verdict.exact, again.verdict.describe()
        assert again.warm.tokens == first.warm.tokens
        assert_tree_consistent(eng)
    finally:
        eng.close()


def test_the_users_operations_stay_off_the_caches_sequences(tiny_model, tmp_path):
    """The KV dock's clear/trim/shift/keep act on sequence 0 only; the engine refuses the cache's
    sequences when the job runs, and a fork into sequence 0 refuses to overwrite it."""
    eng = make(tiny_model, tmp_path)
    try:
        node = eng.prime_node(TPL)
        with pytest.raises(CacheError, match="static prefix"):
            eng.cache.check_user_sequence(node.seq)
        eng.cache.check_user_sequence(0)
        eng.seqs.fork_into_user_sequence(node.seq)
        assert eng.seq_tokens[0] == node.tokens()
        with pytest.raises(Exception, match="sequence 0 is in use"):
            eng.seqs.fork_into_user_sequence(node.seq)
        assert_tree_consistent(eng)
    finally:
        eng.close()


def test_promotions_in_a_nearly_full_context_make_room_first(tiny_model, tmp_path):
    """Rows come back after their nodes went to RAM while the context is nearly full: the
    promotions take cells too, so room is made after them, and every run stays exact."""
    with make(tiny_model, tmp_path) as probe:
        kv = probe.info.kv_bytes_per_token
    for cap, n_new in ((340, 8), (300, 24)):  # both failed "the KV cache is full" before
        eng = make(tiny_model, tmp_path, n_ctx=512, resident_bytes=cap * kv)
        try:
            vals = rows(6)
            for v in vals + vals:
                rep = run_prompt(eng, TPL, v, reuse="chain", oneshot=False,
                                 gen=GenerationConfig(max_tokens=n_new))
                assert rep.verdict.exact, rep.verdict.describe()
                assert_tree_consistent(eng)
        finally:
            eng.close()


@pytest.mark.parametrize("tier", ["ram", "file"])
def test_a_prefix_run_brings_its_prefix_from_a_lower_tier_inside_its_own_clock(tiny_model, tmp_path,
                                                                               monkeypatch, tier):
    """Promoting the static prefix back from RAM or a file is part of the warm run (its
    restore time), not done by the lookup of the prefix's node before the run's clock starts.
    Each promotion here moves the clock on by 10 s: the warm restore time must hold them all."""
    import time

    eng = make(tiny_model, tmp_path)
    try:
        node = eng.prime_node(TPL)
        _evict_down(eng, [node], tier)
        assert eng.prime_node(TPL, resident=False).tier == tier  # found, left where it is
        real_clock, real_promote = time.perf_counter, eng.cache.tiers.materialise
        skipped = [0.0]
        monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + skipped[0])

        def slow_promotion(n):
            skipped[0] += 10.0
            return real_promote(n)

        monkeypatch.setattr(eng.cache.tiers, "materialise", slow_promotion)
        eng.work.reset()  # nothing of the prefix in the work context: it comes from the cache
        rep = run_prompt(eng, TPL, {"c1": value(2), "question": "why?"}, reuse="prefix",
                         gen=GEN, oneshot=False)
        assert rep.hit_tier == tier and rep.reused_tokens == node.depth
        assert rep.verdict.equivalence == "bit-identical", rep.verdict.describe()
        assert rep.warm.restore_ms >= skipped[0] * 1000  # every promotion inside the clock
        # a snapshot of all the prefix's cells is the copy the work context takes, from RAM or
        # from its file: nothing is restored into the cache's context on the way
        assert skipped[0] == 0
        assert rep.warm.ttft_ms >= rep.warm.restore_ms
    finally:
        eng.close()
