"""The files the window opens and saves: projects, templates, examples, dropped files; unsaved
changes and autosave; the recent projects and the one that reopens at start.

``window.project``: the window's File menu, drops and autosave call it. The project is the
session; its file form is the Qt-free app.engine.files.project_file, so nothing here reads a
panel's widgets: it asks the window only for its dialogs, messages and the panels that import.

Nothing the user made is replaced without a way back: a project is replaced only after unsaved
changes are saved or discarded (asked), and a template or example opened over the one shown is
an undoable step (asked first when the template has edits saved nowhere). Dialogs start in the
folder last used (file_folders.py).
"""
from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtWidgets import QMenu

from ..engine import KvPrimerError, TemplateError
from ..engine.files.llama_state_file import SUFFIX as LLAMA_STATE_SUFFIX
from ..engine.files.prefix_state import SUFFIX as STATE_SUFFIX
from ..engine.files.project_file import (SUFFIX as PROJECT_SUFFIX, Autosaver, ProjectFile,
                                         ProjectFileError)
from ..engine.files.user_files import read_user_text
from ..engine.prompts.chat_messages import ChatTemplate, is_chat_file
from ..resources_path import examples_dir

log = logging.getLogger("kvprimer.ui")
ROWS_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
PROJECT_FILTER = f"KV Primer projects (*{PROJECT_SUFFIX})"
MAX_RECENT = 8
RECENT_KEY, LAST_KEY = "recentProjects", "lastProject"


class ProjectActions:
    def __init__(self, window, autosaver: Autosaver):
        self.w = window
        self.session = window.session
        self.autosaver = autosaver
        self.settings = window.settings
        self.folders = window.folders
        self.recent_menu: QMenu | None = None  # File ▸ Recent projects, filled from the settings

    # ---- unsaved changes
    def update_title(self) -> None:
        name = Path(self.session.path).name if self.session.path else "untitled"
        self.w.setWindowTitle(f"{name}[*] — KV Primer")
        self.w.setWindowModified(self.session.dirty)
        if not self.w.closing:  # the project open now is the one the next start reopens
            self.settings.setValue(LAST_KEY, self.session.path)

    def settle_unsaved(self) -> bool:
        """True when the caller may go on (saved, discarded or nothing to save)."""
        self.w.editor.flush()
        if not self.session.dirty:
            return True
        answer = self.w.ask("unsaved", "The project has unsaved changes. Save them?")
        if answer == "save":
            return self.save()
        return answer == "discard"

    # ---- projects
    def apply(self, project: ProjectFile, path: str = "") -> None:
        self.w.edits.forget()  # the rows and settings the commands changed are gone
        for problem in self.session.apply_project(project, path):
            self.w.show_error(problem)
        loaded = self.w.engine_status.config
        if loaded is not None and loaded != self.w.config:
            # reloading a model is slow and may not be wanted: offer it in the Model panel
            self.w.show_status("the project's model settings are in the Model panel; press "
                             "Apply (reload) to use them")

    def new(self) -> None:
        if self.settle_unsaved():
            self.w.edits.forget()
            self.session.clear()

    def open(self, path: str | Path) -> bool:
        try:
            project = ProjectFile.load(path)
        except ProjectFileError as e:
            self.w.show_error(str(e))
            return False
        self.apply(project, str(path))
        self.add_recent(str(path))
        return True

    def open_dialog(self) -> None:
        if not self.settle_unsaved():
            return
        path = self.folders.open_file(self.w, "project", "Open project", PROJECT_FILTER)
        if path:
            self.open(path)

    def open_recent(self, path: str) -> bool:
        if not self.settle_unsaved():
            return False
        if not Path(path).is_file():
            self.w.show_error(f"the project {path} is no longer there; it is taken off the "
                              "recent projects")
            self._set_recent([p for p in self.recent() if p != path])
            return False
        return self.open(path)

    def open_last(self) -> bool:
        """At start: reopen the project that was open when the app last closed, if any."""
        path = str(self.settings.value(LAST_KEY, "") or "")
        if not path:
            return False
        if not Path(path).is_file():
            self.w.show_status(f"the last project, {path}, is no longer there; starting with "
                               "the example")
            return False
        return self.open(path)

    # ---- recent projects (the window's settings)
    def recent(self) -> list[str]:
        v = self.settings.value(RECENT_KEY, [])
        return [v] if isinstance(v, str) else [str(p) for p in (v or [])]

    def add_recent(self, path: str) -> None:
        path = str(Path(path).resolve())
        self._set_recent([path] + [p for p in self.recent() if p != path])

    def _set_recent(self, paths: list[str]) -> None:
        self.settings.setValue(RECENT_KEY, paths[:MAX_RECENT])
        self.fill_recent_menu()

    def fill_recent_menu(self) -> None:
        menu = self.recent_menu
        if menu is None:
            return
        menu.clear()
        for p in self.recent():
            a = menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.setStatusTip(p)
            a.triggered.connect(lambda _=False, p=p: self.open_recent(p))
        menu.setEnabled(bool(self.recent()))

    def save(self, path: str | Path | None = None) -> bool:
        path = str(path or self.session.path)
        if not path:
            return self.save_as()
        self.w.editor.flush()
        try:
            self.session.to_project().save(path)
        except ProjectFileError as e:
            self.w.show_error(str(e))
            return False
        self.session.mark_clean(path)
        self.add_recent(path)
        self.w.show_status(f"saved the project to {path}")
        return True

    def save_as(self) -> bool:
        name = Path(self.session.path).name if self.session.path else f"project{PROJECT_SUFFIX}"
        path, _ = self.folders.save_file(self.w, "project", "Save project", name, PROJECT_FILTER)
        return bool(path) and self.save(path if path.endswith(PROJECT_SUFFIX)
                                                else path + PROJECT_SUFFIX)

    # ---- autosave
    def autosave(self) -> None:
        if self.session.dirty and not self.w.closing:
            try:
                self.autosaver.write(self.session.to_project())
            except Exception as e:  # autosave must never interrupt work
                log.warning("autosave failed: %s", e)

    def offer_restore(self) -> bool:
        project = self.autosaver.pending_restore()
        if project is None:
            return False
        if self.w.ask("restore", "KV Primer did not close cleanly last time. Restore the unsaved "
                               "work?") == "yes":
            self.apply(project)
            return True
        self.autosaver.discard()
        return False

    # ---- templates and examples
    def _read_template(self, path: str | Path) -> str | None:
        try:  # syntax errors are not refused here: the editor marks them where they are
            return read_user_text(path, TemplateError, "template file")
        except TemplateError as e:
            self.w.show_error(str(e))
            return None

    def template_edited(self) -> bool:
        """Does the template shown have edits saved nowhere (not in a project, not in its file)?"""
        self.w.editor.flush()
        s = self.session
        if not s.dirty or not s.template_text.strip():
            return False
        messages = self.w.messages
        if messages.attached:  # the messages are the work; the file holds messages too
            messages.flush()
            try:
                return messages.chat != ChatTemplate.load(messages.path) if messages.path else True
            except KvPrimerError:
                return True
        try:
            saved = Path(s.template_path).read_text(encoding="utf-8") if s.template_path else None
        except (OSError, UnicodeDecodeError):
            saved = None
        return s.template_text != saved

    def _may_replace_template(self, name: str) -> bool:
        return not self.template_edited() or self.w.ask(
            "replace", f"The template has edits that are saved nowhere. Open {name} in its "
                       "place? (Edit ▸ Undo brings them back.)") == "yes"

    def open_template(self, path: str | Path) -> bool:
        """Open a template file in place of the one shown: asked over unsaved edits, undoable."""
        if is_chat_file(path):
            return self.open_chat(path)
        text = self._read_template(path)
        if text is None or not self._may_replace_template(Path(path).name):
            return False
        had = bool(self.session.template_text.strip())
        self.w.edits.replace_template(text, str(path), f"open template {Path(path).name}")
        self.w.template_tabs.setCurrentWidget(self.w.editor)
        if had:
            self.w.show_status(f"opened {path}; Edit ▸ Undo (Ctrl+Z) brings the previous "
                               "template back")
        return True

    def open_chat(self, path: str | Path, label: str = "") -> bool:
        """Open a chat template (messages) in place of the template shown, as open_template
        does; the Messages tab shows it."""
        try:
            chat = ChatTemplate.load(path)
        except KvPrimerError as e:
            self.w.show_error(str(e))
            return False
        if not self._may_replace_template(Path(path).name):
            return False
        self.w.messages.open_chat(chat, str(path), label or f"open chat template {Path(path).name}")
        self.w.template_tabs.setCurrentWidget(self.w.messages)
        return True

    def add_examples(self, menu, action) -> None:
        """File ▸ Examples: each text template, then each chat template (messages)."""
        d = examples_dir()
        for p in sorted(d.glob("*.tmpl")):
            action(menu, p.stem, lambda s=p.stem: self.open_example(s))
        for p in sorted([*d.glob("*.json"), *d.glob("*.yaml")]):
            action(menu, f"{p.stem} (messages)", lambda p=p: self.open_chat_example(p))

    def open_chat_example(self, path: Path) -> bool:
        """A messages example and the rows of the text example of the same name."""
        d = examples_dir()
        rows = next((p for p in (d / f"{path.stem}-rows.csv", d / f"{path.stem}-rows.jsonl")
                     if p.is_file()), None)
        stack = self.w.edits.stack
        stack.beginMacro(f"open example {path.name}")
        try:
            if not self.open_chat(path):
                return False
            if rows is not None:
                self.w.fillings.import_file(str(rows))
        finally:
            stack.endMacro()
        return True

    def open_example(self, stem: str) -> bool:
        """The example's template and rows, as one undoable step."""
        d = examples_dir()
        tpl = d / f"{stem}.tmpl"
        text = self._read_template(tpl)
        if text is None or not self._may_replace_template(tpl.name):
            return False
        rows = next((p for p in (d / f"{stem}-rows.csv", d / f"{stem}-rows.jsonl") if p.is_file()),
                    None)
        stack = self.w.edits.stack
        stack.beginMacro(f"open example {stem}")
        try:
            self.w.edits.replace_template(text, str(tpl), f"open template {tpl.name}")
            if rows is not None:
                self.w.fillings.import_file(str(rows))
        finally:
            stack.endMacro()
        return True

    def open_template_dialog(self) -> None:
        # the examples are in File ▸ Examples; the dialog starts where the user keeps files
        path = self.folders.open_file(self.w, "template", "Open template",
                                      "Templates (*.tmpl *.txt *.json *.yaml *.yml);;"
                                      "Chat templates (*.json *.yaml *.yml);;All files (*)")
        if path:
            self.open_template(path)

    def save_template_dialog(self) -> None:
        if self.w.messages.attached:
            return self._save_chat_dialog()
        name = Path(self.session.template_path).name if self.session.template_path else "prompt.tmpl"
        path, _ = self.folders.save_file(self.w, "template", "Save template", name,
                                         "Templates (*.tmpl)")
        if path:
            try:
                Path(path).write_text(self.session.template_text, encoding="utf-8")
                self.session.set_template(self.session.template_text, path)
            except OSError as e:
                self.w.show_error(f"cannot save {path}: {e.strerror}")

    def _save_chat_dialog(self) -> None:
        messages = self.w.messages
        messages.flush()
        name = Path(messages.path).name if messages.path else "chat.json"
        path, _ = self.folders.save_file(self.w, "template", "Save chat template", name,
                                         "Chat templates (*.json *.yaml *.yml)")
        if not path:
            return
        if not is_chat_file(path):
            path += ".json"
        try:
            messages.chat.save(path)
        except KvPrimerError as e:
            self.w.show_error(str(e))
            return
        messages.path = path
        self.session.set_template(self.session.template_text, path)

    # ---- dropped files: models, templates, states, rows, projects
    def open_path(self, path: str) -> None:
        suffix = Path(path).suffix.lower()
        if suffix == ".gguf":
            self.w.open_model(path)
        elif suffix in (STATE_SUFFIX, LLAMA_STATE_SUFFIX):
            self.w.jobs.load_state(path)
        elif suffix == PROJECT_SUFFIX:
            if self.settle_unsaved():  # a drop replaces unsaved work no more than Open does
                self.open(path)
        elif suffix in ROWS_SUFFIXES:
            self.w.fillings.import_file(path)
        else:
            self.open_template(path)
