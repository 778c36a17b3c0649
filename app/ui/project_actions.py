"""The files the window opens and saves: projects, templates, examples, dropped files; unsaved
changes and autosave.

``window.project``: the window's File menu, drops and autosave call it. The project is the
session; its file form is the Qt-free app.engine.files.project_file, so nothing here reads a
panel's widgets: it asks the window only for its dialogs, messages and the panels that import.
"""
from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from ..engine import TemplateError
from ..engine.files.llama_state_file import SUFFIX as LLAMA_STATE_SUFFIX
from ..engine.files.prefix_state import SUFFIX as STATE_SUFFIX
from ..engine.files.project_file import (SUFFIX as PROJECT_SUFFIX, Autosaver, ProjectFile,
                                         ProjectFileError)
from ..engine.files.user_files import read_user_text
from ..resources_path import examples_dir

log = logging.getLogger("kvprimer.ui")
ROWS_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")


class ProjectActions:
    def __init__(self, window, autosaver: Autosaver):
        self.w = window
        self.session = window.session
        self.autosaver = autosaver

    # ---- unsaved changes
    def update_title(self) -> None:
        name = Path(self.session.path).name if self.session.path else "untitled"
        self.w.setWindowTitle(f"{name}[*] — KV Primer")
        self.w.setWindowModified(self.session.dirty)

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
        return True

    def open_dialog(self) -> None:
        if not self.settle_unsaved():
            return
        path, _ = QFileDialog.getOpenFileName(self.w, "Open project", "", f"KV Primer projects (*{PROJECT_SUFFIX})")
        if path:
            self.open(path)

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
        self.w.show_status(f"saved the project to {path}")
        return True

    def save_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(self.w, "Save project", f"project{PROJECT_SUFFIX}",
                                              f"KV Primer projects (*{PROJECT_SUFFIX})")
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
    def open_template(self, path: str | Path) -> bool:
        try:  # syntax errors are not refused here: the editor marks them where they are
            text = read_user_text(path, TemplateError, "template file")
        except TemplateError as e:
            self.w.show_error(str(e))
            return False
        self.session.set_template(text, str(path))
        return True

    def open_example(self, stem: str) -> None:
        d = examples_dir()
        if self.open_template(d / f"{stem}.tmpl"):
            for rows in (d / f"{stem}-rows.csv", d / f"{stem}-rows.jsonl"):
                if rows.is_file():
                    self.w.edits.forget()  # an example is opened, not edited
                    self.w.fillings.import_file(str(rows), undoable=False)
                    break

    def open_template_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.w, "Open template", str(examples_dir()),
                                              "Templates (*.tmpl *.txt);;All files (*)")
        if path:
            self.open_template(path)

    def save_template_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.w, "Save template",
                                              self.session.template_path or "prompt.tmpl",
                                              "Templates (*.tmpl)")
        if path:
            try:
                Path(path).write_text(self.session.template_text, encoding="utf-8")
                self.session.set_template(self.session.template_text, path)
            except OSError as e:
                self.w.show_error(f"cannot save {path}: {e.strerror}")

    # ---- dropped files: models, templates, states, rows, projects
    def open_path(self, path: str) -> None:
        suffix = Path(path).suffix.lower()
        if suffix == ".gguf":
            self.w.open_model(path)
        elif suffix in (STATE_SUFFIX, LLAMA_STATE_SUFFIX):
            self.w.jobs.load_state(path)
        elif suffix == PROJECT_SUFFIX:
            self.open(path)
        elif suffix in ROWS_SUFFIXES:
            self.w.fillings.import_file(path)
        else:
            self.open_template(path)
