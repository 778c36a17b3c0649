"""Generation on several threads (issue 24 item 4): warm and cold runs stay bit-identical.

With flash attention, llama.cpp splits a one-token decode over 512 cells or more into one chunk
of the cache per thread (ggml-cpu ops.cpp, use_split_kv_path), so the sums depend on the thread
count and on how far the cache extends. Warm runs generate in the work context, where the cells
and the cache's extent are the cold run's, so several threads are exact there on every family
and both kernels. Sliding-window models generate in the cache's shared cells: they keep one
thread by default, and the last tests show what two threads there (or a wider cache) change.
"""
from __future__ import annotations

import llama_cpp as L
import pytest

from app.cli.engine_options import engine_options
from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
from app.engine.slot.work_context import STAGING, WorkContext
from app.engine.runs.cold_reference import ColdReference
from app.engine.llama.thread_count import llama_default_threads
from tests.tiny_model import write_arch_model

# one architecture of each kind that runs in the work context: attention, hybrid (convolution,
# Mamba 2, Nemotron-H's three kinds, Gated DeltaNet) and recurrent
WORK_CONTEXT_ARCHS = ("llama", "lfm2", "granitehybrid", "nemotron_h", "qwen35", "mamba2")

# prompts of ~480 tokens: generation attends over 512 cells or more (the split path)
TPL = Template.parse("<|im_start|>system\nanswer from the context.\n"
                     + "hello world of the answer and question. " * 8
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
A = "the world is a question of the answer. " * 2
B = "hello answer of the context and the world. " * 2
C = "a helpful assistant answers the question. " * 2
# the second row shares the first's first passage, the third both passages: chain reuses past
# the static prefix
ROWS = ({"c1": A, "c2": B, "question": "why?"}, {"c1": A, "c2": C, "question": "how?"},
        {"c1": A, "c2": B, "question": "and what?"})
GEN = GenerationConfig(max_tokens=4)  # the last three from one-token decodes


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("thread-models")
    return lambda arch: (root / f"{arch}.gguf" if (root / f"{arch}.gguf").exists()
                         else write_arch_model(root / f"{arch}.gguf", arch))


def _engine(path, fa: str, n_threads_gen: int = 2) -> Engine:
    return Engine(EngineConfig(model_path=str(path), n_ctx=2048, n_batch=128, n_threads=2,
                               n_threads_gen=n_threads_gen, flash_attn=fa))


def _chain_rows(e: Engine) -> list:
    reps = [run_prompt(e, TPL, v, reuse="chain", gen=GEN) for v in ROWS]
    assert all(r.prompt_tokens > 256 for r in reps)  # 512 cells or more while generating
    assert reps[1].reused_tokens > reps[1].prefix_tokens  # through <c1>
    assert reps[2].reused_tokens > reps[1].reused_tokens  # through <c2>
    return reps


@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("arch", WORK_CONTEXT_ARCHS)
def test_two_generation_threads_keep_warm_runs_bit_identical(models, arch, fa):
    with _engine(models(arch), fa) as e:
        assert e.runs_in_work_context
        assert L.llama_n_threads(e.work.ctx.ptr) == L.llama_n_threads(e.cold.context.ptr) == 2
        for rep in _chain_rows(e):
            assert rep.verdict.exact, f"{rep.reused_tokens} reused: {rep.verdict.describe()}"


def test_sliding_window_models_keep_one_generation_thread_by_default(models):
    # flash attention only: without it the engine refuses a sliding-window model
    with _engine(models("gemma3"), "on", n_threads_gen=0) as e:
        assert not e.runs_in_work_context and e.config.n_threads_gen == 1
        assert L.llama_n_threads(e.ctx.ptr) == 1
        for rep in _chain_rows(e):
            assert rep.verdict.exact, rep.verdict.describe()


def test_two_threads_in_the_caches_shared_cells_are_caught(models):
    """Why sliding-window models keep one thread: their warm runs generate in the cache's
    context, which extends further than the cold run's, so two threads split it elsewhere."""
    with _engine(models("gemma3"), "on", n_threads_gen=2) as e:
        verdicts = [rep.verdict for rep in _chain_rows(e)]
    assert not all(v.exact for v in verdicts)
    assert all(v.tokens_equal for v in verdicts)  # a difference in the last bits, caught


@pytest.mark.parametrize("threads, exact", [(1, True), (2, False)])
def test_a_work_context_wider_than_the_cold_run_is_caught_on_two_threads(models, monkeypatch,
                                                                          threads, exact):
    """The check can fail: other cells after the run's own (as the cache's shared context has)
    change two-thread generation, not one-thread generation."""
    real, cold_real, in_cold = WorkContext.step, ColdReference.run, []

    def cold_run(self, *a, **k):  # the cold run steps in the work context too: as it is
        in_cold.append(True)
        try:
            return cold_real(self, *a, **k)
        finally:
            in_cold.pop()

    def step_beside_other_cells(self, token):
        if not in_cold and self.ctx.pos_range(STAGING)[1] < 0:
            for a in range(0, 384, 128):  # 384 cells of another sequence after the run's
                self.ctx.decode([(5, p, (STAGING,), False) for p in range(a, a + 128)])
        real(self, token)

    monkeypatch.setattr(WorkContext, "step", step_beside_other_cells)
    monkeypatch.setattr(ColdReference, "run", cold_run)
    with _engine(models("llama"), "on", n_threads_gen=threads) as e:
        rep = run_prompt(e, TPL, ROWS[0], reuse="chain", gen=GEN)
    assert rep.verdict.exact is exact, rep.verdict.describe()


def test_thread_defaults_are_llama_cpps(tiny_model):
    import argparse

    p = argparse.ArgumentParser()
    engine_options(p)
    args = p.parse_args([])
    assert args.threads == args.threads_batch == EngineConfig().n_threads_gen == 0
    # llama.cpp's tools: one thread per physical core, generation as many as batches
    assert 1 <= llama_default_threads() <= len(__import__("os").sched_getaffinity(0))
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_batch=32)) as e:
        assert e.config.n_threads_gen == 0
        n = llama_default_threads()
        assert L.llama_n_threads(e.ctx.ptr) == L.llama_n_threads_batch(e.ctx.ptr) == n


@pytest.mark.parametrize("held", [True, False])
def test_auto_threads_generate_a_run_on_one_count_when_the_load_changes_mid_run(
        models, monkeypatch, held):
    """With auto threads (-tb 0 -t 0) the count follows the machine's load, but a run's warm and
    cold paths generate on the count taken when it started: the machine filling up between them
    changes its batches' threads (same bits) and not its generation's. Unheld, flash
    attention's split of the cache by thread count shows in the verdict."""
    from contextlib import contextmanager

    from app.engine.llama import native, thread_fit
    from tests.engine.llama.test_thread_fit import Machine

    machine = Machine()
    monkeypatch.setattr(thread_fit, "_SHARED", machine.fit(n_cores=2))
    monkeypatch.setattr(native, "llama_default_threads", lambda: 2)
    if not held:
        monkeypatch.setattr(thread_fit.ThreadFit, "pinned", contextmanager(lambda self: (yield 0)))
    machine.run(2.0, others=0.0)  # quiet: two threads
    real, seen, warm_threads = ColdReference.run, [], []

    def cold_on_a_busy_machine(self, *args, **kwargs):
        # the warm run's generation threads, before the cold run takes the work context
        warm_threads.append(L.llama_n_threads(self.context.ptr))
        machine.run(2.0, others=2.0)  # every core busy from here on: one thread
        out = real(self, *args, **kwargs)
        seen.append(L.llama_n_threads(self.context.ptr))
        return out

    monkeypatch.setattr(ColdReference, "run", cold_on_a_busy_machine)
    with Engine(EngineConfig(model_path=str(models("llama")), n_ctx=2048, n_batch=128,
                             n_threads=0, n_threads_gen=0, flash_attn="on")) as e:
        rep = run_prompt(e, TPL, ROWS[0], reuse="chain", gen=GEN, oneshot=False)
    assert warm_threads == [2] and seen == [2 if held else 1]
    assert rep.verdict.exact is held, rep.verdict.describe()
