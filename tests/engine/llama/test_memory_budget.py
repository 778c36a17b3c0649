"""The memory an engine will take, said before it is spent (issue 35, item 4): the budget's
parts against what llama.cpp then allocates (its own log of each buffer's size), on a tiny
model and on the default model; the refusal of a context that cannot fit; `kvprimer info` and
the Model panel showing the sum."""
from __future__ import annotations

import json
import re

import pytest

from app.cli import main
from app.engine import Engine, EngineConfig
from app.engine.cache.cache_tiers import CacheLimits
from app.engine.errors import MemoryBudgetError
from app.engine.llama import memory_budget as mb
from app.engine.llama.llama_backend import add_log_listener, remove_log_listener

_LINE = re.compile(r"(model|output|KV|RS|compute) buffer size =\s*([0-9.]+) MiB")
MIB = 1 << 20
# llama.cpp logs sizes in MiB with two decimals: half a hundredth of a MiB either way
LOG_ROUNDING = 0.006 * MIB


class BufferLog:
    """llama.cpp's buffer sizes as it logs them while the engine opens: the model's buffers,
    then per context its output, KV and compute buffers (in the order it creates them)."""

    def __init__(self):
        self.model = 0.0
        self.contexts: list[dict[str, float]] = []
        self.named: dict[str, dict[str, float]] = {}

    def __call__(self, _level: int, text: str) -> None:
        m = _LINE.search(text)
        if not m:
            return
        kind, size = m.group(1), float(m.group(2)) * MIB
        if kind == "model":
            self.model += size
        else:
            if kind == "output":  # the first line a context logs
                self.contexts.append({})
            self.contexts[-1][kind] = self.contexts[-1].get(kind, 0.0) + size


def _open_and_log(config: EngineConfig):
    """An engine opened with both contexts (the cache's is opened when its first node is
    placed, on attention-only models) and llama.cpp's buffer log of it, each context's buffers
    by name (``log.named``); the plan of its compute buffers is made first, so the log holds
    real buffers only."""
    Engine(config).close()  # its plan is kept: the engine below makes none, logs none
    log = BufferLog()
    add_log_listener(log)
    try:
        eng = Engine(config)
        order = ["cache", "work"] if eng.ctx.opened else ["work", "cache"]
        eng.work.ctx  # opened when a run or a cold run needs it
        eng.ctx.open()
        assert eng.cold.context is eng.work.ctx  # no context of its own
    finally:
        remove_log_listener(log)
    log.named = dict(zip(order, log.contexts))
    return eng, log


def _check_parts(eng: Engine, log: BufferLog, compute_tolerance: float) -> None:
    budget = eng.info.memory
    assert budget is not None and budget.compute_source == "llama.cpp"
    assert [c.name for c in budget.contexts] == ["cache", "work"]
    assert len(log.contexts) == 2
    for planned in budget.contexts:
        got = log.named[planned.name]
        # K and V: the same bytes, to the log's rounding
        assert abs(planned.kv - got["KV"]) <= LOG_ROUNDING, (planned, got)
        spent = got["compute"] + got["output"]
        assert abs(planned.compute - spent) <= max(compute_tolerance * spent, 2 * LOG_ROUNDING), \
            (planned, got)
    # the weights: llama.cpp's tensor bytes; its buffers round each tensor up to an alignment
    assert log.model and abs(budget.model - log.model) <= 0.02 * log.model + 64 * 1024
    assert budget.total == (budget.model + budget.kv + budget.compute + budget.tiers_cap)
    # the cap the budget counted is the cap the cache keeps to
    assert budget.tiers_cap == eng.cache.tiers.ram_cap
    assert eng.config.cache.ram_bytes or budget.tiers_cap >= mb.RAM_TIER_FLOOR


def test_the_budget_matches_llama_cpps_buffers_on_a_tiny_model(tiny_model):
    config = EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=64, n_threads=1)
    eng, log = _open_and_log(config)
    try:
        # the compute buffer is llama.cpp's own plan: equal to what it allocates, within 1%
        _check_parts(eng, log, 0.01)
        assert eng.info.memory.context("cache").cells == eng.ctx.n_ctx
    finally:
        eng.close()


@pytest.mark.model
def test_the_budget_matches_llama_cpps_buffers_on_the_default_model(default_model):
    config = EngineConfig(n_ctx=8192, n_threads=1, flash_attn="off")
    eng, log = _open_and_log(config)
    try:
        _check_parts(eng, log, 0.01)
        b = eng.info.memory
        # the default model: 23,040 bytes of f16 K and V per token (LLAMA_FACTS.md)
        assert b.context("cache").kv == 23040 * 8192
    finally:
        eng.close()


@pytest.mark.parametrize("arch", ["granitehybrid", "mamba2"])
def test_recurrent_states_are_counted_per_sequence(arch_models, arch):
    """Hybrid and recurrent models keep a recurrent state for every sequence a context has
    room for: the budget's figure against llama.cpp's RS buffers."""
    config = EngineConfig(model_path=str(arch_models[arch]), n_ctx=512, n_batch=32, n_threads=1)
    eng, log = _open_and_log(config)
    try:
        # besides its two contexts the engine opens one-sequence ones to measure a state:
        # the two with the most sequences hold the largest RS buffers
        real = sorted((c for c in log.contexts if "RS" in c), key=lambda c: -c["RS"])[:2]
        for planned, got in zip(eng.info.memory.contexts, real):
            assert planned.recurrent > 0
            assert abs(planned.recurrent - got["RS"]) <= 0.1 * got["RS"] + LOG_ROUNDING
            assert abs(planned.kv - got.get("KV", 0)) <= LOG_ROUNDING
    finally:
        eng.close()


def test_the_estimate_errs_high(tiny_model):
    """Where llama.cpp cannot plan (an older build, a failed dry run), the estimate stands in:
    never below the plan on the configurations tried."""
    from app.engine.llama.native import NativeModel

    model = NativeModel(tiny_model)
    try:
        facts = {**model.facts(), "n_ff": 256}
        for n_ctx, flash in ((512, True), (4096, False), (16384, False)):
            config = EngineConfig(model_path=str(tiny_model), n_ctx=n_ctx, n_batch=64)
            for _name, p in mb.context_sets(config, flash):
                planned = mb.planned_compute(model, [p])[0]
                assert mb.estimated_compute(facts, p, flash) >= planned * 0.95
    finally:
        model.close()


def _low_memory(monkeypatch, available: int) -> None:
    import app.engine.kv_engine as kv_engine

    monkeypatch.setattr(kv_engine, "memory_available", lambda: (available, "MemAvailable"))


def test_a_context_too_big_for_the_memory_is_refused_naming_one_that_fits(tiny_model,
                                                                         monkeypatch):
    avail = 1 << 30
    _low_memory(monkeypatch, avail)
    huge = EngineConfig(model_path=str(tiny_model), n_ctx=1 << 21, n_batch=64, n_threads=1)
    with pytest.raises(MemoryBudgetError) as e:
        Engine(huge)
    msg = str(e.value)
    assert "\n" not in msg
    assert "is available" in msg and "needs" in msg
    named = re.search(r"set the context size to ([0-9,]+) or less", msg)
    fit = int(named.group(1).replace(",", ""))
    assert fit % 256 == 0 and 256 <= fit < huge.n_ctx
    # the size it names opens under the same memory, and its sum is within what is available
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=fit, n_batch=64,
                             n_threads=1)) as eng:
        assert eng.info.memory.total <= avail == eng.info.memory.available


def test_the_cli_refuses_in_one_line_with_the_flags(tiny_model, monkeypatch, capfd):
    _low_memory(monkeypatch, 1 << 30)
    capfd.readouterr()
    rc = main(["info", "-m", str(tiny_model), "-t", "1", "-c", str(1 << 21)])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "-c/--ctx-size" in err[0] and "or less" in err[0]


def test_quantized_kv_is_named_when_it_fits(tiny_model, monkeypatch):
    """Where q8_0 K and V (about half of f16) fit at the context size asked for, the refusal
    names them too."""
    config = EngineConfig(model_path=str(tiny_model), n_ctx=1 << 20, n_batch=64, n_threads=1)
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_batch=64,
                             n_threads=1)) as eng:
        budget = mb.plan_budget(eng.model, config, True, available=(1, "x"))
        facts = eng.model.facts()
    q8 = mb.kv_bytes_per_token(facts, "q8_0", "q8_0") * 2 * config.n_ctx
    # room for the q8_0 cells and a little more, not for the f16 ones
    avail = budget.total - budget.kv + q8 + (1 << 20)
    _low_memory(monkeypatch, avail)
    with pytest.raises(MemoryBudgetError, match="set the KV cache types to q8_0"):
        Engine(config)


def test_info_and_the_model_panel_show_the_sum(tiny_model, capsys, qtbot):
    from app.engine import EngineStatus
    from app.engine.session import Options, Session
    from app.ui.model_panel import ModelPanel

    m = ["-m", str(tiny_model), "-t", "1", "-c", "512"]
    assert main(["info", *m, "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert mem["total"] == mem["model"] + mem["kv_bytes"] + mem["compute_bytes"] + mem["tiers_cap"]
    assert [c["name"] for c in mem["contexts"]] == ["cache", "work"]
    assert main(["info", *m]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("memory: "))
    assert mb.size_text(mem["total"]) in line and "available" in line
    assert "  - cache context: 512 cells, 64 sequences: KV " in text
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=512, n_threads=1)) as eng:
        status = EngineStatus()
        panel = ModelPanel(Session(Options(engine=eng.config)), status)
        qtbot.addWidget(panel)
        status.info = eng.info
        shown = panel.fact_labels["memory"].text()
        assert shown.startswith(mb.size_text(eng.info.memory.total))
        assert "cache: KV" in shown and "RAM tier cap" in shown


def test_the_budget_is_one_line_of_its_parts():
    contexts = (mb.ContextMemory("cache", 4096, 64, 94_371_840, 0, 64_000_000),
                mb.ContextMemory("work", 4096, 2, 94_371_840, 0, 52_000_000))
    b = mb.MemoryBudget(100_000_000, contexts, 512 << 20, 8_000_000_000, "MemAvailable")
    assert b.total == 100_000_000 + 2 * 94_371_840 + 116_000_000 + (512 << 20)
    assert b.fits and "\n" not in b.text()
    assert b.text().startswith(f"{mb.size_text(b.total)} of 8.0 GB available")
    assert not mb.MemoryBudget(1, (), 0, 0).available and mb.MemoryBudget(1, (), 0, 0).fits


def test_the_ram_tiers_cap_holds_a_prefix_as_long_as_the_context():
    MiB, floor = 1 << 20, mb.RAM_TIER_FLOOR
    # a 32k prefix on the default model (750 MB) spills to RAM, not to a file
    assert mb.ram_tier_cap(0, 750 * MiB, None) == 750 * MiB
    assert mb.ram_tier_cap(0, 750 * MiB, 8 << 30) == 750 * MiB
    # never under the floor, never over half the memory the rest of the engine leaves
    assert mb.ram_tier_cap(0, 100 * MiB, None) == floor
    assert mb.ram_tier_cap(0, 4 << 30, 3 << 30) == 1536 * MiB
    assert mb.ram_tier_cap(0, 750 * MiB, 600 * MiB) == floor
    # a cap the user set is the cap
    assert mb.ram_tier_cap(64 * MiB, 750 * MiB, 8 << 30) == 64 * MiB


def test_the_engine_budgets_and_keeps_the_same_ram_cap(tiny_model, monkeypatch):
    _low_memory(monkeypatch, 64 << 30)
    config = EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=64, n_threads=1)
    with Engine(config) as eng:
        whole = eng.info.kv_bytes_per_token * mb.context_cells(2048)
        assert eng.cache.tiers.ram_cap == eng.info.memory.tiers_cap == max(mb.RAM_TIER_FLOOR, whole)
        assert eng.config.cache.ram_bytes == 0  # auto stays auto in what is saved
    set_cap = EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_batch=64, n_threads=1,
                           cache=CacheLimits(ram_bytes=3 << 20))
    with Engine(set_cap) as eng:
        assert eng.cache.tiers.ram_cap == eng.info.memory.tiers_cap == 3 << 20
