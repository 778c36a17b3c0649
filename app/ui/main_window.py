"""The main window: layout, menus and shortcuts, the model, and closing cleanly.

The session (app.engine.session) holds the project, the engine settings included; panels
observe it and write the user's edits to it through ``SessionEdits`` (one undo stack for the
window), never reading each other's widgets. Engine work goes through ``PromptJobs`` to the one
worker thread; actions are enabled from the engine status the worker keeps (a model loaded,
no job of the user's running), which the window and its panels observe. Everything the window
writes (settings, states, autosave, log) has an injectable location so tests run in temp
folders.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow

from ..engine import EngineConfig
from ..engine.states.llama_state_file import SUFFIX as LLAMA_SUFFIX
from ..engine.states.prefix_state import SUFFIX as STATE_SUFFIX
from ..engine.states.v_layout import FA_CHOICES
from ..engine.project.project_file import Autosaver, autosave_path
from ..engine.session import Options, Session
from .bench_view import BenchView
from .cache_panel import CachePanel
from .engine_worker import EngineWorker, Job, JobKind
from .error_panel import ErrorPanel
from .file_folders import FileFolders
from .fillings_panel import FillingsPanel
from .help_dialogs import ask_dialog, show_about, show_shortcuts
from .reload_notice import prefix_dropped_text
from .kv_dock import KvCacheDock
from .model_events import follow
from .model_panel import ModelPanel
from .project_actions import ProjectActions
from .prompt_jobs import PromptJobs
from .recent_models import RecentModels
from .server_view import ServerView
from .run_panel import RunPanel
from .session_edits import SessionEdits, UndoActions
from .states_library import FOR_FA_QUESTION, StatesLibrary
from .status_bar import StatusBar
from .messages_view import MessagesView, template_tabs
from .table_columns import keep_column_widths, window_tables
from .template_editor import TemplateEditor
from .window_layout import DockLayout, central_widgets, size_center

STATE_FILTERS = (f"KV Primer state (*{STATE_SUFFIX})",
                 f"llama.cpp sequence state (*{LLAMA_SUFFIX})")
# actions that start engine work: enabled only with a model loaded and no job of the user's running
ENGINE_ACTIONS = ("Prime prefix", "Load state", "Run cold + warm", "Run cold only",
                  "Run warm only", "Benchmark rows", "Prefix-length sweep")


def default_states_dir() -> Path:
    from platformdirs import user_data_path

    return user_data_path("kvprimer", appauthor=False) / "states"


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(self, config: EngineConfig | None = None, *, settings: QSettings | None = None,
                 states_dir: Path | None = None, autosave_dir: Path | None = None,
                 log_path: Path | None = None, ask=None, load_model: bool = True,
                 open_example: bool = True, offer_restore: bool = True, open_last: bool = True):
        super().__init__()
        self.setWindowTitle("KV Primer")
        self.setAcceptDrops(True)
        started_with = config  # None: no engine option given; a reopened project's settings
        config = config or EngineConfig()
        self.settings = settings or QSettings("kvprimer", "KV Primer")
        # ask(kind, text) -> "save" | "discard" | "cancel" | "yes" | "no"; tests pass a function
        self.ask = ask or (lambda kind, text: ask_dialog(self, kind, text))
        self.closing = False
        self.session = Session(Options(engine=config))
        self.edits = SessionEdits(self.session, self)
        self.folders = FileFolders(self.settings)  # where file dialogs start
        # the File menu's projects, templates and examples, drops and autosave
        self.project = ProjectActions(self, Autosaver(autosave_path(autosave_dir)))
        self.worker = EngineWorker(self)
        self.engine_status = self.worker.engine_status  # what the window shows of the engine

        self.editor = TemplateEditor(self.worker, self.session)
        self.messages = MessagesView(self.worker, self.session, self.edits, said=self.show_status)
        self.fillings = FillingsPanel(self.session, self.edits, folders=self.folders)
        self.run_panel = RunPanel(self.session, self.edits)
        self.bench = BenchView(self.session, self.edits, folders=self.folders, worker=self.worker)
        self.server_view = ServerView(self.worker, self.session, self.settings, edits=self.edits)
        self.errors = ErrorPanel(self, log_path)
        self.errors.install_excepthook()
        self.model_panel = ModelPanel(self.session, self.engine_status, self.edits, self)
        self.library = StatesLibrary(states_dir or default_states_dir(), self,
                                     confirm=lambda text: self.ask("delete", text) == "yes")
        self.kv_dock = KvCacheDock(self.worker, self)
        self.cache_panel = CachePanel(self.worker, self)
        self.jobs = PromptJobs(self.worker, self.session, self, edits=self.edits)
        self._build_layout()
        self.columns = keep_column_widths(self.settings, window_tables(self))
        self.status = StatusBar(self.worker, self)
        self.setStatusBar(self.status)
        self.server_view.message.connect(lambda m: self.status.showMessage(m, 15000))
        self._build_actions()
        self._connect()
        self._autosave_timer = QTimer(self, interval=3000)  # a crash loses at most 3 s of edits
        self._autosave_timer.timeout.connect(self.project.autosave)
        self._autosave_timer.start()
        self._restore_layout()
        # what the user last had: unsaved work after a crash, else the project open at exit
        restored = offer_restore and self.project.offer_restore()
        reopened = not restored and open_last and self.project.open_last()
        if open_example and not restored and not reopened:
            self.project.open_example("rag")
        self.edits.forget()  # what the window starts with is not an edit to undo
        self.session.mark_clean()
        self._update_actions()
        if load_model:
            # the options the app was started with, over a reopened project's; without any,
            # the project's own (its model, context...), else the defaults
            self.load_model(started_with)

    @property
    def config(self) -> EngineConfig:
        """The engine settings: the session's (Apply loads them; engine_status.config holds the
        loaded model's)."""
        return self.session.options.engine

    # ---- layout
    def _build_layout(self) -> None:
        self.template_tabs = template_tabs(self.editor, self.messages)
        self.center, top, self.central_tabs = central_widgets(
            self.template_tabs, self.fillings,
            [(self.run_panel, "Run"), (self.bench, "Benchmark"), (self.server_view, "Server")])
        self.setCentralWidget(self.center)
        # the advanced panels in one column on the right: the radix cache (in front), model,
        # states and log tabbed above the KV map, which the radix cache's nodes colour
        self.docks = DockLayout(self, self.settings,
                                [self.cache_panel, self.model_panel, self.library, self.errors],
                                [self.kv_dock], splitters=(self.center, top))
        self._center_sized = False

    def _action(self, menu, text, slot, shortcut=None, tip="", toolbar=False) -> QAction:
        a = QAction(text, self)
        if shortcut:
            a.setShortcut(QKeySequence(shortcut))
            a.setShortcutContext(Qt.WindowShortcut)
        a.setToolTip(f"{tip or text} ({QKeySequence(shortcut).toString()})" if shortcut else tip or text)
        # typed template text reaches the session before any action reads it
        a.triggered.connect(lambda _=False: (self.editor.flush(), slot()))
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
        pr = self.project
        A(f, "&New project", pr.new, "Ctrl+N")
        A(f, "&Open project…", pr.open_dialog, "Ctrl+O")
        A(f, "&Save project", pr.save, "Ctrl+S")
        A(f, "Save project &as…", pr.save_as, "Ctrl+Shift+S")
        pr.recent_menu = f.addMenu("Recent &projects")
        pr.fill_recent_menu()
        f.addSeparator()
        A(f, "Open &template…", pr.open_template_dialog, "Ctrl+T", toolbar=True)
        A(f, "Save template as…", pr.save_template_dialog)
        ex = f.addMenu("E&xamples")
        pr.add_examples(ex, A)
        A(f, "&Import rows…", self.fillings.import_dialog, "Ctrl+I")
        f.addSeparator()
        A(f, "Open &model…", self.model_panel.open_dialog, "Ctrl+M")
        self.recent = RecentModels(self.settings, f.addMenu("&Recent models"), self.model_panel)
        f.addSeparator()
        A(f, "&Quit", self.close, "Ctrl+Q")
        e = mb.addMenu("&Edit")
        undo = A(e, "&Undo", lambda: self.undo_actions.undo(), "Ctrl+Z")
        redo = A(e, "&Redo", lambda: self.undo_actions.redo(), "Ctrl+Shift+Z")
        undo.setObjectName("Undo")  # their text names the step ("Undo open template x.tmpl")
        redo.setObjectName("Redo")
        self.undo_actions = UndoActions(self.edits.stack, self.editor.edit, undo, redo,
                                        said=self.show_status)
        p = mb.addMenu("&Prompt")
        self.toolbar.addSeparator()
        A(p, "&Prime prefix", self.jobs.prime, "Ctrl+P", "Evaluate the static prefix once", True)
        A(p, "&Save state…", self.save_state_dialog, "Ctrl+Alt+S", "Save the primed KV state", True)
        A(p, "Save state for llama.cpp…", lambda: self.save_state_dialog("llama"), "",
          "Save the primed KV state as llama.cpp's sequence state file")
        A(p, "&Load state…", self.load_state_dialog, "Ctrl+L",
          "Load a saved KV state (KV Primer's or llama.cpp's)", True)
        p.addSeparator()
        self.toolbar.addSeparator()
        A(p, "&Run cold + warm", lambda: self.jobs.run("both"), "Ctrl+R", "Run the selected rows", True)
        A(p, "Run &cold only", lambda: self.jobs.run("cold"), "Ctrl+Shift+C")
        A(p, "Run &warm only", lambda: self.jobs.run("warm"), "Ctrl+Shift+W")
        A(p, "&Benchmark rows", self.jobs.bench, "Ctrl+B", "Every row cold and warm, repeated", True)
        A(p, "Prefix-length s&weep", self.jobs.sweep, "Ctrl+Shift+B")
        p.addSeparator()
        A(p, "Cancel job", self.worker.cancel, "Esc", "Stop the running job", True)
        v = mb.addMenu("&View")
        v.addAction(self.docks.toggle)
        self.actions_by_text["Advanced panels"] = self.docks.toggle
        self.toolbar.addSeparator()
        self.toolbar.addAction(self.docks.toggle)
        v.addSeparator()
        for d in self.docks.docks:
            v.addAction(d.toggleViewAction())
        v.addAction(self.toolbar.toggleViewAction())
        h = mb.addMenu("&Help")
        A(h, "&Keyboard shortcuts", lambda: show_shortcuts(self, self.shortcut_list()), "F1")
        A(h, "&About KV Primer", lambda: show_about(self))

    def _connect(self) -> None:
        w, s, jobs = self.worker, self.session, self.jobs
        events = self.engine_status.events
        for event in (events.info, events.working, events.closed):  # what ready depends on
            follow(self, event, lambda _value: self._update_actions())
        w.job_started.connect(self._job_started)
        self.status.kernel_news.connect(self.errors.info)  # to the Log, once each
        s.events.state.connect(lambda _ref: self._update_actions())
        s.events.file.connect(self.project.update_title)
        jobs.status.connect(self.show_status)
        jobs.error.connect(self.show_error)
        jobs.context_used.connect(self._context_used)
        self.run_panel.follow_jobs(jobs)
        jobs.state_saved.connect(self.library.on_saved)
        jobs.state_loaded.connect(self.library.on_loaded)
        jobs.state_load_failed.connect(self.library.on_load_failed)
        self.fillings.error.connect(self.show_error)
        for sig in (self.run_panel.run_requested, self.bench.run_requested,
                    self.bench.sweep_requested):
            sig.connect(self.editor.flush)  # first: typed text reaches the session
        self.run_panel.run_requested.connect(jobs.run)
        self.bench.run_requested.connect(jobs.bench)
        self.bench.sweep_requested.connect(jobs.sweep)
        self.bench.error.connect(self.show_error)
        self.model_panel.apply_requested.connect(lambda again: self.load_model(remeasure=again))
        self.model_panel.notice.prime_requested.connect(jobs.prime)
        self.library.load_requested.connect(jobs.load_state)
        self.library.save_requested.connect(self.save_state_dialog)

    def _update_actions(self) -> None:
        ready = self.engine_status.ready
        for name in ENGINE_ACTIONS:
            self.actions_by_text[name].setEnabled(ready)
        can_save = ready and self.session.state is not None
        for name in ("Save state", "Save state for llama.cpp"):
            self.actions_by_text[name].setEnabled(can_save)
        self.actions_by_text["Cancel job"].setEnabled(self.engine_status.working)
        self.run_panel.set_can_run(ready)
        self.bench.set_can_run(ready)
        self.library.set_can(load=ready, save=can_save)

    def _job_started(self, job: Job) -> None:
        if job.kind in (JobKind.BENCH, JobKind.SWEEP) and not self.closing:
            self.central_tabs.setCurrentWidget(self.bench)

    # ---- feedback
    def show_error(self, msg: str) -> None:
        self.errors.error(msg)
        self.status.showMessage(msg, 15000)

    def show_status(self, msg: str) -> None:
        self.errors.info(msg)
        self.status.showMessage(msg, 15000)

    def _context_used(self, used: int) -> None:
        info = self.engine_status.info
        if info:
            self.status.show_context(used, info.n_ctx, info.kv_bytes_per_token)

    # ---- model
    def load_model(self, config: EngineConfig | None = None, remeasure: bool = False):
        """Load the session's engine settings, after setting them to ``config`` if given (a
        program's choice, not an edit to undo). The loaded model stays until the new one works."""
        if config is not None:
            remeasure = remeasure or config.remeasure_kernels
            self.session.set_options(engine=replace(config, remeasure_kernels=False), edit=False)
        config = self.session.options.engine
        name = Path(config.model_path).name if config.model_path else "the default model"
        was = self.engine_status.info  # whose cache held the primed prefix

        def done(info):
            primed = self.session.state
            dropped = self.session.set_model(info)  # a state of another model goes
            lost = prefix_dropped_text(primed, was, info, dropped)  # the new cache is empty
            self.show_status(f"loaded {Path(info.path).name}: {info.n_layer} layers, "
                             f"context {info.n_ctx:,} tokens" + (f"; {lost}" if lost else ""))
            self.model_panel.notice.offer(lost)
            if config.model_path:
                self.recent.add(config.model_path)

        def failed(msg):
            old = self.engine_status.info
            kept = f"; {Path(old.path).name} stays loaded" if old else ""
            self.show_error(f"cannot load {name}: {' '.join(msg.split())}{kept}")
            # the field shows the model that is loaded, not the file that failed
            loaded = self.engine_status.config.model_path if self.engine_status.config else None
            self.session.set_options(engine=replace(self.session.options.engine,
                                                    model_path=loaded), edit=False)

        self.status.showMessage(f"loading {name}…")
        # measuring the kernels again is asked for once, never kept in the settings
        return self.worker.load(replace(config, remeasure_kernels=remeasure), on_done=done,
                                on_error=failed)

    def recent_models(self) -> list[str]:
        return self.recent.paths()

    def open_model(self, path: str):
        """A model file dropped on the window: set it and load it."""
        self.edits.set_engine("model_path", path)
        return self.load_model()

    # ---- states
    def save_state_dialog(self, fmt: str = "kvprimer") -> None:
        if self.session.state is None:
            return self.jobs.save_state("")  # says what to do first
        stem = Path(self.session.template_path or "prefix").stem
        filters = STATE_FILTERS if fmt == "kvprimer" else STATE_FILTERS[::-1]
        suffix = LLAMA_SUFFIX if fmt == "llama" else STATE_SUFFIX
        path, chosen = QFileDialog.getSaveFileName(
            self, "Save KV state", str(self.library.folder / f"{stem}{suffix}"),
            ";;".join(filters))
        if not path:
            return None
        fmt = "llama" if chosen == STATE_FILTERS[1] else "kvprimer"
        for_fa = "auto"
        if fmt == "llama":  # V's layout is the reading context's kernel's: ask which
            for_fa = self.ask("for_fa", FOR_FA_QUESTION)
            if for_fa not in FA_CHOICES:
                return None
        self.save_state_as(path, fmt, for_fa)

    def save_state_as(self, path: str, fmt: str = "kvprimer", for_fa: str = "auto"):
        """Save the primed state as a .kvstate ("kvprimer") or llama.cpp's file ("llama"),
        the latter for a context with flash attention ``for_fa`` (auto|on|off)."""
        suffix = LLAMA_SUFFIX if fmt == "llama" else STATE_SUFFIX
        path = str(path)
        return self.jobs.save_state(path if Path(path).suffix else path + suffix, fmt, for_fa)

    def load_state_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Load KV state", str(self.library.folder),
            f"KV states (*{STATE_SUFFIX} *{LLAMA_SUFFIX});;All files (*)")
        if path:
            self.jobs.load_state(path)

    # ---- closing
    def closeEvent(self, event) -> None:
        if not self.closing and not self.project.settle_unsaved():
            event.ignore()
            return
        self.closing = True
        self._autosave_timer.stop()
        self.docks.save()
        self.worker.shutdown(wait=True)  # cancels the running job, frees the context
        self.project.autosaver.discard()
        self.errors.uninstall_excepthook()
        event.accept()
        self.closed.emit()

    # ---- drag and drop: a file dropped on the window is opened by what it is
    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        for url in event.mimeData().urls():
            self.project.open_path(url.toLocalFile())

    def _restore_layout(self) -> None:
        self.docks.restore()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.docks.size_docks()
        if not self._center_sized:  # once laid out: the editor's surroundings are measured
            self._center_sized = True
            if not self.docks.splits_restored:
                QTimer.singleShot(0, self.fit_center)

    def fit_center(self) -> None:
        """The template's first height: 16 lines, or more when the window is tall."""
        size_center(self.center, self.editor.edit)

    # ---- help
    def shortcut_list(self) -> list[tuple[str, str]]:
        return [(name, a.shortcut().toString(QKeySequence.NativeText))
                for name, a in self.actions_by_text.items() if not a.shortcut().isEmpty()]
