"""The run's slot (app/engine/slot/): the work context's and the forked sequence's behind one
interface, each bringing a cache hit in, evaluating planned batches and giving nodes back."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.engine import Engine, EngineConfig, Template
from app.engine.slot.forked_slot import ForkedSlot
from app.engine.slot.run_slot import NodeEnd, runs_forked
from app.engine.slot.work_slot import WorkSlot
from tests.cache_checks import assert_tree_consistent
from tests.paths import REPO_ROOT

ENGINE = REPO_ROOT / "app" / "engine"
TPL = Template.parse("<|im_start|>system\nanswer from the context. " * 4 + "\n<q><|im_end|>\n")


# a sliding-window model (gemma3) runs in a sequence of the cache's own context
@pytest.fixture(params=[("llama", WorkSlot), ("gemma3", ForkedSlot)], ids=["work", "forked"])
def engine(request, arch_models):
    arch, kind = request.param
    with Engine(EngineConfig(model_path=str(arch_models[arch]), n_ctx=1024, n_batch=32,
                             n_threads=1)) as eng:
        yield eng, kind


def test_a_slot_brings_a_hit_evaluates_and_gives_the_segment_ends_back(engine):
    e, kind = engine
    prefix = e.prime_node(TPL)
    tokens = e.tokenize(TPL.fill({"q": "hello world, the answer of the question"}))
    mid, end = prefix.depth + 5, len(tokens)
    hit = e.cache.lookup(tokens, limit=prefix.depth)
    with e.slot(end - hit.reused, promote=(hit.node,)) as slot:
        assert type(slot) is kind
        hit = slot.whole(hit)
        slot.bring(hit, tokens)
        assert slot.held == hit.reused == prefix.depth
        starts = slot.starts(end, [mid])
        assert mid in starts and starts[0] == hit.reused
        logits = slot.evaluate(tokens[hit.reused:], starts, stage="warm",
                               nodes=[NodeEnd(mid, "first"), NodeEnd(end, "second")])
        assert logits is not None and slot.held == end
        # the history a cold run replays: the prefix's batches, then the ones just planned
        assert slot.history(end) == [c for c in prefix.all_cuts()] + starts
        slot.step(int(logits.argmax()))
        assert slot.held == end + 1
        nodes = slot.flush()
        assert [(n.label, n.depth) for n in nodes] == [("first", mid), ("second", end)]
        assert slot.flush() == []  # given back once
    again = e.cache.lookup(tokens)
    assert again.node is nodes[-1] and again.reused == end
    assert_tree_consistent(e)


def test_the_cache_reads_nothing_of_a_slot():
    """The cache hands cells out and takes them back: no module of cache/ imports the slot's
    package or the runs', nor reads a work context."""
    for src in (ENGINE / "cache").glob("*.py"):
        tree = ast.parse(src.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert not module.startswith(("slot", "runs")), (src.name, module)
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("work", "snapshots"), (src.name, node.lineno)


def test_runs_evaluate_only_through_a_slot():
    """Warm runs, compose and forked batches evaluate in a slot (a forked batch's k rows in
    ForkedRows): no module of runs/ or benchmarks/ feeds batches, decodes, or takes, forks or
    gives back the cache's sequences itself, but the cold reference, which evaluates in a
    context of its own."""
    own_context = {"cold_reference.py"}
    reaches = {"take_work_seq", "give_back", "fork", "fork_into", "decode"}
    owners = {"seqs", "cache", "ctx"}  # the cache context's sequences, the cache, a context
    for package in ("runs", "benchmarks"):
        for src in (ENGINE / package).glob("*.py"):
            if src.name in own_context:
                continue
            for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    assert not (node.module or "").endswith("batch_feed"), src.name
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = ast.unparse(node.func.value).split(".")[-1]
                    assert not (node.func.attr in reaches and owner in owners), \
                        (src.name, node.lineno, ast.unparse(node.func))


# modules and functions that read the sliding window for what the window itself changes, not
# for where a run evaluates: nothing else of the engine reads it
WINDOW_READERS = {
    ("llama/model_traits.py", None): "reads it from the model",
    ("slot/run_slot.py", "runs_forked"): "where runs evaluate: the one decision",
    ("kv_engine.py", "n_swa"): "the engine's window, for front ends",
    ("kv_engine.py", "_open_contexts"): "the debug log's parse and the cache's restored cells",
}
SLOT_KINDS = {"runs_forked", "forked_slot", "ForkedSlot", "WorkSlot"}


def _window_reads_and_slot_kinds(src: Path):
    """(function, line) of each read of ``n_swa``, and (name, line) of each use of a slot kind
    or of the decision, in one module."""
    tree = ast.parse(src.read_text(encoding="utf-8"))
    reads, kinds = [], []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Attribute) and child.attr == "n_swa":
                reads.append((function, child.lineno))
            if isinstance(child, ast.Name) and child.id in SLOT_KINDS:
                kinds.append((child.id, child.lineno))
            if isinstance(child, ast.alias) and child.name in SLOT_KINDS:
                kinds.append((child.name, node.lineno))
            visit(child, inner)

    visit(tree, None)
    return reads, kinds


def test_one_place_decides_where_runs_evaluate():
    """Work context or forked sequence: run_slot.runs_forked decides it from the model's window;
    the engine's slot accessors, the generation threads and the kernel choice ask it, and
    every other module asks the engine (``runs_in_work_context``) or takes the slot it opens.
    No other module reads the window to choose, opens or names a slot kind."""
    asks = {"kv_engine.py", "engine_config.py", "engine_kernels.py"}  # runs_forked's callers
    for src in sorted(ENGINE.rglob("*.py")):
        rel = src.relative_to(ENGINE).as_posix()
        reads, kinds = _window_reads_and_slot_kinds(src)
        for function, line in reads:
            assert (rel, function) in WINDOW_READERS or (rel, None) in WINDOW_READERS, \
                f"{rel}:{line} ({function}) reads n_swa: ask Engine.runs_in_work_context"
        if rel.startswith("slot/"):
            continue
        for name, line in kinds:
            assert rel in asks and (name == "runs_forked" or rel == "kv_engine.py"), \
                f"{rel}:{line} names {name}: take the engine's slot or ask runs_in_work_context"


def test_the_decision_check_sees_a_module_that_decides_again(tmp_path):
    src = tmp_path / "planner.py"
    src.write_text("from ..slot.work_slot import WorkSlot\n"
                   "def plan(engine, slot):\n"
                   "    windowed = engine.n_swa > 0\n"
                   "    return windowed or isinstance(slot, WorkSlot)\n", encoding="utf-8")
    reads, kinds = _window_reads_and_slot_kinds(src)
    assert reads == [("plan", 3)]
    assert kinds == [("WorkSlot", 1), ("WorkSlot", 4)]


@pytest.mark.parametrize("arch, forked", [("llama", False), ("gemma3", True)])
def test_runs_fork_on_sliding_window_models_only(arch_models, arch, forked):
    """The decision, read from the model: the engine's accessors and its slot agree with it."""
    with Engine(EngineConfig(model_path=str(arch_models[arch]), n_ctx=512, n_batch=32,
                             n_threads=1)) as e:
        assert runs_forked(e.info.traits) is forked
        assert e.runs_in_work_context is not forked
        with e.slot() as slot:
            assert slot.windowed is forked
            assert (slot.ctx is e.ctx) is forked
