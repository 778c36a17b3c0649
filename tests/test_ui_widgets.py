"""The panels on their own (no model needed), and the Qt-free workspace file."""
from __future__ import annotations

import pytest

from app.engine import EngineConfig, Template
from app.ui.fillings_panel import FillingsPanel
from app.ui.states_library import StatesLibrary, state_meta
from app.ui.template_editor import TemplateHighlighter
from app.workspace import Autosaver, Workspace, WorkspaceError


def test_paste_from_a_spreadsheet_skips_the_header(qtbot):
    p = FillingsPanel()
    qtbot.addWidget(p)
    p.set_placeholders(["q", "r"])
    assert p.paste("q\tr\nwhat\tthis\nwhy\tthat\r\n") == 2
    assert p.rows() == [{"q": "what", "r": "this"}, {"q": "why", "r": "that"}]
    p.table.selectRow(0)
    p.duplicate_rows()
    assert p.rows()[-1] == {"q": "what", "r": "this"} and len(p.rows()) == 3
    p.table.selectRow(1)
    p.delete_rows()
    assert [r["q"] for r in p.rows()] == ["what", "what"]
    # the form edits the current row
    p.table.selectRow(0)
    p.fields["r"].setPlainText("edited")
    assert p.rows()[0] == {"q": "what", "r": "edited"}


def test_import_rows_checks_columns_against_placeholders(qtbot, tmp_path, examples):
    p = FillingsPanel()
    qtbot.addWidget(p)
    errors = []
    p.error.connect(errors.append)
    p.set_placeholders(["c1", "c2", "c3", "question"])
    assert p.import_file(str(examples / "rag-rows.csv")) >= 2
    assert p.rows()[0]["question"]
    bad = tmp_path / "bad.csv"
    bad.write_text("c1,c2,nope,question\na,b,c,d\n")
    assert p.import_file(str(bad)) == 0
    assert "column 'nope' is not a placeholder" in errors[0] or "no column 'c3'" in errors[0]


def test_changing_placeholders_keeps_the_values_of_kept_columns(qtbot):
    p = FillingsPanel()
    qtbot.addWidget(p)
    p.set_placeholders(["a", "b"])
    p.set_rows([{"a": "1", "b": "2"}])
    p.set_placeholders(["b", "c"])
    assert p.rows() == [{"b": "2", "c": ""}]


def test_highlighter_marks_placeholders_and_special_tokens(qtbot):
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument("<|im_start|>hi <name> \\<lit> a < b")
    h = TemplateHighlighter(doc)
    h.rehighlight()
    layout = doc.firstBlock().layout()
    formats = {(r.start, r.length) for r in layout.formats()}
    assert (0, len("<|im_start|>")) in formats
    assert (len("<|im_start|>hi "), len("<name>")) in formats
    assert not any(r.start == doc.toPlainText().index("<lit>") for r in layout.formats())


def test_states_library_lists_renames_and_deletes(qtbot, tmp_path, engine):
    state = engine.prime(Template.parse("hello world of the answer " * 5 + "<q>"))
    state.save(tmp_path / "one.kvstate")
    lib = StatesLibrary(tmp_path, confirm=lambda text: True)
    qtbot.addWidget(lib)
    assert [p.name for p in lib.paths] == ["one.kvstate"]
    assert lib.table.item(0, 1).text() == state.model_name
    assert lib.table.item(0, 2).text() == str(state.n_tokens)
    assert state_meta(tmp_path / "one.kvstate")["n_tokens"] == state.n_tokens
    lib.select(tmp_path / "one.kvstate")
    assert lib.rename_selected("two") == tmp_path / "two.kvstate"
    assert lib.rename_selected("a/b") is None and "slash" in lib.message.text()
    lib.select(tmp_path / "two.kvstate")
    lib.delete_selected()
    assert lib.paths == [] and not (tmp_path / "two.kvstate").exists()


def test_workspace_round_trip_and_bad_files(tmp_path):
    ws = Workspace(template="a <b>", rows=[{"b": "x"}], placeholders=["b"],
                   settings={"engine": {"n_ctx": 512}}, results=[{"kind": "run", "speedup": 3.0}])
    ws.save(tmp_path / "p.kvproj")
    assert Workspace.load(tmp_path / "p.kvproj") == ws
    (tmp_path / "bad.kvproj").write_text("{not json")
    with pytest.raises(WorkspaceError, match="not a KV Primer project"):
        Workspace.load(tmp_path / "bad.kvproj")
    with pytest.raises(WorkspaceError, match="no project file"):
        Workspace.load(tmp_path / "none.kvproj")
    saver = Autosaver(tmp_path / "auto" / "autosave.kvproj")
    assert saver.pending_restore() is None
    assert saver.write(ws) and not saver.write(ws)  # unchanged: not written again
    assert saver.pending_restore() == ws
    saver.discard()
    assert saver.pending_restore() is None


def test_model_panel_builds_the_config(qtbot):
    from app.ui.model_panel import ModelPanel

    p = ModelPanel(EngineConfig(model_path="/m.gguf", n_ctx=1024, n_threads=1))
    qtbot.addWidget(p)
    got = []
    p.apply_requested.connect(got.append)
    p.n_ctx.setValue(2048)
    p.type_k.setCurrentText("q8_0")
    p.apply.click()
    assert got[0].n_ctx == 2048 and got[0].type_k == "q8_0" and got[0].model_path == "/m.gguf"
    assert got[0].n_threads == 1


def test_many_signal_emits_do_not_use_up_true():
    """PySide6 6.12.0's emit() drops a reference to True each time; app.ui guards against it."""
    import sys

    import app.ui  # noqa: F401  (the guard runs on import)
    from PySide6.QtCore import QObject, Signal

    class Pinger(QObject):
        ping = Signal()

    p = Pinger()
    for _ in range(20000):  # far more than True's own reference count without the guard
        p.ping.emit()
    assert sys.getrefcount(True) > 20000
