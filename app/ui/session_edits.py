"""The user's edits to the session as undoable commands, on the window's one QUndoStack.

Panels write the user's changes to rows and settings through ``SessionEdits``; each change is a
``QUndoCommand`` whose redo and undo call the session's own methods, so the session stays the
owner of the data and every panel follows its events as it does for any other change. Actions
that replace what the user made are commands too (a template opened, rows imported, a state
loaded), so Undo gives it back; Edit ▸ Undo and Redo name the step they take. Changes the
program makes (a project opened, a model loaded) go to the session directly and clear the
stack where they replace what the commands refer to.

A setting is named by its path in the session's ``Options``: ``("reuse_mode",)``,
``("engine", "n_ctx")``, ``("engine", "cache", "ram_bytes")``. Commands keep only the value at
that path, so undoing one setting never puts back another that changed since.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QUndoCommand, QUndoStack
from PySide6.QtWidgets import QApplication, QPlainTextEdit
from shiboken6 import isValid

from ..engine.states.prefix_state import PrefixState
from ..engine.session import Options, Session

OptionPath = tuple[str, ...]
MERGE_VALUE, MERGE_OPTION = 1, 2  # QUndoCommand ids: consecutive edits of one thing merge


def option_at(options: Options, path: OptionPath) -> Any:
    value = options
    for name in path:
        value = getattr(value, name)
    return value


def with_option(obj, path: OptionPath, value):
    """``obj`` (a frozen dataclass) with the value at ``path`` replaced, its parents rebuilt."""
    head, rest = path[0], path[1:]
    return replace(obj, **{head: with_option(getattr(obj, head), rest, value) if rest else value})


class SetOption(QUndoCommand):
    def __init__(self, session: Session, path: OptionPath, value, text: str, merge: bool):
        super().__init__(text)
        self.session, self.path, self.new = session, path, value
        self.old = option_at(session.options, path)
        self.merge = merge

    def _set(self, value) -> None:
        new = with_option(self.session.options, self.path, value)
        self.session.set_options(**{self.path[0]: getattr(new, self.path[0])})

    def redo(self) -> None:
        self._set(self.new)

    def undo(self) -> None:
        self._set(self.old)

    def id(self) -> int:
        return MERGE_OPTION if self.merge else -1

    def mergeWith(self, other: QUndoCommand) -> bool:
        # a spin box stepped or typed into: one undo step back to where it started
        if not (isinstance(other, SetOption) and other.merge and other.path == self.path):
            return False
        self.new = other.new
        self.setObsolete(self.new == self.old)  # stepped back to the start: no step at all
        return True


class SetValue(QUndoCommand):
    def __init__(self, session: Session, row: int, name: str, value: str, merge: bool):
        super().__init__(f"edit <{name}> of row {row + 1}")
        self.session, self.row, self.name, self.new = session, row, name, value
        self.old = session.value(row, name)
        self.merge = merge

    def redo(self) -> None:
        self.session.set_value(self.row, self.name, self.new)

    def undo(self) -> None:
        self.session.set_value(self.row, self.name, self.old)

    def id(self) -> int:
        return MERGE_VALUE if self.merge else -1

    def mergeWith(self, other: QUndoCommand) -> bool:
        # typing into one field of one row is one edit, not one per character
        if not (isinstance(other, SetValue) and other.merge
                and (other.row, other.name) == (self.row, self.name)):
            return False
        self.new = other.new
        self.setObsolete(self.new == self.old)
        return True


class AddRows(QUndoCommand):
    def __init__(self, session: Session, rows: list[dict[str, str]], text: str):
        super().__init__(text)
        self.session, self.rows = session, rows
        self.added: list[int] = []

    def redo(self) -> None:
        self.added = self.session.add_rows(self.rows)

    def undo(self) -> None:
        self.session.remove_rows(self.added)


class RemoveRows(QUndoCommand):
    def __init__(self, session: Session, indexes: list[int]):
        n = len(set(indexes))
        super().__init__(f"delete {n} row{'s' if n != 1 else ''}")
        self.session, self.indexes = session, indexes
        self.removed: list[tuple[int, dict[str, str]]] = []

    def redo(self) -> None:
        self.removed = self.session.remove_rows(self.indexes)

    def undo(self) -> None:
        self.session.insert_rows(self.removed)


class ReplaceRows(QUndoCommand):
    def __init__(self, session: Session, rows: list[dict[str, str]], text: str):
        super().__init__(text)
        self.session, self.new = session, rows
        self.old = session.raw_rows()

    def redo(self) -> None:
        self.session.set_rows(self.new)

    def undo(self) -> None:
        self.session.set_rows(self.old)


class ReplaceTemplate(QUndoCommand):
    """A template opened over the one shown (its text is otherwise only in the editor's own
    history, which a new text resets)."""

    def __init__(self, session: Session, text: str, path: str, label: str):
        super().__init__(label)
        self.session, self.new = session, (text, path)
        self.old = (session.template_text, session.template_path)

    def redo(self) -> None:
        self.session.set_template(*self.new)

    def undo(self) -> None:
        # what was typed into the opened template since is what Redo brings back
        self.new = (self.session.template_text, self.session.template_path)
        self.session.set_template(*self.old)


class SetState(QUndoCommand):
    """A state loaded in place of the one in use (primed, or loaded before)."""

    def __init__(self, session: Session, state: PrefixState, path: str, label: str):
        super().__init__(label)
        self.session, self.new = session, (state, path)
        self.old = (session.state, session.state_ref.path)

    def _swap(self, have: tuple, want: tuple) -> None:
        if self.session.state is not have[0]:
            # a model loaded since drops every state: there is nothing to swap back
            self.setObsolete(True)
            return
        self.session.set_state(*want)

    def redo(self) -> None:
        self._swap(self.old, self.new)

    def undo(self) -> None:
        self._swap(self.new, self.old)


class SessionEdits(QObject):
    """Where panels send the user's edits; ``stack`` backs the window's Undo and Redo."""

    def __init__(self, session: Session, parent: QObject | None = None):
        super().__init__(parent)
        self.session = session
        self.stack = QUndoStack(self)

    # ---- settings
    def set_option(self, path: OptionPath | str, value, *, merge: bool = False,
                   text: str = "") -> None:
        """``merge``: consecutive changes of this setting undo as one (spin boxes, typing)."""
        path = (path,) if isinstance(path, str) else tuple(path)
        if option_at(self.session.options, path) == value:
            return  # a widget showing the session's value back: nothing changed
        self.stack.push(SetOption(self.session, path, value, text or f"set {path[-1]}", merge))

    def set_engine(self, name: str, value, *, merge: bool = False) -> None:
        self.set_option(("engine", name), value, merge=merge, text=f"set the model's {name}")

    # ---- rows
    def set_value(self, row: int, name: str, value: str, *, merge: bool = False) -> None:
        if 0 <= row < self.session.row_count and self.session.value(row, name) != value:
            self.stack.push(SetValue(self.session, row, name, value, merge))

    def add_rows(self, rows: list[dict[str, str]], text: str = "add rows") -> None:
        if rows:
            self.stack.push(AddRows(self.session, rows, text))

    def remove_rows(self, indexes: list[int]) -> None:
        if any(0 <= i < self.session.row_count for i in indexes):
            self.stack.push(RemoveRows(self.session, indexes))

    def replace_rows(self, rows: list[dict[str, str]], text: str = "import rows") -> None:
        self.stack.push(ReplaceRows(self.session, rows, text))

    # ---- what replaces the user's work
    def replace_template(self, text: str, path: str, label: str = "open template") -> None:
        if (text, path) != (self.session.template_text, self.session.template_path):
            self.stack.push(ReplaceTemplate(self.session, text, path, label))

    def state_loaded(self, state: PrefixState, path: str, label: str = "load state") -> None:
        """A load job put ``state`` in use: Undo goes back to the state used before."""
        if self.session.state is None or self.session.state is state:  # nothing replaced
            self.session.set_state(state, path)
        else:
            self.stack.push(SetState(self.session, state, path, label))

    def forget(self) -> None:
        """The project was replaced: earlier commands no longer describe what is shown."""
        self.stack.clear()


class UndoActions:
    """Edit ▸ Undo and Redo: the template editor's own history while typing in it (its text is
    not in the stack), else the window's stack of commands. The actions say which step they
    take ("Undo open template rag.tmpl"), and ``said`` tells the status line what was undone."""

    TYPING = "typing in the template"

    def __init__(self, stack: QUndoStack, editor: QPlainTextEdit, undo: QAction, redo: QAction,
                 said: Callable[[str], None] | None = None):
        self.stack, self.editor, self.undo_action, self.redo_action = stack, editor, undo, redo
        self.said = said or (lambda _text: None)
        doc = editor.document()
        for sig in (stack.indexChanged, stack.cleanChanged, doc.undoAvailable,
                    doc.redoAvailable):
            sig.connect(lambda *_: self.show())
        QApplication.instance().focusChanged.connect(self._focus_changed)
        self.show()

    def _focus_changed(self, *_):
        self.show()

    def _steps(self) -> tuple[str | None, str | None]:
        """What Undo and Redo would do now (None: nothing)."""
        stack, doc = self.stack, self.editor.document()
        in_editor = self._in_editor()
        undo = (self.TYPING if in_editor and doc.isUndoAvailable()
                else stack.undoText() or "edit" if stack.canUndo() else None)
        redo = (self.TYPING if in_editor and doc.isRedoAvailable()
                else stack.redoText() or "edit" if stack.canRedo() else None)
        return undo, redo

    def show(self) -> None:
        if not (isValid(self.stack) and isValid(self.editor) and isValid(self.undo_action)):
            return  # the window is being torn down
        undo, redo = self._steps()
        for action, word, step in ((self.undo_action, "&Undo", undo),
                                   (self.redo_action, "&Redo", redo)):
            action.setEnabled(step is not None)
            action.setText(f"{word} {step}" if step else word)

    def _in_editor(self) -> bool:
        return QApplication.focusWidget() is self.editor

    def undo(self) -> None:
        step, _ = self._steps()
        if step == self.TYPING:
            self.editor.undo()
        elif step is not None:
            self.stack.undo()
            self.said(f"undid {step}; Redo (Ctrl+Shift+Z) does it again")

    def redo(self) -> None:
        _, step = self._steps()
        if step == self.TYPING:
            self.editor.redo()
        elif step is not None:
            self.stack.redo()
            self.said(f"redid {step}")
