"""The main window: layout, menus and shortcuts, workspace files, and closing cleanly.

Widgets show and forward; engine work goes through ``PromptJobs`` to the one worker thread.
Everything the window writes (settings, states, autosave, log) has an injectable location so
tests run in temp folders.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QDialog, QFileDialog, QGroupBox, QHeaderView, QMainWindow,
                               QMessageBox, QSplitter, QTableWidget, QTableWidgetItem, QTabWidget,
                               QVBoxLayout)

from ..engine import EngineConfig, ModelInfo, TemplateError
from ..engine.user_files import read_user_text
from ..engine.prefix_state import SUFFIX as STATE_SUFFIX
from ..resources_path import examples_dir
from ..workspace import SUFFIX as PROJECT_SUFFIX, Autosaver, autosave_path
from .bench_view import BenchView
from .engine_worker import EngineWorker
from .error_panel import ErrorPanel
from .fillings_panel import FillingsPanel
from .kv_dock import KvCacheDock
from .model_panel import ModelPanel
from .project_actions import ProjectMixin
from .prompt_jobs import PromptJobs
from .run_panel import RunPanel
from .states_library import StatesLibrary
from .status_bar import StatusBar
from .template_editor import TemplateEditor

MAX_RECENT = 8


def default_states_dir() -> Path:
    from platformdirs import user_data_path

    return user_data_path("kvprimer", appauthor=False) / "states"


class MainWindow(ProjectMixin, QMainWindow):
    closed = Signal()

    def __init__(self, config: EngineConfig | None = None, *, settings: QSettings | None = None,
                 states_dir: Path | None = None, autosave_dir: Path | None = None,
                 log_path: Path | None = None, ask=None, load_model: bool = True,
                 open_example: bool = True, offer_restore: bool = True):
        super().__init__()
        self.setWindowTitle("KV Primer")
        self.setAcceptDrops(True)
        self.config = config or EngineConfig()
        self.settings = settings or QSettings("kvprimer", "KV Primer")
        # ask(kind, text) -> "save" | "discard" | "cancel" | "yes" | "no"; tests pass a function
        self.ask = ask or self._ask_dialog
        self.closing = False
        self.dirty = False
        self.project_path = ""
        self.worker = EngineWorker(self)

        self.editor = TemplateEditor(self.worker)
        self.fillings = FillingsPanel()
        self.run_panel = RunPanel()
        self.bench = BenchView()
        self.errors = ErrorPanel(self, log_path)
        self.errors.install_excepthook()
        self.model_panel = ModelPanel(self.config, self)
        self.library = StatesLibrary(states_dir or default_states_dir(), self,
                                     confirm=lambda text: self.ask("delete", text) == "yes")
        self.kv_dock = KvCacheDock(self.worker, self)
        self.jobs = PromptJobs(self)
        self._build_layout()
        self.status = StatusBar(self.worker, self)
        self.setStatusBar(self.status)
        self._build_actions()
        self._connect()
        self.autosaver = Autosaver(autosave_path(autosave_dir))
        self._autosave_timer = QTimer(self, interval=3000)  # a crash loses at most 3 s of edits
        self._autosave_timer.timeout.connect(self.autosave)
        self._autosave_timer.start()
        self._restore_layout()
        restored = offer_restore and self._offer_restore()
        if open_example and not restored:
            self.open_example("rag")
        self.dirty = False
        self._update_title()
        if load_model:
            self.load_model(self.config)

    # ---- layout
    def _build_layout(self) -> None:
        tpl_box = QGroupBox("Template")
        QVBoxLayout(tpl_box).addWidget(self.editor)
        fill_box = QGroupBox("Fillings")
        QVBoxLayout(fill_box).addWidget(self.fillings)
        for box in (tpl_box, fill_box):
            box.layout().setContentsMargins(4, 4, 4, 4)
        top = QSplitter(Qt.Horizontal)
        top.addWidget(tpl_box)
        top.addWidget(fill_box)
        top.setSizes([560, 420])
        self.central_tabs = QTabWidget()
        self.central_tabs.addTab(self.run_panel, "Run")
        self.central_tabs.addTab(self.bench, "Benchmark")
        self.center = QSplitter(Qt.Vertical)
        self.center.setObjectName("centerSplit")
        self.center.addWidget(top)
        self.center.addWidget(self.central_tabs)
        self.center.setSizes([380, 420])
        self.setCentralWidget(self.center)
        self.addDockWidget(Qt.RightDockWidgetArea, self.kv_dock)
        self.addDockWidget(Qt.RightDockWidgetArea, self.model_panel)
        self.tabifyDockWidget(self.model_panel, self.kv_dock)
        self.addDockWidget(Qt.BottomDockWidgetArea, self.library)
        self.addDockWidget(Qt.BottomDockWidgetArea, self.errors)
        self.tabifyDockWidget(self.library, self.errors)
        self.library.raise_()
        self.model_panel.raise_()
        self.resize(1400, 900)
        self._docks_sized = False

    def _action(self, menu, text, slot, shortcut=None, tip="", toolbar=False) -> QAction:
        a = QAction(text, self)
        if shortcut:
            a.setShortcut(QKeySequence(shortcut))
            a.setShortcutContext(Qt.WindowShortcut)
        a.setToolTip(f"{tip or text} ({QKeySequence(shortcut).toString()})" if shortcut else tip or text)
        a.triggered.connect(lambda _=False: slot())
        menu.addAction(a)
        if toolbar:
            self.toolbar.addAction(a)
        self.actions_by_text[text.replace("&", "").rstrip("…")] = a
        return a

    def _build_actions(self) -> None:
        self.actions_by_text: dict[str, QAction] = {}
        self.toolbar = self.addToolBar("Main")
        self.toolbar.setObjectName("mainToolbar")
        self.toolbar.setToolButtonStyle(Qt.ToolButtonTextOnly)
        mb = self.menuBar()
        f = mb.addMenu("&File")
        A = self._action
        A(f, "&New project", self.new_project, "Ctrl+N")
        A(f, "&Open project…", self.open_project_dialog, "Ctrl+O")
        A(f, "&Save project", self.save_project, "Ctrl+Shift+S")
        A(f, "Save project &as…", self.save_project_as)
        f.addSeparator()
        A(f, "Open &template…", self.open_template_dialog, "Ctrl+T", toolbar=True)
        A(f, "Save template as…", self.save_template_dialog)
        ex = f.addMenu("E&xamples")
        for p in sorted(examples_dir().glob("*.tmpl")):
            A(ex, p.stem, lambda s=p.stem: self.open_example(s))
        A(f, "&Import rows…", self.fillings.import_dialog, "Ctrl+I")
        f.addSeparator()
        A(f, "Open &model…", self.model_panel.open_dialog, "Ctrl+M")
        self.recent_menu = f.addMenu("&Recent models")
        f.addSeparator()
        A(f, "&Quit", self.close, "Ctrl+Q")
        e = mb.addMenu("&Edit")
        A(e, "&Undo", self.editor.edit.undo, "Ctrl+Z")
        A(e, "&Redo", self.editor.edit.redo, "Ctrl+Shift+Z")
        p = mb.addMenu("&Prompt")
        self.toolbar.addSeparator()
        A(p, "&Prime prefix", self.jobs.prime, "Ctrl+P", "Evaluate the static prefix once", True)
        A(p, "&Save state…", self.save_state_dialog, "Ctrl+S", "Save the primed KV state", True)
        A(p, "&Load state…", self.load_state_dialog, "Ctrl+L", "Load a saved KV state", True)
        p.addSeparator()
        self.toolbar.addSeparator()
        A(p, "&Run cold + warm", lambda: self.jobs.run("both"), "Ctrl+R", "Run the selected rows", True)
        A(p, "Run &cold only", lambda: self.jobs.run("cold"), "Ctrl+Shift+C")
        A(p, "Run &warm only", lambda: self.jobs.run("warm"), "Ctrl+Shift+W")
        A(p, "&Benchmark rows", lambda: self.jobs.bench(self.bench.repeat.value()), "Ctrl+B",
          "Every row cold and warm, repeated", True)
        A(p, "Prefix-length s&weep", self.jobs.sweep, "Ctrl+Shift+B")
        p.addSeparator()
        A(p, "Cancel job", self.worker.cancel, "Esc", "Stop the running job", True)
        v = mb.addMenu("&View")
        for d in (self.model_panel, self.kv_dock, self.library, self.errors):
            v.addAction(d.toggleViewAction())
        v.addAction(self.toolbar.toggleViewAction())
        h = mb.addMenu("&Help")
        A(h, "&Keyboard shortcuts", self.show_shortcuts, "F1")
        A(h, "&About KV Primer", self.show_about)

    def _connect(self) -> None:
        self.worker.engine_changed.connect(self._model_changed)
        self.worker.partial.connect(self.jobs.on_partial)
        self.jobs.context_used.connect(self._context_used)
        self.editor.template_changed.connect(lambda t: self.fillings.set_placeholders(t.placeholders))
        self.editor.modified.connect(self.mark_dirty)
        self.fillings.modified.connect(self.mark_dirty)
        self.fillings.error.connect(self.show_error)
        self.run_panel.run_requested.connect(self.jobs.run)
        self.bench.run_requested.connect(self.jobs.bench)
        self.bench.sweep_requested.connect(self.jobs.sweep)
        self.bench.error.connect(self.show_error)
        self.model_panel.apply_requested.connect(self.load_model)
        self.library.load_requested.connect(self.jobs.load_state)
        self.library.save_requested.connect(self.save_state_dialog)

    # ---- feedback
    def show_error(self, msg: str) -> None:
        self.errors.error(msg)
        self.status.showMessage(msg, 15000)

    def show_status(self, msg: str) -> None:
        self.errors.info(msg)
        self.status.showMessage(msg, 15000)

    def _context_used(self, used: int) -> None:
        info = self.worker.info
        if info:
            self.status.show_context(used, info.n_ctx, info.kv_bytes_per_token)

    # ---- model
    def load_model(self, config: EngineConfig):
        self.config = config
        self.model_panel.set_config(config)
        self.jobs.set_state(None)  # a state belongs to the model it was primed on
        name = Path(config.model_path).name if config.model_path else "the default model"

        def failed(msg):
            self.show_error(msg)

        def done(info):
            self.show_status(f"loaded {Path(info.path).name}: {info.n_layer} layers, "
                             f"context {info.n_ctx:,} tokens")
            if config.model_path:
                self._add_recent(config.model_path)

        self.status.showMessage(f"loading {name}…")
        return self.worker.load(config, on_done=done, on_error=failed)

    def _model_changed(self, info: ModelInfo | None) -> None:
        self.model_panel.show_info(info)
        self.status.show_model(info)
        if info:
            self.status.show_context(0, info.n_ctx, info.kv_bytes_per_token)

    def _add_recent(self, path: str) -> None:
        recent = [p for p in self.recent_models() if p != path]
        recent.insert(0, path)
        self.settings.setValue("recentModels", recent[:MAX_RECENT])
        self._fill_recent()

    def recent_models(self) -> list[str]:
        v = self.settings.value("recentModels", [])
        return [v] if isinstance(v, str) else list(v or [])

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_models()
        self.model_panel.set_recent(recent)
        for p in recent:
            a = self.recent_menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.triggered.connect(lambda _=False, p=p: self.load_model(replace(self.config, model_path=p)))
        self.recent_menu.setEnabled(bool(recent))

    # ---- template and examples
    def open_template(self, path: str | Path) -> bool:
        try:  # syntax errors are not refused here: the editor marks them where they are
            text = read_user_text(path, TemplateError, "template file")
        except TemplateError as e:
            self.show_error(str(e))
            return False
        self.editor.set_text(text, str(path))
        self.mark_dirty()
        return True

    def open_example(self, stem: str) -> None:
        d = examples_dir()
        if self.open_template(d / f"{stem}.tmpl"):
            for rows in (d / f"{stem}-rows.csv", d / f"{stem}-rows.jsonl"):
                if rows.is_file():
                    self.fillings.import_file(str(rows))
                    break

    def open_template_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open template", str(examples_dir()),
                                              "Templates (*.tmpl *.txt);;All files (*)")
        if path:
            self.open_template(path)

    def save_template_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save template", self.editor.path or "prompt.tmpl",
                                              "Templates (*.tmpl)")
        if path:
            try:
                Path(path).write_text(self.editor.text(), encoding="utf-8")
                self.editor.path = path
            except OSError as e:
                self.show_error(f"cannot save {path}: {e.strerror}")

    # ---- states
    def save_state_dialog(self) -> None:
        if self.jobs.state is None:
            return self.jobs.save_state("")  # says what to do first
        default = self.library.folder / f"{Path(self.editor.path or 'prefix').stem}{STATE_SUFFIX}"
        path, _ = QFileDialog.getSaveFileName(self, "Save KV state", str(default),
                                              f"KV states (*{STATE_SUFFIX})")
        if path:
            self.jobs.save_state(path if path.endswith(STATE_SUFFIX) else path + STATE_SUFFIX)

    def load_state_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load KV state", str(self.library.folder),
                                              f"KV states (*{STATE_SUFFIX});;All files (*)")
        if path:
            self.jobs.load_state(path)

    # ---- closing
    def closeEvent(self, event) -> None:
        if not self.closing and not self._settle_unsaved():
            event.ignore()
            return
        self.closing = True
        self._autosave_timer.stop()
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("windowState", self.saveState())
        self.settings.sync()
        self.worker.shutdown(wait=True)  # cancels the running job, frees the context
        self.autosaver.discard()
        self.errors.uninstall_excepthook()
        event.accept()
        self.closed.emit()

    def _restore_layout(self) -> None:
        self._fill_recent()
        geo = self.settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        state = self.settings.value("windowState")
        if state is not None:
            self._docks_sized = self.restoreState(state)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._docks_sized:  # first start: docks sized for the work in the middle
            self._docks_sized = True
            self.resizeDocks([self.library], [130], Qt.Vertical)
            self.resizeDocks([self.kv_dock], [430], Qt.Horizontal)

    def _ask_dialog(self, kind: str, text: str) -> str:
        if kind == "unsaved":
            r = QMessageBox.question(self, "Unsaved changes", text,
                                     QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel)
            return {QMessageBox.Save: "save", QMessageBox.Discard: "discard"}.get(r, "cancel")
        r = QMessageBox.question(self, "KV Primer", text)
        return "yes" if r == QMessageBox.Yes else "no"

    # ---- drag and drop: models, templates, states, rows, projects
    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        for url in event.mimeData().urls():
            self.open_path(url.toLocalFile())

    def open_path(self, path: str) -> None:
        suffix = Path(path).suffix.lower()
        if suffix == ".gguf":
            self.load_model(replace(self.config, model_path=path))
        elif suffix == STATE_SUFFIX:
            self.jobs.load_state(path)
        elif suffix == PROJECT_SUFFIX:
            self.open_project(path)
        elif suffix in (".csv", ".tsv", ".jsonl", ".ndjson"):
            self.fillings.import_file(path)
        else:
            self.open_template(path)

    # ---- help
    def shortcut_list(self) -> list[tuple[str, str]]:
        return [(name, a.shortcut().toString(QKeySequence.NativeText))
                for name, a in self.actions_by_text.items() if not a.shortcut().isEmpty()]

    def show_shortcuts(self) -> None:
        rows = self.shortcut_list()
        dlg = QDialog(self)
        dlg.setWindowTitle("Keyboard shortcuts")
        t = QTableWidget(len(rows), 2, dlg)
        t.setHorizontalHeaderLabels(["Action", "Shortcut"])
        t.verticalHeader().setVisible(False)
        t.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        t.setEditTriggers(QTableWidget.NoEditTriggers)
        for i, (name, keys) in enumerate(rows):
            t.setItem(i, 0, QTableWidgetItem(name))
            t.setItem(i, 1, QTableWidgetItem(keys))
        QVBoxLayout(dlg).addWidget(t)
        dlg.resize(420, 520)
        dlg.show()
        self.shortcuts_dialog = dlg

    def show_about(self) -> None:
        from ..cli import version_text

        QMessageBox.about(self, "About KV Primer",
                          "<b>KV Primer</b><br>Build and test cached prompts on local llama.cpp "
                          "models.<br><br>" + version_text().replace("\n", "<br>"))
