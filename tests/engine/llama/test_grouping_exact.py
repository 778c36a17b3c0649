"""Batch grouping, measured: the kernel measurement's probe compares the bits of a suffix
evaluated in one batch and in uneven batches; where a kernel computes cells alike in any
batches, chain mode batches plainly and reuses cached prompts up to any token, and every run's
cold reference (which replays other batches than the cells were made in) proves it again."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
from app.engine.llama import kernel_measure as km
from app.engine.llama.kernel_choice import KernelChoice, score
from app.engine.llama.kernel_measure import KernelMeasurement, KernelTiming, probe_sizes
from app.engine.llama.native import ContextParams, NativeModel
from app.engine.llama.batch_policy import (batch_end_at_or_before, batch_starts, clear_of_single,
                                        shared_history)
from tests.cache_checks import assert_tree_consistent

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
A = "the world is a question of the answer"
B1 = "hello answer of the context and the world is"
B2 = "hello answer of the context but a helpful assistant"  # shares B1's first words
GEN = GenerationConfig(max_tokens=4)


def measure(model_path, kernels, n_ctx=512) -> KernelMeasurement:
    model = NativeModel(str(model_path), 0, True)
    try:
        m = KernelMeasurement(model, ContextParams(n_ctx=n_ctx, n_batch=128, n_threads=1),
                              kernels=kernels)
        assert m.run()
        return m
    finally:
        model.close()


def test_probe_batches_are_uneven_two_tokens_or_more_and_cover_the_suffix():
    assert probe_sizes(64) == (2, 13, 29, 20)
    for n in range(2, 130):
        sizes = probe_sizes(n)
        assert sum(sizes) == n and min(sizes) >= 2  # never a lone token (batch_policy.py)
    assert len({s % 4 for s in probe_sizes(64)}) > 1  # rows multiplied in fours see remainders


def test_the_probe_is_filled_for_every_kernel_and_sees_a_changed_bit(tiny_model, monkeypatch):
    m = measure(tiny_model, (False, True))
    assert set(m.grouping_exact) == {False, True}
    assert {t.flash_attn: t.grouping_exact for t in m.result.timings} == m.grouping_exact
    # the same batches as the one-batch evaluation: llama.cpp is deterministic, so equal bits
    monkeypatch.setattr(km, "probe_sizes", lambda n: (n,))
    assert measure(tiny_model, (False, True)).grouping_exact == {False: True, True: True}
    # one token different in the probe's suffix: its cells differ, and the probe says so
    feed = KernelMeasurement._feed_suffix

    def other_token(self, ctx, sizes):
        self.tokens[-1] = (self.tokens[-1] + 1) % self.model.n_vocab
        try:
            feed(self, ctx, sizes)
        finally:
            self.tokens[-1] = (self.tokens[-1] - 1) % self.model.n_vocab
    monkeypatch.setattr(KernelMeasurement, "_probe_grouping",
                        lambda self, k: (other_token(self, self._restored(k), (self.n_suffix,)),
                                         self.grouping_exact.__setitem__(
                                             k, km.fingerprint(self._context(k)) == self._one_print[k])))
    assert measure(tiny_model, (False,)).grouping_exact == {False: False}


def test_a_grouping_exact_kernel_scores_chain_by_its_one_batch_time():
    exact = KernelTiming(False, 5.0, 600.0, 900.0, grouping_exact=True)
    cut = KernelTiming(True, 5.0, 550.0, 900.0, grouping_exact=False)
    assert score(exact, "chain") == pytest.approx(600.0)
    assert score(cut, "chain") == pytest.approx(0.25 * 550 + 0.75 * 900)
    assert score(replace(exact, grouping_exact=None), "chain") == score(replace(exact, grouping_exact=False), "chain")
    assert KernelChoice(False, "measured", "", (exact, cut)).grouping_exact
    assert not KernelChoice(True, "measured", "", (exact, cut)).grouping_exact
    assert not KernelChoice(False, "set", "chosen in the settings").grouping_exact


def test_any_boundary_shares_up_to_the_common_tokens():
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9]
    assert shared_history(a, [0, 2], b, [0, 2], 5) == 2  # batch ends only
    assert shared_history(a, [0, 2], b, [0, 2], 5, any_boundary=True) == 4
    assert batch_end_at_or_before([0, 2], 6, 5) == 2
    assert batch_end_at_or_before([0, 2], 6, 5, any_boundary=True) == 5
    assert batch_end_at_or_before([0, 2], 6, 9, any_boundary=True) == 6


def test_sharing_never_leaves_a_lone_token_the_history_batched_with_others():
    # a batch started at 4 and went on: ending at 5 would make the cold run replay 4 alone
    assert clear_of_single(5, {0, 4}, 9) == 4
    assert clear_of_single(5, {0, 4, 5}, 9) == 5  # the history computed 4 alone too
    assert clear_of_single(5, {0, 4}, 5) == 5  # its last batch was [4, 5)
    assert clear_of_single(5, {0, 4}, None) == 4  # a node's end is no batch end
    assert batch_end_at_or_before([0, 4], 9, 5, any_boundary=True) == 4
    a, b = [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 9]
    assert shared_history(a, [0, 4], b, [0], 6, any_boundary=True) == 4
    # the other history's lone-token rule applies too, and then the first's again
    assert shared_history(a, [0, 3], b, [0, 4], 6, any_boundary=True) == 3


def engine_with_kernel(tiny_model, flash_attn: bool, exact: bool | None, n_batch=32) -> Engine:
    """An engine on one kernel whose choice carries a probe verdict (measured by the caller)."""
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=n_batch,
                              n_threads=1, flash_attn="on" if flash_attn else "off"))
    t = KernelTiming(flash_attn, 1.0, 10.0, 20.0, grouping_exact=exact)
    eng.kernel_state.choice = KernelChoice(flash_attn, "measured", "test", (t,))
    return eng


def run(eng, c1, c2, q, **kw):
    return run_prompt(eng, TPL, {"c1": c1, "c2": c2, "question": q}, gen=GEN, **kw)


def test_chain_on_the_measured_kernel_is_bit_identical_batched_as_measured(tiny_model):
    """The measured verdict for flash attention off decides chain's batches; either way every
    reuse is bit-identical to a cold run that replays other batches than the cells were made in."""
    exact = measure(tiny_model, (False,)).grouping_exact[False]
    with engine_with_kernel(tiny_model, False, exact) as eng:
        assert eng.grouping_exact is exact
        first = run(eng, A, B1, "why?")
        p, n = first.prefix_tokens, first.prompt_tokens
        plain = batch_starts(p, n, eng.config.n_batch)
        warm_starts = [s for s in first.plan if p <= s < n]
        assert (warm_starts == plain) is exact  # no batch per segment on an exact kernel
        assert first.verdict.equivalence == "bit-identical"
        labels = {nd.label for nd in eng.cache.tree if nd.tier != "gone"}
        assert any(lb.startswith("<c1>") for lb in labels)  # segment ends stored either way
        second = run(eng, A, B2, "how?")
        assert second.verdict.equivalence == "bit-identical"
        c1_end = next(nd.depth for nd in eng.cache.tree if nd.label.startswith("<c1>"))
        if exact:
            # B2 shares B1's first words: reused up to the common tokens, past <c1>'s end,
            # in the middle of the batch that made them
            assert second.reused_tokens > c1_end
            assert second.reused_tokens not in first.plan
        else:
            assert second.reused_tokens == c1_end
        assert_tree_consistent(eng)


def test_a_wrong_grouping_claim_is_caught_by_the_cold_reference(tiny_model):
    """Claiming flash attention's tiled path (64+ tokens a batch) is grouping-exact: chain then
    reuses cells made in a 100-token batch and the cold run makes them in a smaller one; the
    verdict must not say bit-identical."""
    long_a = " ".join(["hello world of the answer and question"] * 12)
    long_b = " ".join(["the context of a helpful assistant is"] * 12)
    with engine_with_kernel(tiny_model, True, True, n_batch=256) as eng:
        first = run(eng, long_a, long_b, "why?")
        assert first.evaluated_tokens >= 128 and first.verdict.exact
        again = run(eng, long_a, long_b, "how so?")
        assert again.reused_tokens > first.prefix_tokens + 64
        assert again.verdict.equivalence != "bit-identical"


@pytest.mark.parametrize("exact", [True, False])
def test_a_chain_run_after_compose_never_keeps_the_composed_cells(tiny_model, exact):
    """Compose leaves the work context holding a module's cells shifted into place: the same
    tokens as the next prompt's, not the same cells. The next chain run copies the cached
    prompt's cells instead (before, on a grouping-exact kernel it kept them: |Δlogit| 8.3)."""
    with engine_with_kernel(tiny_model, False, exact) as eng:
        run(eng, A, B1, "why?")
        run(eng, B2, B1, "why?")  # caches <c1> = B2 and <c2> = B1
        # warm only: a cold run would evaluate in the work context after it and leave it empty
        # (a composed history is never kept), and this is about what the composed run leaves
        run(eng, B2, B1, "what?", reuse="compose", cold=False)
        assert eng.work.composed_from is not None
        assert not run(eng, B2, B1, "what?", reuse="compose").verdict.exact
        assert eng.work.tokens == [] and eng.work.composed_from is None  # after its cold run
        run(eng, B2, B1, "what?", reuse="compose", cold=False)
        assert eng.work.composed_from is not None
        after = run(eng, B2, B1, "how?")
        assert [s.split(" = ")[0] for s, _n in after.sources][-2:] == ["<c1>", "<c2>"]
        assert after.copied_tokens > 0  # the composed cells were not kept
        assert after.verdict.equivalence == "bit-identical"
        assert eng.work.composed_from is None
