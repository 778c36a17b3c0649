"""Batch threads follow the cores other programs leave free (llama/thread_fit.py), and a
batch's result does not depend on how many threads computed it."""
from dataclasses import replace

import numpy as np
import pytest

from app.engine.llama import thread_fit
from app.engine.llama.native import ContextParams, NativeContext, NativeModel
from app.engine.llama.thread_fit import ThreadFit
from app.engine.llama.batch_feed import feed_batches
from app.engine.llama.batch_policy import batch_starts


class Machine:
    """A machine whose busy CPU seconds, our own CPU seconds and clock the test moves."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0

    def run(self, seconds: float, others: float, ours: float = 0.0) -> None:
        self.t += seconds
        self.busy += seconds * (others + ours)
        self.own += seconds * ours

    def fit(self, n_cores: int = 4, fixed: int = 0) -> ThreadFit:
        return ThreadFit(fixed, n_cores, busy_s=lambda: self.busy, own_s=lambda: self.own,
                         clock=lambda: self.t)


def test_a_quiet_machine_gives_every_core():
    m = Machine()
    fit = m.fit()
    assert fit.threads() == 4  # nothing measured yet: llama.cpp's own default
    m.run(2.0, others=0.1, ours=4.0)
    assert fit.threads() == 4
    assert fit.reading().describe().startswith("4 batch threads (auto: other programs used 0.1")


def test_busy_cores_are_left_to_the_programs_using_them():
    m = Machine()
    fit = m.fit()
    m.run(2.0, others=2.0, ours=2.0)
    assert fit.threads() == 2
    m.run(2.0, others=4.0)  # everything busy: one thread still runs
    assert fit.threads() == 1
    m.run(3.0, others=0.0, ours=1.0)  # they stopped: the cores come back
    assert fit.threads() == 4


def test_background_noise_does_not_take_a_core_but_half_a_core_does():
    m = Machine()
    fit = m.fit(n_cores=2)
    m.run(2.0, others=0.4)
    assert fit.threads() == 2
    m.run(2.0, others=0.6)
    assert fit.threads() == 1


def test_short_spans_wait_for_more_time_and_recent_time_counts_most():
    m = Machine()
    fit = m.fit()
    m.run(0.05, others=4.0)  # one jiffy or five: not enough to go on
    assert fit.threads() == 4 and fit.other_cores is None
    m.run(0.05, others=4.0)
    assert fit.threads() == 1  # 0.1 s in all: measured
    m.run(0.5, others=0.0, ours=4.0)
    assert fit.threads() in (2, 3)
    assert 1.5 < fit.other_cores < 2.5  # half a second of quiet halves the estimate


def test_a_count_the_user_set_is_kept_and_no_source_means_all_cores():
    m = Machine()
    fit = m.fit(fixed=3)
    m.run(2.0, others=4.0)
    assert fit.threads() == 3 and not fit.adaptive
    blind = ThreadFit(0, 4, busy_s=None)
    blind._busy = None  # e.g. macOS: no busy-time source
    assert blind.threads() == 4


@pytest.fixture
def tiny(tiny_model):
    model = NativeModel(tiny_model)
    yield model
    model.close()


@pytest.mark.parametrize("fa", [False, True])
def test_a_batch_gives_the_same_bits_with_any_thread_count(tiny, fa, monkeypatch):
    """The batches of one prompt, each with another thread count, give the logits a single
    thread gives: what the fit changes between batches cannot change a run's result."""
    tokens = [(37 * i + 11) % tiny.n_vocab for i in range(150)]
    starts = batch_starts(0, len(tokens), 40)

    def run(counts):
        m = Machine()
        fit = m.fit(n_cores=4)
        monkeypatch.setattr(thread_fit, "_SHARED", fit)
        ctx = NativeContext(tiny, replace(ContextParams(n_ctx=512, n_batch=64, n_seq_max=1),
                                          flash_attn=fa))
        seen = []
        try:
            def decode(entries):
                m.run(1.0, others=4.0 - counts[len(seen) % len(counts)])
                ctx.decode(entries)
                seen.append(ctx.batch_threads)

            feed_batches(decode, tokens, 0, starts)
            return ctx.logits(-1), seen
        finally:
            ctx.close()

    one, threads_one = run([1])
    mixed, threads_mixed = run([4, 2, 3, 1])
    assert set(threads_one) == {1} and len(set(threads_mixed)) > 1
    assert np.array_equal(one, mixed)


def test_a_run_generates_on_one_pinned_count_whatever_the_load_does():
    m = Machine()
    fit = m.fit()
    m.run(2.0, others=0.0)
    with fit.pinned() as n:
        assert n == 4
        m.run(2.0, others=4.0)  # the machine fills up mid-run
        assert fit.threads() == 1  # batches follow it (their bits do not depend on it) ...
        assert fit.generation_threads() == 4  # ... one-token decodes keep the run's count
        with fit.pinned() as inner:  # a run inside a run (a benchmark's row) keeps the outer
            assert inner == 4
    assert fit.generation_threads() == 1  # the next run starts from the load as it is
