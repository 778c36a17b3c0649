"""Prefix states in the session (app/engine/state_flows.py): one load behaviour for the window
and the CLI, and "a state belongs to its model" checked in the session."""
from dataclasses import replace

import pytest

from app.cli.engine_options import load_state_file
from app.engine import Engine, EngineConfig, StateFileError, Template
from app.engine import kv_flows, state_flows
from app.engine.states.llama_state_file import save_state
from app.engine.session import Session

TPL = Template.parse("hello world of the answer and question. " * 8 + "<q>")


def _engine(model, **kw):
    return Engine(EngineConfig(model_path=str(model), n_ctx=512, n_batch=32, n_threads=1, **kw))


@pytest.fixture
def saved(tiny_model, tmp_path):
    """A primed state of the tiny model in both formats, and that model's ModelInfo."""
    with _engine(tiny_model) as eng:
        state = eng.prime(TPL)
        save_state(state, tmp_path / "p.kvstate")
        save_state(state, tmp_path / "p.bin", "llama")
        return state, eng.info, tmp_path


@pytest.mark.parametrize("name", ["p.kvstate", "p.bin"])
def test_the_clis_state_is_loaded_as_the_windows_checked_and_adopted(tiny_model, saved, name):
    state, _info, folder = saved
    for load in (lambda e, p: state_flows.load_state(e, p, TPL),  # the window's job
                 lambda e, p: load_state_file(e, str(p), TPL)):  # the CLI's --state
        with _engine(tiny_model) as eng:
            got = load(eng, folder / name)
            assert got.tokens == state.tokens
            # in the radix cache already: a run of the template forks it from there
            assert [n.label for n in kv_flows.cached_sequences(eng).values()] == ["saved state"]


def test_a_state_of_another_model_is_refused_by_the_session_and_the_engine(
        tiny_model, other_tiny_model, saved):
    state, info, folder = saved
    with _engine(other_tiny_model) as other:
        other_info = other.info
        with pytest.raises(StateFileError) as engine_says:  # the CLI's --state, the window's load
            state_flows.load_state(other, folder / "p.kvstate", TPL)
    s = Session()
    s.set_model(info)
    s.set_state(state, "p.kvstate")
    assert s.set_model(replace(info, n_ctx=1024)) == ""
    assert s.state is state  # the same model loaded again keeps it
    why = s.set_model(other_info)
    assert why == str(engine_says.value) and "another model" in why
    assert s.state is None
    with pytest.raises(StateFileError, match="another model"):
        s.set_state(state)
    assert s.state is None
    # a context with other KV types cannot take it either
    s.set_model(info)
    s.set_state(state)
    assert "KV types" in s.set_model(replace(info, type_k="q8_0", type_v="q8_0"))


def test_a_llama_cpp_state_belongs_to_the_model_it_was_loaded_with(tiny_model, other_tiny_model,
                                                                    saved):
    state, info, folder = saved
    with _engine(tiny_model) as eng:
        theirs = state_flows.load_state(eng, folder / "p.bin", TPL)
    with _engine(other_tiny_model) as other:
        other_info = other.info
    s = Session()
    s.set_model(info)
    s.set_state(theirs, "p.bin")  # it names no model: the one it was checked against stands in
    assert s.set_model(info) == "" and s.state is theirs
    assert "loaded for another model" in s.set_model(other_info) and s.state is None


def test_the_window_keeps_the_state_through_a_reload_and_says_why_another_model_drops_it(
        qtbot, make_window, other_tiny_model):
    from app.ui.engine_worker import JobKind
    from tests.ui_actions import PRIME, trigger, wait_for_job

    w = make_window()
    w.editor.set_text(TPL.source)
    assert trigger(qtbot, w, PRIME).outcome == "done"
    primed = w.session.state
    # the same model in a larger context: the state still belongs to it (it used to be dropped)
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, lambda: w.load_model(replace(w.config, n_ctx=2048)))
    assert w.session.state is primed
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL,
                 lambda: w.load_model(replace(w.config, model_path=str(other_tiny_model))))
    assert w.session.state is None
    said = w.status.currentMessage()
    assert "the primed state was dropped: this state was made with another model" in said
    with pytest.raises(StateFileError, match="another model"):  # and Undo cannot bring it back
        w.session.set_state(primed)
