"""The window's project file: what a project holds, open/save, unsaved changes, autosave.

A mixin of MainWindow (it uses the window's panels); the file format itself is the Qt-free
app.workspace.
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from ..engine import BenchResult, BenchRow, EngineConfig
from ..engine.prefix_sweep import SweepPoint
from ..workspace import SUFFIX as PROJECT_SUFFIX, Workspace, WorkspaceError

log = logging.getLogger("kvprimer.ui")


class ProjectMixin:
    def workspace(self) -> Workspace:
        results = [{"kind": "run", "row": n, "speedup": r.speedup, "prompt_tokens": r.prompt_tokens,
                    "reused_tokens": r.reused_tokens,
                    "cold_ttft_ms": r.cold.ttft_ms if r.cold else None,
                    "warm_ttft_ms": r.warm.ttft_ms if r.warm else None,
                    "tokens_equal": r.equivalence.tokens_equal if r.equivalence else None}
                   for n, r in self.run_panel.reports]
        if self.bench.result:
            results.append({"kind": "benchmark", **self.bench.result.as_dict()})
        if self.bench.sweep.points:
            results.append({"kind": "sweep", "points": [p.as_dict() for p in self.bench.sweep.points]})
        return Workspace(template=self.editor.text(), template_path=self.editor.path,
                         placeholders=list(self.fillings.placeholders), rows=self.fillings.rows(),
                         settings={"engine": asdict(self.config),
                                   "max_tokens": self.run_panel.max_tokens.value(),
                                   "repeat": self.bench.repeat.value()},
                         results=results)

    def apply_workspace(self, ws: Workspace) -> None:
        self.editor.set_text(ws.template, ws.template_path)
        self.fillings.set_placeholders(self.editor.template.placeholders if self.editor.template
                                       else ws.placeholders)
        self.fillings.set_rows(ws.rows)
        s = ws.settings
        if "max_tokens" in s:
            self.run_panel.max_tokens.setValue(int(s["max_tokens"]))
        if "repeat" in s:
            self.bench.repeat.setValue(int(s["repeat"]))
        self.run_panel.clear()
        self._show_saved_results(ws.results)
        cfg = _engine_config(s.get("engine"))
        if cfg is not None and cfg != self.config:
            # reloading a model is slow and may not be wanted: offer it in the Model panel
            self.model_panel.set_config(cfg)
            self.show_status("the project's model settings are in the Model panel; press "
                             "Apply (reload) to use them")

    def _show_saved_results(self, results: list[dict]) -> None:
        """Benchmark and sweep results come back as charts; single runs stay in the file."""
        for r in results:
            try:
                if r.get("kind") == "benchmark":
                    res = BenchResult(model=r.get("model", {}), repeat=r["summary"]["repeat"],
                                      rows=[BenchRow(**row) for row in r["rows"]])
                    self.bench.show_result(res)
                elif r.get("kind") == "sweep":
                    self.bench.show_sweep([SweepPoint(**p) for p in r["points"]])
            except (KeyError, TypeError):
                self.show_error("the project's saved results are unreadable; run them again")

    def new_project(self) -> None:
        if not self._settle_unsaved():
            return
        self.project_path = ""
        self.editor.set_text("")
        self.fillings.set_rows([])
        self.run_panel.clear()
        self.dirty = False
        self._update_title()

    def open_project(self, path: str | Path) -> bool:
        try:
            ws = Workspace.load(path)
        except WorkspaceError as e:
            self.show_error(str(e))
            return False
        self.apply_workspace(ws)
        self.project_path = str(path)
        self.dirty = False
        self._update_title()
        return True

    def open_project_dialog(self) -> None:
        if not self._settle_unsaved():
            return
        path, _ = QFileDialog.getOpenFileName(self, "Open project", "", f"KV Primer projects (*{PROJECT_SUFFIX})")
        if path:
            self.open_project(path)

    def save_project(self, path: str | Path | None = None) -> bool:
        path = str(path or self.project_path)
        if not path:
            return self.save_project_as()
        try:
            self.workspace().save(path)
        except WorkspaceError as e:
            self.show_error(str(e))
            return False
        self.project_path = path
        self.dirty = False
        self._update_title()
        self.show_status(f"saved the project to {path}")
        return True

    def save_project_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(self, "Save project", f"project{PROJECT_SUFFIX}",
                                              f"KV Primer projects (*{PROJECT_SUFFIX})")
        return bool(path) and self.save_project(path if path.endswith(PROJECT_SUFFIX)
                                                else path + PROJECT_SUFFIX)

    def mark_dirty(self) -> None:
        if not self.dirty:
            self.dirty = True
            self._update_title()

    def results_changed(self) -> None:
        self.mark_dirty()

    def _update_title(self) -> None:
        name = Path(self.project_path).name if self.project_path else "untitled"
        self.setWindowTitle(f"{name}[*] — KV Primer")
        self.setWindowModified(self.dirty)

    def autosave(self) -> None:
        if self.dirty and not self.closing:
            try:
                self.autosaver.write(self.workspace())
            except Exception as e:  # autosave must never interrupt work
                log.warning("autosave failed: %s", e)

    def _offer_restore(self) -> bool:
        ws = self.autosaver.pending_restore()
        if ws is None:
            return False
        if self.ask("restore", "KV Primer did not close cleanly last time. Restore the unsaved "
                               "work?") == "yes":
            self.apply_workspace(ws)
            return True
        self.autosaver.discard()
        return False

    # ---- unsaved changes
    def _settle_unsaved(self) -> bool:
        """True when the caller may go on (saved, discarded or nothing to save)."""
        if not self.dirty:
            return True
        answer = self.ask("unsaved", "The project has unsaved changes. Save them?")
        if answer == "save":
            return self.save_project()
        return answer == "discard"


def _engine_config(d) -> EngineConfig | None:
    try:
        return EngineConfig(**d) if isinstance(d, dict) else None
    except TypeError:  # a field this version does not know
        return None
