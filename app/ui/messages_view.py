"""The Messages view: a chat template as a list of turns to edit (role, content; add, remove,
reorder), beside the prompt the loaded model's own chat template renders from them, read-only,
special tokens marked.

The session holds the rendered prompt as its template (what the Text tab shows and what
prime, run and bench use) and the messages it renders (``Session.chat_template``: what the
Server tab's chat API sends); this view edits the messages. Each edit is one undoable command
(typing in a content merges into one). Loading another model renders the messages again in
that model's chat template and says so. Editing the text in the Text tab, or opening a text
template, leaves the messages aside until Undo brings their rendering back.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QUndoCommand
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QListWidget, QPlainTextEdit,
                               QSplitter, QTabWidget, QTextEdit, QToolButton, QVBoxLayout,
                               QWidget)

from ..engine import KvPrimerError, TemplateError
from ..engine.prompts.chat_format import ChatFormat, chat_format_of
from ..engine.prompts.chat_messages import ROLES, ChatMessage, ChatTemplate, is_chat_file
from ..engine.prompts.chat_render import render_chat
from ..engine.session import Session
from .engine_worker import EngineWorker, JobKind
from .model_events import follow
from .session_edits import SessionEdits
from .rendered_prompt import rendered_html
from .template_editor import TemplateHighlighter

_TYPING_ID = 0x4D53  # typing in one message's content undoes as one step


class SetChat(QUndoCommand):
    """The messages replaced (an edit, or a chat template opened); Undo brings back the old
    ones, or the text template shown before there were any."""

    def __init__(self, view: "MessagesView", chat: ChatTemplate | None, path: str, label: str,
                 typing: int | None = None):
        super().__init__(label)
        s = view.session
        self.view, self.new, self.typing = view, (chat, path), typing
        self.old = (view.chat, view.path)
        self.old_text = (s.template_text, s.template_path)

    def redo(self) -> None:
        self.view.apply(*self.new)

    def undo(self) -> None:
        self.view.apply(*self.old, text=self.old_text if self.old[0] is None else None)

    def id(self) -> int:
        return _TYPING_ID if self.typing is not None else -1

    def mergeWith(self, other: QUndoCommand) -> bool:
        if not isinstance(other, SetChat) or other.typing != self.typing:
            return False
        self.new = other.new
        return True


def _summary(m: ChatMessage) -> str:
    first = " ".join(m.content.split())
    return f"{m.role}: {first[:70]}{'…' if len(first) > 70 else ''}" if first else f"{m.role}: —"


class MessagesView(QWidget):
    def __init__(self, worker: EngineWorker, session: Session, edits: SessionEdits,
                 said: Callable[[str], None] | None = None, parent: QWidget | None = None,
                 debounce_ms: int = 300):
        super().__init__(parent)
        self.worker, self.session, self.edits = worker, session, edits
        self.said = said or (lambda _text: None)
        self.chat: ChatTemplate | None = None
        self.path = ""  # the chat template's file ("" until saved)
        self.format: ChatFormat | None = None  # the loaded model's chat template
        self.specials: list[str] = []  # the loaded model's special-token texts
        self._model_key = None  # the model the format was read from
        self._shown = None  # the text this view last gave the session
        self._ui = False  # widgets being filled from the messages: their signals are not edits
        self._editing = -1  # the message the content box shows
        self._select: int | None = None  # the turn to select when the list is filled again
        self._problem = ""  # why the messages cannot be rendered
        self._rendered = None  # their last rendering (RenderedChat)

        self.turns = QListWidget(objectName="chatTurns")
        self.role = QComboBox(objectName="chatRole")
        self.role.addItems(ROLES)
        self.content = QPlainTextEdit(objectName="chatContent")
        self.content.setPlaceholderText("The message; <name> is a placeholder")
        self.highlighter = TemplateHighlighter(self.content.document())
        self.buttons = {}
        row = QHBoxLayout()
        for name, text, tip in (("add", "Add turn", "Add a turn after the last"),
                                ("remove", "Remove", "Remove the selected turn"),
                                ("up", "↑", "Move the selected turn up"),
                                ("down", "↓", "Move the selected turn down")):
            b = QToolButton(text=text, objectName=f"chat_{name}", toolTip=tip)
            row.addWidget(b)
            self.buttons[name] = b
        row.addStretch(1)
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.turns, 2)
        lay.addLayout(row)
        lay.addWidget(self.role)
        lay.addWidget(self.content, 3)
        self.rendered = QTextEdit(objectName="chatRendered", readOnly=True)
        self.note = QLabel(objectName="chatStatus", wordWrap=True)
        self.note.setTextInteractionFlags(Qt.TextSelectableByMouse)
        right = QWidget()
        lay = QVBoxLayout(right)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Prompt in the model's chat template, special tokens marked",
                             wordWrap=True))
        lay.addWidget(self.rendered, 1)
        split = QSplitter(Qt.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(split, 1)
        outer.addWidget(self.note)

        self._timer = QTimer(self, singleShot=True, interval=debounce_ms)
        self._timer.timeout.connect(self.flush)
        self.content.textChanged.connect(lambda: None if self._ui else self._timer.start())
        self.role.currentTextChanged.connect(self._role_changed)
        self.turns.currentRowChanged.connect(self._turn_selected)
        self.buttons["add"].clicked.connect(self.add_turn)
        self.buttons["remove"].clicked.connect(self.remove_turn)
        self.buttons["up"].clicked.connect(lambda: self.move_turn(-1))
        self.buttons["down"].clicked.connect(lambda: self.move_turn(1))
        follow(self, worker.engine_status.events.info, lambda _info: self._model_changed())
        follow(self, session.events.template, self._template_changed)
        self._model_changed()
        self._fill()
        self._show_state()

    # ---- what the view holds
    @property
    def attached(self) -> bool:
        """Do the messages make the session's template (not text typed or opened since)?"""
        return self.chat is not None and self._shown == self.session.template_text

    def open_chat(self, chat: ChatTemplate, path: str, label: str) -> None:
        self.flush()
        self.edits.stack.push(SetChat(self, chat, path, label))

    def apply(self, chat: ChatTemplate | None, path: str,
              text: tuple[str, str] | None = None) -> None:
        """Show these messages and give their rendering to the session (undo/redo land here);
        ``text``: the text template to show again when there are no messages."""
        self._timer.stop()
        self.chat, self.path = chat, path
        self._fill()
        if chat is None:
            self._shown = None
            if text is not None:
                self.session.set_template(*text)
            # after the text: while it is still the messages' rendering, it would be taken
            # for them again
            self.session.set_chat(None)
            self._show_state()
            return
        self.render()

    def render(self) -> bool:
        """Render the messages for the loaded model; the session gets the result. False (and
        the reason shown) when they cannot be rendered yet."""
        if self.chat is None:
            return False
        if self.format is None:
            self._show_state()
            return False
        try:
            rendered = render_chat(self.format, self.chat)
        except TemplateError as e:
            self._problem = str(e)
            self._show_state()
            return False
        self._problem = ""
        self._rendered = rendered
        self._shown = rendered.template.source
        self.session.set_template(rendered.template.source, self.path)
        # after the text, so the template is never taken for these messages' rendering early
        self.session.set_chat(self.chat, rendered.template.source)
        self._show_state()
        return True

    # ---- edits (each one an undoable command)
    def flush(self) -> None:
        """Typed content reaches the messages now."""
        self._timer.stop()
        k = self._editing
        if self.chat is None or not 0 <= k < len(self.chat.messages):
            return
        text = self.content.toPlainText()
        if text != self.chat.messages[k].content:
            self._edit(self._with(k, content=text), "edit a message", typing=k,
                       select=self.turns.currentRow())

    def _role_changed(self, role: str) -> None:
        k = self._editing
        if self._ui or self.chat is None or not 0 <= k < len(self.chat.messages):
            return
        if role != self.chat.messages[k].role:
            self.flush()
            self._edit(self._with(k, role=role), f"set a message's role to {role}")

    def add_turn(self) -> None:
        self.flush()
        msgs = list(self.chat.messages) if self.chat else []
        role = "assistant" if msgs and msgs[-1].role == "user" else "user"
        msgs.append(ChatMessage(role, ""))
        self._edit(ChatTemplate(tuple(msgs), self.chat.tools if self.chat else ()),
                   "add a turn", select=len(msgs) - 1)
        self.content.setFocus()

    def remove_turn(self) -> None:
        self.flush()
        k = self.turns.currentRow()
        if self.chat is None or not 0 <= k < len(self.chat.messages) or len(self.chat.messages) < 2:
            return
        msgs = list(self.chat.messages)
        del msgs[k]
        self._edit(ChatTemplate(tuple(msgs), self.chat.tools), "remove a turn",
                   select=min(k, len(msgs) - 1))

    def move_turn(self, step: int) -> None:
        self.flush()
        k = self.turns.currentRow()
        if self.chat is None or not (0 <= k < len(self.chat.messages)
                                     and 0 <= k + step < len(self.chat.messages)):
            return
        msgs = list(self.chat.messages)
        msgs[k], msgs[k + step] = msgs[k + step], msgs[k]
        self._edit(ChatTemplate(tuple(msgs), self.chat.tools),
                   "move a turn " + ("up" if step < 0 else "down"), select=k + step)

    def _with(self, k: int, **change) -> ChatTemplate:
        msgs = list(self.chat.messages)
        m = msgs[k]
        msgs[k] = ChatMessage(change.get("role", m.role), change.get("content", m.content))
        return ChatTemplate(tuple(msgs), self.chat.tools)

    def _edit(self, chat: ChatTemplate, label: str, typing: int | None = None,
              select: int | None = None) -> None:
        if select is not None:
            self._select = select
        self.edits.stack.push(SetChat(self, chat, self.path, label, typing))

    # ---- the model's chat template (read on the worker thread: it is a llama.cpp call)
    def _model_changed(self) -> None:
        status = self.worker.engine_status
        info = status.info
        key = (info.path, info.sha256) if info is not None else None
        if key == self._model_key:
            return
        self._model_key = key
        if info is None or status.closed:
            self.format, self.specials = None, []
            self._show_state()
            return

        def read(engine, _task):
            model = engine.model
            return (chat_format_of(model.ptr, model.vocab, engine.info.name),
                    [text for text, _tok in model.control_tokens()])

        def done(result):
            if key != self._model_key:
                return  # another model loaded meanwhile
            had = self.format is not None
            self.format, self.specials = result
            if self.chat is None:
                self._adopt_file()
            if self.chat is not None and (self.attached or self._shown is None) \
                    and self.render() and had:
                name = self.format.model_name or "the new model"
                self.said(f"the messages are rendered again in {name}'s chat template"
                          + (f"; {self.format.note}" if self.format.note else ""))

        def failed(msg):
            self.note.setText(f"cannot read the model's chat template: {msg}")

        self.worker.submit(JobKind.COUNT_TOKENS, read, label="read the chat template",
                           on_done=done, on_error=failed, cancel_running=False)

    # ---- showing
    def _template_changed(self) -> None:
        if self.chat is None:
            self._adopt_file()
        self._show_state()

    def _adopt_file(self) -> None:
        """A template whose file is a chat template and which is its rendering (a project
        reopened, work restored) is shown as those messages again."""
        s = self.session
        if self.format is None or not is_chat_file(s.template_path):
            return
        try:
            chat = ChatTemplate.load(s.template_path)
            rendered = render_chat(self.format, chat)
        except KvPrimerError:
            return
        if rendered.template.source == s.template_text:
            self.chat, self.path = chat, s.template_path
            self._rendered, self._shown, self._problem = rendered, s.template_text, ""
            self._fill()
            s.set_chat(chat, s.template_text)

    def _fill(self) -> None:
        """The list and the selected message, from the messages."""
        was, self._ui = self._ui, True
        try:
            k = self._select
            if k is None:
                k = max(self.turns.currentRow(), 0)
            self._select = None
            self.turns.clear()
            msgs = self.chat.messages if self.chat else ()
            self.turns.addItems([_summary(m) for m in msgs])
            if msgs:
                self.turns.setCurrentRow(min(k, len(msgs) - 1))
        finally:
            self._ui = was
        self._show_turn(self.turns.currentRow())

    def _turn_selected(self, k: int) -> None:
        if not self._ui:  # what was typed into the turn left goes to that turn first
            self.flush()
        self._show_turn(self.turns.currentRow())

    def _show_turn(self, k: int, reload: bool = True) -> None:
        """Show turn ``k``; ``reload`` False keeps text being typed into the turn shown."""
        was, self._ui = self._ui, True
        try:
            msgs = self.chat.messages if self.chat else ()
            has = 0 <= k < len(msgs)
            text = msgs[k].content if has else ""
            if (reload or k != self._editing) and self.content.toPlainText() != text:
                self.content.setPlainText(text)
            self._editing = k if has else -1
            self.role.setCurrentText(msgs[k].role if has else "user")
            self.role.setEnabled(has)
            self.content.setEnabled(has)
        finally:
            self._ui = was
        self._show_buttons()

    def _show_buttons(self) -> None:
        n, k = (len(self.chat.messages) if self.chat else 0), self.turns.currentRow()
        self.buttons["add"].setEnabled(True)
        self.buttons["remove"].setEnabled(n > 1 and k >= 0)
        self.buttons["up"].setEnabled(k > 0)
        self.buttons["down"].setEnabled(0 <= k < n - 1)

    def _show_state(self) -> None:
        if self.chat is not None and self._shown is not None and not self.attached:
            self.rendered.setHtml("")
            self._note("The template was changed as text (Text tab), so these messages no "
                       "longer make it; Edit ▸ Undo brings their rendering back.", warn=True)
            for w in (self.turns, self.role, self.content, *self.buttons.values()):
                w.setEnabled(False)
            return
        self.turns.setEnabled(True)
        self._show_turn(self.turns.currentRow(), reload=False)
        if self.chat is None:
            self.rendered.setHtml("")
            self._note("Open a chat template (.json or .yaml: a list of role and content "
                       "messages) with File ▸ Open template, or Add turn to write one.")
            return
        if self.format is None:
            self._note("The messages are rendered once a model is loaded.")
            return
        if getattr(self, "_problem", ""):
            self._note(self._problem, warn=True)
            return
        tpl = self._rendered.template
        self.rendered.setHtml(rendered_html(tpl, self.specials))
        names = " ".join(f"<{n}>" for n in tpl.placeholders)
        name = self.format.model_name or "the model"
        self._note((self.format.note or f"rendered in {name}'s chat template")
                   + f" · static prefix {len(tpl.static_prefix):,} characters (shaded)"
                   + (f" · placeholders {names}" if names else ""))

    def _note(self, text: str, warn: bool = False) -> None:
        self.note.setStyleSheet("color: #c62828;" if warn else "")
        self.note.setText(text)


def template_tabs(editor: QWidget, messages: MessagesView) -> QTabWidget:
    """The Template box's two views: the text and, for a chat template, its messages."""
    tabs = QTabWidget(objectName="templateTabs", documentMode=True)
    # tabs on the side: the template's height is what it has least of
    tabs.setTabPosition(QTabWidget.West)
    tabs.addTab(editor, "Text")
    tabs.addTab(messages, "Messages")
    return tabs
