"""Chain's batches on a kernel whose results depend on how tokens are batched (flash attention
on, not grouping-exact): a job whose rows are all known (a benchmark, a run over several rows)
cuts a batch at a segment only where another of its rows can reuse that segment's end, so rows
that share only the static prefix are batched as prefix mode batches them; a single run cuts at
every segment, for the later runs it cannot see. Every reuse stays bit-identical."""
from __future__ import annotations

import pytest

from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt
from app.engine import session_flows as flows
from app.engine.benchmarks import bench_rows as bench_module
from app.engine.llama.kernel_choice import KernelChoice
from app.engine.llama.kernel_measure import KernelTiming
from app.engine.prompts.prompt_segments import prompt_segments
from app.engine.prompts.rows import Row
from app.engine.session import Options

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
A = "the world is a question of the answer and the context of it"
B1 = "hello answer of the context and the world is"
B2 = "quiet assistant, the world of a helpful question"
GEN = GenerationConfig(max_tokens=3)
# rows that share nothing after the static prefix (their first letters differ)
ALONE = [{"c1": "xylophone " + A, "c2": "zebra " + B1, "question": "why?"},
         {"c1": "kettle " + B1, "c2": "marble " + A, "question": "how?"},
         {"c1": "pebble " + B2, "c2": "violet " + A, "question": "when?"}]
# rows 1 and 2 share <c1>; row 3 shares nothing after the prefix
SHARING = [{"c1": A, "c2": B1, "question": "why?"},
           {"c1": A, "c2": B2, "question": "how?"},
           {"c1": "orange " + B2, "c2": "lemon " + A, "question": "what?"}]


@pytest.fixture
def flash_engine(tiny_model):
    """An engine on flash attention whose probe found it not grouping-exact."""
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=128, n_threads=1,
                              flash_attn="on"))
    t = KernelTiming(True, 1.0, 10.0, 20.0, grouping_exact=False)
    eng.kernel_state.choice = KernelChoice(True, "measured", "test", (t,))
    assert not eng.grouping_exact
    yield eng
    eng.close()


def run_job(eng, rows, reuse="chain"):
    plan = flows.run_plan(TPL, [Row(i + 1, v) for i, v in enumerate(rows)],
                          Options(reuse_mode=reuse, max_tokens=GEN.max_tokens), snapshot=False)
    return [r.report for r in flows.run_rows(eng, plan).records]


def segment_starts(eng, values):
    tokens = eng.tokenize(TPL.fill(values))
    return [s.start for s in prompt_segments(eng.tokenize, TPL, values, tokens)]


def test_rows_sharing_only_the_static_prefix_batch_as_prefix_mode(flash_engine):
    chain = run_job(flash_engine, ALONE)
    prefix = run_job(flash_engine, ALONE, reuse="prefix")
    for c, p, values in zip(chain, prefix, ALONE):
        assert c.reused_tokens == p.reused_tokens == c.prefix_tokens
        assert c.plan == p.plan  # the same batches, so the same cost
        assert not set(segment_starts(flash_engine, values)[2:]) & set(c.plan)
        assert c.verdict.equivalence == "bit-identical"
        assert c.breakdown.batching_note == ""


def test_a_shared_segment_still_gets_its_batch_and_a_later_row_reuses_it(flash_engine):
    first, second, third = run_job(flash_engine, SHARING)
    c1_end = segment_starts(flash_engine, SHARING[0])[2]
    assert c1_end in first.plan  # row 2 can reuse <c1>: its end is a batch end
    assert second.reused_tokens == c1_end  # and row 2 does, up to there
    assert any(name.startswith("<c1>") for name, _n in second.sources)
    assert [r.verdict.equivalence for r in (first, second, third)] == ["bit-identical"] * 3
    # what row 1 left past <c1> no other row shares: no batch of its own
    assert not set(segment_starts(flash_engine, SHARING[0])[3:]) & set(first.plan)
    # row 3 shares nothing after the prefix: batched as prefix mode would
    alone = run_prompt(flash_engine, TPL, SHARING[2], reuse="prefix", gen=GEN, cold=False)
    assert third.plan == alone.plan


def test_a_single_run_cuts_at_every_segment_for_later_runs(flash_engine):
    first = run_prompt(flash_engine, TPL, ALONE[0], gen=GEN)
    starts = segment_starts(flash_engine, ALONE[0])
    assert set(starts[2:]) <= set(first.plan)  # every segment after the prefix: a batch start
    labels = {nd.label for nd in flash_engine.cache.tree if nd.tier != "gone"}
    assert any(lb.startswith("<c1>") for lb in labels)
    # a later single run sharing <c1> reuses it, bit-identical to its cold run
    later = run_prompt(flash_engine, TPL, {**ALONE[0], "c2": "other words", "question": "who?"},
                       gen=GEN)
    assert later.reused_tokens == starts[2]
    assert later.verdict.equivalence == "bit-identical"


def test_a_run_over_one_row_is_a_single_run(flash_engine):
    report, = run_job(flash_engine, ALONE[:1])
    assert set(segment_starts(flash_engine, ALONE[0])[2:]) <= set(report.plan)


def test_a_segment_end_inside_a_batch_is_not_stored(flash_engine):
    run_job(flash_engine, ALONE)
    labels = [nd.label for nd in flash_engine.cache.tree if nd.tier != "gone"]
    # each row's whole prompt is a node, no node ends inside one of its batches
    assert not any(lb.startswith(("<c1>", "<c2>")) for lb in labels)


def test_the_benchmark_foresees_chains_batches(flash_engine, monkeypatch):
    """The plan's cold runs are the ones the benchmark makes: chain shares prefix mode's cold
    run on rows that share only the static prefix, and has its own where a segment is reused."""
    plans = []
    real = bench_module.plan_bench

    def keep(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(bench_module, "plan_bench", keep)
    rows = [Row(i + 1, v) for i, v in enumerate(SHARING + ALONE)]
    res = bench_module.bench_rows(flash_engine, TPL, rows, modes=("prefix", "chain", "compose"),
                                  gen=GEN)
    (plan, _start), = plans
    kinds, ran = plan.pass_kinds(), plan.run_kinds()
    assert kinds == ran, [(st.label, k, r) for st, k, r in zip(plan.steps, kinds, ran) if k != r]
    # where chain stored no node after the prefix (rows that share nothing), compose builds
    # both of its modules; row 1's <c1> node serves as row 1's and row 2's first module
    built = {st.label: sum(p.kind == "module" for p in st.passes) for st in plan.steps}
    assert built["row 2 · compose"] == 1
    assert all(built[f"row {n} · compose"] == 2 for n in range(3, 7))
    colds = {st.label: k.count("cold") for st, k in zip(plan.steps, ran)}
    per_row = {n: sum(c for label, c in colds.items() if label.startswith(f"row {n} "))
               for n in range(1, 7)}
    # compose has a cold run of its own on every row; rows 1 (its <c1> is reused, so chain
    # cuts there) and 2 (reuses it) one per mode, the others one for prefix and chain
    assert per_row[1] == per_row[2] == 3
    assert per_row[3] == per_row[4] == per_row[5] == per_row[6] == 2
    assert all(r.equivalence == "bit-identical" for r in res.rows if r.reuse != "compose")


def test_a_hybrid_model_stores_its_nodes_only_where_a_batch_ends(arch_models):
    """A hybrid model keeps its recurrent state only where a batch ends: a segment end inside
    a batch is not stored, a shared one is and is reused, bit-identical."""
    with Engine(EngineConfig(model_path=str(arch_models["lfm2"]), n_ctx=1024, n_batch=128,
                             n_threads=1)) as eng:
        assert eng.stateful and not eng.grouping_exact
        first, second, third = run_job(eng, SHARING)
        c1_end = segment_starts(eng, SHARING[0])[2]
        assert c1_end in first.plan and second.reused_tokens == c1_end
        assert [r.verdict.equivalence for r in (first, second, third)] == ["bit-identical"] * 3
        labels = [nd.label for nd in eng.cache.tree if nd.tier != "gone"]
        assert not any(lb.startswith("<c2>") for lb in labels)  # inside a batch: not stored
