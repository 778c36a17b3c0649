"""One loop feeds batches to llama_decode (llama/batch_feed.py): its contract, and that every
evaluator in the project goes through it."""
import ast
import re
from pathlib import Path

import pytest

from app.engine import TaskState
from app.engine.errors import Cancelled
from app.engine.llama.batch_feed import feed_batches, feed_token
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def recorder():
    calls = []
    return calls, calls.append


def test_batches_cover_the_tokens_once_in_order_with_the_last_logits_only():
    calls, decode = recorder()
    feed_batches(decode, [10, 11, 12, 13, 14], 3, [3, 5, 6], seq=2)
    assert calls == [[(10, 3, (2,), False), (11, 4, (2,), False)],
                     [(12, 5, (2,), False)],
                     [(13, 6, (2,), False), (14, 7, (2,), True)]]


def test_no_logits_when_not_wanted_and_nothing_for_no_tokens():
    calls, decode = recorder()
    feed_batches(decode, [1, 2], 0, [0], want_logits=False)
    feed_batches(decode, [], 7, [])
    assert calls == [[(1, 0, (0,), False), (2, 1, (0,), False)]]


@pytest.mark.parametrize("starts", [[1], [0, 0, 2], [0, 3], []])
def test_a_plan_that_does_not_fit_the_tokens_is_refused(starts):
    with pytest.raises(ValueError):
        feed_batches(lambda e: None, [1, 2, 3], 0, starts)


def test_hooks_run_around_each_batch_and_progress_is_reported():
    seen, progress = [], []
    task = TaskState(on_progress=lambda p: progress.append((p.stage, p.done, p.total)))
    feed_batches(lambda e: seen.append(("decode", e[0][1])), [5, 6, 7, 8], 0, [0, 2], task=task,
                 stage="prime", before=lambda a: seen.append(("before", a)),
                 after=lambda a, b: seen.append(("after", a, b)))
    assert seen == [("before", 0), ("decode", 0), ("after", 0, 2),
                    ("before", 2), ("decode", 2), ("after", 2, 4)]
    assert [p for p in progress if p[0] == "prime"] == [("prime", 0, 4), ("prime", 2, 4),
                                                        ("prime", 4, 4)]


def test_cancel_stops_between_batches_and_says_what_is_kept():
    task, calls = TaskState(), []

    def decode(entries):
        calls.append(entries)
        task.cancel()

    with pytest.raises(Cancelled) as err:
        feed_batches(decode, [1, 2, 3, 4], 10, [10, 12], task=task)
    assert len(calls) == 1 and err.value.kept_tokens == 12


def test_a_generated_token_asks_for_its_logits():
    calls, decode = recorder()
    feed_token(decode, 42, 9, seq=1)
    assert calls == [[(42, 9, (1,), True)]]


def test_only_the_feeder_loops_over_batches_into_llama_decode():
    """Every batched evaluation goes through feed_batches: a loop that builds a batch of
    entries for ``.decode([... for i in range(...)])`` anywhere else is a second evaluator."""
    loop = re.compile(r"\.decode\(\[\(.*\bfor \w+ in range\(")
    offenders = [str(p.relative_to(ROOT)) for d in ("app", "bench") for p in (ROOT / d).rglob("*.py")
                 if loop.search(p.read_text(encoding="utf-8"))
                 and p.name != "batch_feed.py"]
    assert offenders == []


def _decode_calls(src: Path) -> list[str]:
    """Where ``src`` calls llama_decode or a ``.decode(entries)`` (text codecs, called with an
    encoding or on a decoder, are not decodes), as "file:Class.function"."""
    out: list[str] = []

    def visit(node: ast.AST, where: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            where = (*where, node.name)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "llama_decode" or (
                    name == "decode" and isinstance(f, ast.Attribute) and not node.keywords
                    and not any(isinstance(a, ast.Constant) for a in node.args)
                    and "decoder" not in ast.unparse(f.value)):
                out.append(f"{src.relative_to(ROOT)}:{'.'.join(where)}")
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(src.read_text(encoding="utf-8")), ())
    return out


# the one-batch calls under the loop: llama.cpp's own, and each owner's one decode that keeps
# what its sequences hold (the loop in batch_feed.py gets them as its ``decode``)
ONE_DECODE = {"app/engine/llama/native.py:NativeContext.decode",
              "app/engine/kv/kv_debug_log.py:TrackedContext.decode",
              "app/engine/kv/sequence_ops.py:SequenceOps.decode",
              "app/engine/kv_engine.py:Engine.decode",
              "app/engine/slot/work_context.py:WorkContext._decode",
              "app/crash_probe_child.py:main"}  # a test decode in a child process that may crash


def test_only_the_one_loop_decodes():
    """Evaluations and generation steps call decode through batch_feed.py alone: any other
    call of llama_decode or ``.decode(entries)`` in app/ is a second loop."""
    calls = {c for p in sorted((ROOT / "app").rglob("*.py")) for c in _decode_calls(p)}
    assert calls == ONE_DECODE


def test_the_decode_scan_sees_a_decode_loop(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def run(ctx, batches):\n    for b in batches:\n        ctx.decode(b)\n"
                   "def text(raw):\n    return raw.decode('utf-8')\n")
    found = [c.split(":")[1] for c in _decode_calls_at(bad, tmp_path)]
    assert found == ["run"]


def _decode_calls_at(src: Path, root: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return _decode_calls(src)
    finally:
        ROOT = saved
