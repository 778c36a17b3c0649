"""The Messages view: a chat template's turns edited in the window (role, content, add, remove,
reorder; undoable), the prompt rendered beside them in the loaded model's chat template,
rendered again when the model changes, opened and saved as JSON or YAML."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.engine.prompts.chat_messages import ChatTemplate
from app.ui.engine_worker import JobKind
from app.ui.rendered_prompt import PLACEHOLDER_STYLE, SPECIAL_STYLE, rendered_html
from tests.chat_templates import GEMMA3
from tests.tiny_model import write_tiny_model
from tests.ui_actions import PRIME, RUN_BOTH, answer_file_dialogs, idle, trigger, wait_for_job


@pytest.fixture
def gemma_model(tmp_path):
    return write_tiny_model(tmp_path / "gemma-like.gguf", chat_template=GEMMA3)


def rendered_text(w) -> str:
    return w.messages.rendered.toPlainText()


def test_write_a_three_turn_chat_with_a_placeholder_prime_and_run(qtbot, make_window):
    w = make_window()
    m = w.messages
    w.template_tabs.setCurrentWidget(m)
    assert "Add turn" in m.note.text() or "Open a chat template" in m.note.text()
    qtbot.waitUntil(lambda: m.format is not None, timeout=20000)
    for role, text in (("system", "You are brief."), ("user", "Say hello."),
                       ("user", "Now answer: <question>")):
        qtbot.mouseClick(m.buttons["add"], Qt.LeftButton)
        m.role.setCurrentText(role)
        qtbot.keyClicks(m.content, text)
        m.flush()
    assert [x.role for x in m.chat.messages] == ["system", "user", "user"]
    assert m.chat.placeholders == ["question"]
    # the tiny model has no chat template: ChatML, said in the view's status line
    assert "no chat template" in m.note.text() and "ChatML" in m.note.text()
    assert rendered_text(w).startswith("<|im_start|>system\nYou are brief.<|im_end|>")
    # the model's special tokens are marked; a placeholder shows as in the text editor
    html = rendered_html(w.session.template, m.specials)
    assert f'<span style="{SPECIAL_STYLE}">&lt;|im_start|&gt;</span>' in html
    assert f'<span style="{PLACEHOLDER_STYLE}">&lt;question&gt;</span>' in html
    assert "<|im_start|>" in m.specials and "<|im_end|>" in m.specials
    assert w.session.template.placeholders == ["question"]
    assert w.session.template.static_prefix.endswith("<|im_start|>user\nNow answer: ")
    assert list(w.fillings.fields) == ["question"]
    qtbot.keyClicks(w.fillings.fields["question"], "why?")
    assert trigger(qtbot, w, PRIME).outcome == "done"
    w.fillings.table.selectRow(0)
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    report = w.session.runs[-1].report
    assert report.verdict.equivalence == "bit-identical" and report.reused_tokens > 0


def test_remove_reorder_and_undo_each_step(qtbot, make_window, examples):
    w = make_window()
    m = w.messages
    assert w.project.open_chat(examples / "chat.json")
    qtbot.waitUntil(lambda: m.attached, timeout=20000)
    assert w.template_tabs.currentWidget() is m
    n = len(m.chat.messages)
    first = m.chat.messages[0]
    m.turns.setCurrentRow(1)
    qtbot.mouseClick(m.buttons["up"], Qt.LeftButton)
    assert m.chat.messages[0].role == "user" and m.chat.messages[1] == first
    assert m.turns.currentRow() == 0
    qtbot.mouseClick(m.buttons["remove"], Qt.LeftButton)
    assert len(m.chat.messages) == n - 1 and m.chat.messages[0] == first
    m.turns.setCurrentRow(0)
    m.content.moveCursor(QTextCursor.End)
    qtbot.keyClicks(m.content, " Be kind.")
    qtbot.keyClicks(m.content, " Thanks.")
    m.flush()
    assert m.chat.messages[0].content == first.content + " Be kind. Thanks."
    assert "Be kind. Thanks." in w.session.template_text
    stack = w.edits.stack
    assert stack.undoText() == "edit a message"
    stack.undo()  # the typing undoes as one step
    assert m.chat.messages[0] == first and "Be kind." not in w.session.template_text
    stack.undo()
    assert len(m.chat.messages) == n - 1 + 1
    stack.undo()
    assert m.chat.messages[0] == first and len(m.chat.messages) == n
    stack.undo()  # the chat template opened: the text template before it comes back
    assert m.chat is None and w.session.template_text == ""
    stack.redo()
    assert m.attached and m.chat == ChatTemplate.load(examples / "chat.json")


def test_changing_the_model_renders_again_and_says_so(qtbot, make_window, examples, gemma_model):
    w = make_window()
    m = w.messages
    assert w.project.open_chat(examples / "chat.json")
    qtbot.waitUntil(lambda: m.attached, timeout=20000)
    assert rendered_text(w).startswith("<|im_start|>system\nYou are Pip")
    w.session.set_rows([{"message": "Can I freeze bread?"}])
    wait_for_job(qtbot, w, JobKind.LOAD_MODEL, lambda: w.open_model(str(gemma_model)))
    qtbot.waitUntil(lambda: m.format is not None and "<start_of_turn>" in rendered_text(w),
                    timeout=20000)
    idle(qtbot, w)
    assert rendered_text(w).startswith("<start_of_turn>user\nYou are Pip")
    assert w.session.template.static_prefix.startswith("<start_of_turn>user\nYou are Pip")
    assert w.session.template.placeholders == ["message"]
    said = w.status.currentMessage()
    assert "rendered again" in said and "kvprimer-tiny" in said
    assert "rendered in kvprimer-tiny's chat template" in m.note.text()
    assert "no chat template" not in m.note.text()
    # primed and run in the new model's markup, warm stays bit-identical to cold
    w.fillings.table.selectRow(0)
    assert trigger(qtbot, w, PRIME).outcome == "done"
    assert trigger(qtbot, w, RUN_BOTH).outcome == "done"
    report = w.session.runs[-1].report
    assert report.verdict.equivalence == "bit-identical" and report.reused_tokens > 0


def test_typing_in_the_text_tab_sets_the_messages_aside_until_undo(qtbot, make_window, examples):
    w = make_window()
    m = w.messages
    assert w.project.open_chat(examples / "rag.yaml")
    qtbot.waitUntil(lambda: m.attached, timeout=20000)
    w.project.open_template(examples / "few-shot.tmpl")  # a text template over the chat
    assert not m.attached and not m.turns.isEnabled() and "Undo" in m.note.text()
    assert w.template_tabs.currentWidget() is w.editor
    w.edits.stack.undo()
    assert m.attached and m.turns.isEnabled()
    w.editor.set_text(w.editor.text() + "\nmore")  # typed in the Text tab
    assert not m.attached and not m.content.isEnabled()


def test_save_as_json_or_yaml_and_open_again(qtbot, make_window, tmp_path, monkeypatch, examples):
    w = make_window()
    m = w.messages
    assert w.project.open_chat(examples / "chat.json")
    qtbot.waitUntil(lambda: m.attached, timeout=20000)
    m.turns.setCurrentRow(0)
    m.content.setPlainText("Short system prompt.")
    for name in ("mine.yaml", "mine.json"):
        answer_file_dialogs(monkeypatch, save=(str(tmp_path / name), ""))
        w.project.save_template_dialog()
        saved = ChatTemplate.load(tmp_path / name)
        assert saved == m.chat and saved.messages[0].content == "Short system prompt."
        assert w.session.template_path == str(tmp_path / name)
    assert json.loads((tmp_path / "mine.json").read_text())[0]["content"] == "Short system prompt."
    assert not w.project.template_edited()  # the messages are in their file
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user"}, {"role": "wizard", "content": "x"}]')
    assert not w.project.open_chat(bad)
    assert "message 2 has the role 'wizard'" in w.status.currentMessage()
    assert m.attached and saved == m.chat  # nothing replaced


def test_examples_menu_opens_the_messages_examples_with_their_rows(qtbot, make_window):
    from tests.ui_actions import action

    w = make_window()
    action(w, "rag (messages)").trigger()
    qtbot.waitUntil(lambda: w.messages.attached, timeout=20000)
    assert w.session.template.placeholders == ["c1", "c2", "c3", "question"]
    assert w.session.row_count > 0


def test_a_project_with_a_chat_template_opens_with_its_messages(qtbot, make_window, tmp_path,
                                                                 examples):
    chat_file = tmp_path / "mine.yaml"
    ChatTemplate.load(examples / "chat.json").save(chat_file)
    w = make_window()
    assert w.project.open_chat(chat_file)
    qtbot.waitUntil(lambda: w.messages.attached, timeout=20000)
    project = tmp_path / "p.kvproj"
    w.session.to_project().save(project)
    again = make_window()
    assert not again.messages.attached
    assert again.project.open(project)
    qtbot.waitUntil(lambda: again.messages.attached, timeout=20000)
    assert again.messages.chat == w.messages.chat and again.messages.path == str(chat_file)
    # a file whose messages no longer render to the project's template is not taken for it
    ChatTemplate.load(examples / "rag.yaml").save(chat_file)
    third = make_window()
    assert third.project.open(project)
    idle(qtbot, third)
    qtbot.waitUntil(lambda: third.messages.format is not None, timeout=20000)
    assert third.messages.chat is None and third.session.template_text == w.session.template_text
