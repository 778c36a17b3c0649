"""The Cache panel on a hybrid model (issue 23): each node's size shows the recurrent state it
keeps at its depth. The real window, offscreen."""
from __future__ import annotations

from PySide6.QtCore import QSettings

from app.engine import EngineConfig
from tests.engine.cache.test_stateful_cache import TPL
from tests.tiny_model import write_arch_model
from tests.ui_actions import RUN_WARM, Answers, trigger


def test_cache_panel_shows_each_nodes_recurrent_state(qtbot, tmp_path):
    from app.ui.main_window import MainWindow

    model = write_arch_model(tmp_path / "lfm2.gguf", "lfm2")
    cfg = EngineConfig(model_path=str(model), n_ctx=1024, n_batch=32, n_threads=1,
                       flash_attn="off")
    w = MainWindow(cfg, settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat),
                   states_dir=tmp_path / "states", autosave_dir=tmp_path / "autosave",
                   log_path=tmp_path / "kvprimer.log", ask=Answers(), open_example=False,
                   offer_restore=False, load_model=True)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.engine_status.info is not None and not w.engine_status.busy,
                    timeout=20000)
    w.editor.set_text(TPL.source)
    w.session.set_rows([{"c1": "the world", "c2": "the answer", "question": "why"}])
    w.session.set_options(reuse_mode="chain")
    assert trigger(qtbot, w, RUN_WARM).outcome == "done"
    panel = w.cache_panel
    qtbot.waitUntil(lambda: panel.snapshot is not None and len(panel.snapshot.nodes) >= 3,
                    timeout=10000)
    top = panel.tree.topLevelItem(0)
    assert top.text(0) == "static prefix" and "(recurrent " in top.text(4)
    assert all(n.recurrent_bytes > 0 for n in panel.snapshot.nodes)
    bugs = [m for m in w.errors.messages("error") if m.startswith("internal error")]
    assert not bugs, bugs
