"""State files and the attention kernel in the window: Save state for llama.cpp asks which
kernel the reading context runs (auto, on, off, as `prime --format llama --for-fa`) and writes
V in that kernel's layout, the same file the CLI writes; Load state takes a state primed with
the other kernel, rewritten, and says so in its one status line."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QInputDialog

from app.engine import Engine, EngineConfig, Template
from app.engine.states.llama_state_file import read_any_state
from app.engine.states.seq_state_layout import parse
from app.engine.states.v_layout import v_layout_of
from app.ui.engine_worker import JobKind
from app.ui.main_window import STATE_FILTERS
from app.ui.states_library import FOR_FA_CHOICES
from tests.ui_actions import PRIME, action, trigger, wait_for_job

TEXT = ("you are a helpful assistant. the context is: "
        + "hello world of the answer and question. " * 5 + "<question>")
ENGINE = ["-c", "1024", "-b", "32", "-tb", "1"]  # what make_window(n_ctx=1024) runs


def test_the_kernel_question_offers_the_clis_three_choices_auto_first(qtbot, monkeypatch):
    from app.ui.help_dialogs import ask_dialog

    offered = []

    def ask(_parent, _title, _label, items, current, *_a):
        offered.append((list(items), current))
        return items[2], True

    monkeypatch.setattr(QInputDialog, "getItem", staticmethod(ask))
    assert ask_dialog(None, "for_fa", "which?") == "off"
    (items, current), = offered
    assert items == [label for _, label in FOR_FA_CHOICES] and current == 0
    assert items[0].startswith("auto: llama.cpp's own default")
    monkeypatch.setattr(QInputDialog, "getItem", staticmethod(lambda *a: ("", False)))
    assert ask_dialog(None, "for_fa", "which?") == "cancel"


def transposed(path) -> bool:
    state = read_any_state(path)
    return v_layout_of(parse(state.data, state.seq_state_version))


def test_save_state_for_llama_cpp_asks_the_kernel_and_writes_the_clis_file(
        qtbot, make_window, tmp_path, monkeypatch, tiny_model, capsys):
    from app.cli import main

    w = make_window(n_ctx=1024)
    w.session.set_template(TEXT)
    assert trigger(qtbot, w, PRIME).outcome == "done"
    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TEXT)
    for choice, fa in (("off", False), ("auto", True), ("on", True)):
        path = tmp_path / f"{choice}.bin"
        monkeypatch.setattr("PySide6.QtWidgets.QFileDialog.getSaveFileName",
                            staticmethod(lambda *a, **k: (str(path), STATE_FILTERS[1])))
        w.ask.answers["for_fa"] = choice
        asked = len(w.ask.asked)
        job = wait_for_job(qtbot, w, JobKind.SAVE_STATE,
                           lambda: action(w, "Save state for llama.cpp").trigger())
        assert job.outcome == "done", job.error
        assert w.ask.asked[asked:] == ["for_fa"]
        said = w.status.currentMessage()
        assert f"for contexts with flash attention {'on' if fa else 'off'}" in said, said
        assert ("llama.cpp's default" in said) is (choice == "auto")
        assert transposed(path) is (not fa)  # llama.cpp transposes V without flash attention
        # the CLI's file for the same choice, byte for byte
        cli = tmp_path / f"cli-{choice}.bin"
        assert main(["prime", str(tpl), "-o", str(cli), "--format", "llama", "--for-fa", choice,
                     "-m", str(tiny_model), *ENGINE]) == 0
        capsys.readouterr()
        assert cli.read_bytes() == path.read_bytes()
    # cancelled: nothing written, no job
    path = tmp_path / "never.bin"
    monkeypatch.setattr("PySide6.QtWidgets.QFileDialog.getSaveFileName",
                        staticmethod(lambda *a, **k: (str(path), STATE_FILTERS[1])))
    w.ask.answers["for_fa"] = "cancel"
    assert w.save_state_dialog("llama") is None
    assert not path.exists()
    # a .kvstate keeps the engine's own layout and asks nothing
    asked = len(w.ask.asked)
    monkeypatch.setattr("PySide6.QtWidgets.QFileDialog.getSaveFileName",
                        staticmethod(lambda *a, **k: (str(tmp_path / "own.kvstate"),
                                                      STATE_FILTERS[0])))
    job = wait_for_job(qtbot, w, JobKind.SAVE_STATE, lambda: w.save_state_dialog())
    assert job.outcome == "done" and w.ask.asked[asked:] == []
    assert transposed(tmp_path / "own.kvstate") is False  # the window runs flash attention on


@pytest.mark.parametrize("fmt", ["kvprimer", "llama"])
def test_load_state_primed_with_the_other_kernel_is_rewritten_and_says_so(
        qtbot, make_window, tmp_path, tiny_model, fmt):
    from app.engine.states.llama_state_file import save_state

    path = tmp_path / ("off.kvstate" if fmt == "kvprimer" else "off.bin")
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn="off")) as eng:
        save_state(eng.prime(Template.parse(TEXT)), path, fmt)
    w = make_window(n_ctx=1024)  # flash attention on (tests/conftest.py)
    w.session.set_template(TEXT)
    job = wait_for_job(qtbot, w, JobKind.LOAD_STATE, lambda: w.jobs.load_state(path))
    assert job.outcome == "done", job.error
    said = w.status.currentMessage()
    assert said.startswith(f"loaded the state {path}") and "\n" not in said
    assert "rewritten for flash attention on" in said, said
    assert w.session.state.note == "rewritten for flash attention on"
    assert transposed(path) is True and w.session.state is not None
