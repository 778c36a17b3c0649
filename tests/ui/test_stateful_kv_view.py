"""The KV view of hybrid and recurrent models (tiny ones): each sequence's recurrent state, one
slot beside its attention cells, with its bytes and the position it stands at; the legend says
which layers are which. Engine, `kvprimer kv --json` and the KV Cache dock."""
from __future__ import annotations

import json
import re

import pytest
from PySide6.QtGui import QColor

from app.cli import main
from app.engine import Engine, EngineConfig
from app.ui.engine_worker import EngineWorker, JobKind
from app.ui.kv_dock import KvCacheDock, seq_color
from app.ui.kv_grid import SLOT_H
from tests.engine.llama.test_stateful_info import LEGENDS, STATEFUL, models  # noqa: F401 (a fixture)

TEXT = "the question is hello world and the answer is in the context " * 4


def _engine(path, debug: bool) -> Engine:
    return Engine(EngineConfig(model_path=str(path), n_ctx=512, n_batch=32, n_threads=1,
                               flash_attn="on", kv_debug_log=debug))


@pytest.mark.parametrize("arch", STATEFUL)
@pytest.mark.parametrize("debug", [True, False])
def test_each_sequence_has_one_recurrent_slot_at_its_last_position(models, arch, debug):  # noqa: F811
    with _engine(models[arch], debug) as eng:
        toks = eng.model.tokenize(TEXT)
        n0, n1 = 23, 9
        eng.evaluate(toks[:n0], 0, want_logits=False)
        eng.evaluate(toks[:n1], 2, want_logits=False)
        view = eng.kv_view()
        state = eng.info.traits.recurrent_state_bytes
        assert [(r.seq, r.pos, r.bytes) for r in view.recurrent] == [(0, n0 - 1, state),
                                                                    (2, n1 - 1, state)]
        assert view.layers == LEGENDS[arch] and view.stateful
        if arch in ("mamba", "mamba2"):  # no attention: no cells at all
            assert view.source == "recurrent" and view.sequences == () and view.n_cells == 0
        else:  # the attention cells of each sequence, from position 0 (the cell map's if any)
            assert view.source == ("debug-log" if debug else "ranges")
            assert [(u.seq, u.cells, u.pos_min, u.pos_max) for u in view.sequences] == \
                [(0, n0, 0, n0 - 1), (2, n1, 0, n1 - 1)]
        eng.evaluate(toks[n0:n0 + 5], 0, want_logits=False)  # the state moves on, same size
        assert eng.kv_view().slot(0).pos == n0 + 4 and eng.kv_view().slot(0).bytes == state
        d = json.loads(json.dumps(view.as_dict()))
        assert d["layers"] == LEGENDS[arch]
        assert d["recurrent"] == [{"seq": 0, "bytes": state, "pos": n0 - 1},
                                  {"seq": 2, "bytes": state, "pos": n1 - 1}]


def test_attention_models_have_no_recurrent_slots(arch_models):
    with _engine(arch_models["llama"], True) as eng:
        eng.evaluate(eng.model.tokenize(TEXT)[:10], 0, want_logits=False)
        view = eng.kv_view()
        assert view.recurrent == () and not view.stateful
        assert set(view.as_dict()) == {"n_cells", "used_cells", "source", "sequences"}


@pytest.mark.parametrize("arch", STATEFUL)
@pytest.mark.parametrize("fa", ["on", "off"])
def test_kv_on_a_stateful_model_never_answers_with_a_code(models, tmp_path, capsys, arch, fa):  # noqa: F811
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("you are a helpful assistant; answer the question\n<q>\n")
    code = main(["kv", str(tpl), "-m", str(models[arch]), "-fa", fa, "-c", "512",
                 "--fork", "1"])
    out, err = capsys.readouterr()
    assert not re.search(r"code -?\d", out + err)
    if code == 0:  # (priming them needs the radix cache's recurrent snapshots)
        assert f"layers: {LEGENDS[arch]}" in out and "seq 0: recurrent state at position" in out
    else:
        assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not hasattr(Engine, "refuse_stateful"),
                    reason="priming a stateful model needs the radix cache's recurrent "
                           "snapshots (issue 23's caching, branch hybrid)")
@pytest.mark.parametrize("arch", ["lfm2", "mamba2"])
def test_kv_json_includes_the_recurrent_states(arch_models, tmp_path, capsys, arch):
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("you are a helpful assistant; answer the question\n<q>\n")
    code = main(["kv", str(tpl), "-m", str(arch_models[arch]), "-fa", "on", "-c", "512", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["layers"] == LEGENDS[arch]
    (prefix,) = {r["pos"] for r in d["recurrent"]}  # the primed node and its fork into 0
    assert {r["seq"] for r in d["recurrent"]} >= {0} and prefix > 0


# ---- the KV Cache dock


@pytest.fixture
def stateful_dock(qtbot, arch_models, request):
    w = EngineWorker()
    d = KvCacheDock(w)
    qtbot.addWidget(d)
    d.resize(520, 560)
    d.show()
    w.load(EngineConfig(model_path=str(arch_models[request.param]), n_ctx=512, n_batch=32,
                        n_threads=1, flash_attn="on"))
    qtbot.waitUntil(lambda: d.view is not None, timeout=10000)
    yield d
    w.shutdown()


@pytest.mark.parametrize("stateful_dock", ["lfm2"], indirect=True)
def test_dock_shows_a_hybrids_recurrent_state_beside_its_cells(qtbot, stateful_dock):
    d = stateful_dock
    d.worker.submit(JobKind.TASK, lambda e, t: e.evaluate(list(range(260, 272)), 0))
    qtbot.waitUntil(lambda: d.view.slot(0) is not None, timeout=10000)
    slot = d.view.slot(0)
    assert slot.pos == 11 and "layers: 1 attention layer, 3 convolution layers" in d.legend.text()
    assert "12 cells · positions 0–11" in d.legend.text()
    assert "recurrent state at 11 (" in d.legend.text()
    g = d.grid
    assert g.top() > SLOT_H
    img = g.grab().toImage()
    assert img.pixelColor(2, 2) == seq_color(0)  # the slot, in its sequence's colour
    assert g.slot_at(g.rect().topLeft()) == slot
    assert "taken in positions 0–11" in g.slot_tooltip(slot)
    assert g.cell_at(g.cell_rect_center(3)) == 3  # the cells sit below the strip
    assert img.pixelColor(g.cell_rect_center(3)) == seq_color(0)
    assert img.pixelColor(g.cell_rect_center(12)) == QColor("#d4d4d4")


@pytest.mark.parametrize("stateful_dock", ["mamba2"], indirect=True)
def test_dock_shows_a_recurrent_models_states_alone(qtbot, stateful_dock):
    d = stateful_dock
    d.worker.submit(JobKind.TASK, lambda e, t: e.evaluate(list(range(260, 267)), 3))
    qtbot.waitUntil(lambda: d.view.slot(3) is not None, timeout=10000)
    assert d.view.source == "recurrent" and d.view.slot(3).pos == 6
    assert "recurrent state at 6 (" in d.legend.text() and "cells ·" not in d.legend.text()
    assert d.grid.cell_at(d.grid.cell_rect_center(0)) is None
    assert 3 in d._listed()
