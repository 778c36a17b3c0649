"""The Server tab, beside Run and Benchmark: a server target (URL, API kind), its health, model
and slots; Deploy the template's prefix into a llama-server slot; run the session's rows on
the server and compare them with KV Primer's local cold runs (charts: time to first token, and
the tokens the server reused per row).

It only shows and forwards: each button makes its flow's plan (app/servers/server_flows.py, the
flows `kvprimer info --server`, `deploy` and `bench --server` run, with the same defaults and
refusals) and runs the flow's body on the engine worker (it primes, tokenizes and runs the local
cold reference). The results are the session's (``session.server``, ``session.deployed``),
saved in the project like benchmark results: rows arrive there as they finish, and this view
shows whatever the session holds, a reopened project's too. The new-token box is the session's
option, the one the Run tab's box sets.

The API box offers the CLI's ``--api`` choices. "chat" sends each row as the session's chat
messages (``Session.chat_template``), so it is offered only while the template is their
rendering; with plain text it is disabled and its tooltip, and the buttons', say why.
"""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QSplitter, QTableWidget,
                               QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from ..engine import KvPrimerError
from ..servers import server_flows as flows
from ..engine.session import Session
from .charts import COLD, WARM, BarSeries, TtftChart
from .engine_worker import EngineWorker, JobKind
from .model_events import follow
from .session_edits import SessionEdits

LOCAL = QColor("#7a7a7a")
COLUMNS = [("row", "row"), ("prompt_tokens", "prompt"), ("prefix_tokens", "prefix"),
           ("server_cached_tokens", "reused by server"), ("server_evaluated_tokens", "evaluated"),
           ("local_cold_ms", "local cold (ms)"), ("cold_ms", "server cold (ms)"),
           ("warm_ms", "server warm (ms)"), ("tokens_equal", "same tokens as local cold"),
           ("server_cold_equal", "server warm = its cold"), ("miss_reason", "miss"),
           ("output_note", "why the output differs")]
# the table's legend: what each column means, as its header's tooltip
COLUMN_TIPS = {
    "row": "The row's number in the rows table",
    "prompt_tokens": "Tokens of the whole filled prompt",
    "prefix_tokens": "Tokens of the template's static prefix (what Deploy put in the slot)",
    "server_cached_tokens": "Tokens the server took from its cache for the warm request "
                            "(llama-server's timings.cache_n, or the API's cached_tokens)",
    "server_evaluated_tokens": "Tokens the server evaluated for the warm request",
    "local_cold_ms": "Time to first token of KV Primer's own cold run, on this machine",
    "cold_ms": "The server's time to first token with its cache bypassed (cache_prompt off)",
    "warm_ms": "The server's time to first token with cache_prompt on, its cache as the "
               "rows before left it",
    "tokens_equal": "The server's warm tokens equal KV Primer's local cold tokens (compared "
                    "only when the server runs the same model file)",
    "server_cold_equal": "The server's warm tokens equal its own cold tokens",
    "miss_reason": "Why the server did not reuse the static prefix, if it did not",
    "output_note": "Why the server's output may differ from the local run"}


API_TIPS = {"llama": "llama-server's own API: token-id prompts, slots",
             "openai": "any OpenAI-compatible /v1/completions (llama-server, vLLM, SGLang)",
             "chat": "OpenAI chat requests to /v1/chat/completions: each row as the chat "
                     "template's messages, rendered by the server"}
NO_CHAT = ("The chat API sends each row as chat messages, and the template is plain text: open "
           "a chat template (.json or .yaml) or write one in the Template box's Messages tab")
BENCH_TIP = {"llama": "Run every row on the server, warm then cold, each compared with KV "
                      "Primer's local cold run",
             "openai": "Run every row on the server's /v1/completions, warm then cold, each "
                       "compared with KV Primer's local cold run",
             "chat": "Send every row as an OpenAI chat request to /v1/chat/completions, warm "
                     "then cold, each compared with KV Primer's warm run from the primed prefix"}
DEPLOY_TIPS = {"llama": "Prime the template's static prefix, restore it into the slot and check "
                        "the server reuses it",
               "chat": "Prime the messages' static prefix, restore it into the slot (llama-server's "
                       "own API) and check with a chat request that the server reuses it"}
DEPLOY_OPENAI = ("Deploying restores a llama-server slot, which only llama-server's own API (or "
                 "chat, on llama-server) can do")


class ServerView(QWidget):
    message = Signal(str)  # a one-line outcome or error, for the status bar

    def __init__(self, worker: EngineWorker, session: Session, settings: QSettings | None = None,
                 parent: QWidget | None = None, edits: SessionEdits | None = None):
        super().__init__(parent)
        self.worker, self.session = worker, session
        self.edits = edits or SessionEdits(session, self)
        self.settings = settings or QSettings("kvprimer", "KV Primer")
        self.url = QLineEdit(str(self.settings.value("server/url", "http://127.0.0.1:8080")))
        self.url.setObjectName("serverUrl")
        self.api = QComboBox(objectName="serverApi")
        self.api.addItems(list(API_TIPS))
        for i, tip in enumerate(API_TIPS.values()):
            self.api.setItemData(i, tip, Qt.ToolTipRole)
        self.api.setCurrentText(str(self.settings.value("server/api", "llama")))
        self.api.setToolTip("llama: llama-server's own API (token ids, slots); openai: any "
                            "OpenAI-compatible /v1/completions (llama-server, vLLM, SGLang); "
                            "chat: their /v1/chat/completions, each row as the chat "
                            "template's messages")
        self.check_button = QPushButton("Check")
        self.status = QLabel("not checked")
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.slot = QSpinBox(minimum=0, maximum=255, value=flows.DEPLOY_SLOT)
        self.slot_dir = QLineEdit(str(self.settings.value("server/slot_dir", "")))
        self.slot_dir.setPlaceholderText("the server's --slot-save-path")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.deploy_button = QPushButton("Deploy prefix")
        # the session's new-token count: the local runs' (the Run tab sets it too) and the CLI's
        self.max_tokens = QSpinBox(minimum=1, maximum=512, value=session.options.max_tokens)
        self.max_tokens.valueChanged.connect(
            lambda v: self.edits.set_option("max_tokens", v, merge=True))
        session.events.options.connect(lambda o: self.max_tokens.setValue(o.max_tokens))
        self.bench_button = QPushButton("Run rows on server")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([h for _, h in COLUMNS])
        for c, (key, _h) in enumerate(COLUMNS):
            self.table.horizontalHeaderItem(c).setToolTip(COLUMN_TIPS[key])
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)  # the row column says which row it is
        self.ttft_chart = TtftChart("Time to first token per row (ms)")
        self.cached_chart = TtftChart("Tokens per row: the prefix and what the server reused")

        form = QFormLayout()
        target = QHBoxLayout()
        target.addWidget(self.url, 3)
        target.addWidget(self.api)
        target.addWidget(self.check_button)
        form.addRow("Server", target)
        form.addRow("", self.status)
        slots = QHBoxLayout()
        slots.addWidget(QLabel("slot"))
        slots.addWidget(self.slot)
        slots.addWidget(self.slot_dir, 3)
        slots.addWidget(browse)
        slots.addWidget(self.deploy_button)
        form.addRow("Deploy", slots)
        run = QHBoxLayout()
        run.addWidget(QLabel("new tokens"))
        run.addWidget(self.max_tokens)
        run.addStretch(1)
        run.addWidget(self.bench_button)
        form.addRow("Rows", run)
        # the table beside the charts, not above them: on a short screen the rows stay readable
        self.charts = QTabWidget()
        self.charts.setObjectName("serverCharts")
        self.charts.addTab(self.ttft_chart, "time to first token")
        self.charts.addTab(self.cached_chart, "tokens reused")
        split = QSplitter(Qt.Horizontal)
        split.addWidget(self.table)
        split.addWidget(self.charts)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addWidget(split, 1)

        self.check_button.clicked.connect(self.check)
        self.deploy_button.clicked.connect(self.deploy)
        self.bench_button.clicked.connect(self.bench)
        for w in (self.url, self.slot_dir):
            w.editingFinished.connect(self._remember)
        self.api.currentTextChanged.connect(self._remember)
        events = worker.engine_status.events
        for event in (events.info, events.working, events.closed):  # what ready depends on
            follow(self, event, self.update_actions)
        follow(self, session.events.template, self.update_actions)  # chat or text template
        self.api.currentTextChanged.connect(self.update_actions)
        self.worker.partial.connect(self._on_partial)
        self._bench_job = None
        session.events.server.connect(self._show)
        self.update_actions()
        self._show()

    # ---- state
    def _remember(self) -> None:
        self.settings.setValue("server/url", self.url.text().strip())
        self.settings.setValue("server/api", self.api.currentText())
        self.settings.setValue("server/slot_dir", self.slot_dir.text().strip())

    def _browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "The server's slot directory", self.slot_dir.text())
        if d:
            self.slot_dir.setText(d)
            self._remember()

    def update_actions(self, *_) -> None:
        ready = self.worker.engine_status.ready
        api = self.api.currentText()
        chat = self.session.chat_template() is not None
        # the chat API sends the session's messages: none while the template is plain text
        item = self.api.model().item(self.api.findText("chat"))
        item.setEnabled(chat)
        item.setToolTip(API_TIPS["chat"] if chat else NO_CHAT)
        no_chat = api == "chat" and not chat
        self.bench_button.setEnabled(ready and not no_chat)
        self.bench_button.setToolTip(NO_CHAT if no_chat else BENCH_TIP[api])
        self.deploy_button.setEnabled(ready and api in ("llama", "chat") and not no_chat)
        self.deploy_button.setToolTip(NO_CHAT if no_chat else DEPLOY_TIPS.get(api, DEPLOY_OPENAI))

    # ---- jobs (plans here, bodies on the worker: they block on the network and use the engine)
    def _plan(self, make):
        """The flow's plan, or None after saying in one line why the flow cannot start."""
        try:
            return make(flows.server_target(self.url.text(), self.api.currentText()))
        except KvPrimerError as e:
            self._failed(str(e))
            return None
        finally:
            self._remember()

    def check(self):
        target = self._plan(lambda t: t)
        if target is None:
            return None
        self.status.setText("checking…")
        return self.worker.submit(JobKind.SERVER_CHECK,
                                  lambda e, task: flows.check_target(e, target, task),
                                  label="check server", on_done=lambda f: self._checked(f.describe()),
                                  on_error=self._failed, cancel_running=False)

    def _checked(self, text: str) -> None:
        self.status.setText(text)
        self.message.emit(text)

    def _failed(self, msg: str) -> None:
        self.status.setText(msg)
        self.message.emit(msg)

    def deploy(self):
        plan = self._plan(lambda t: flows.session_deploy_plan(
            self.session, t, self.slot_dir.text(), self.slot.value()))
        if plan is None:
            return None

        def done(result):
            self.session.set_deployed(result)
            self._checked(result.describe())

        return self.worker.submit(JobKind.SERVER, lambda e, task: flows.deploy(e, plan, task),
                                  label="deploy", on_done=done, on_error=self._failed)

    def bench(self):
        plan = self._plan(lambda t: flows.session_server_bench_plan(self.session, t))
        if plan is None:
            return None
        # the rows so far are the session's as they finish, so a cancel keeps them
        self.session.set_server_bench(flows.started(plan))
        self._bench_job = self.worker.submit(
            JobKind.SERVER, lambda e, task: flows.bench_on_server(e, plan, task),
            label="rows on server", on_done=self._benched, on_error=self._failed)
        return self._bench_job

    def _on_partial(self, job, item) -> None:
        if job is self._bench_job and hasattr(item, "server_cached_tokens"):
            self.session.add_server_row(item)

    def _benched(self, res) -> None:
        self.session.set_server_bench(res)
        self._checked(res.describe())

    # ---- view
    @property
    def results(self) -> list:
        """The server rows the session holds."""
        return list(self.session.server.rows) if self.session.server else []

    def _show(self) -> None:
        rs = self.results
        deployed = self.session.deployed
        if deployed is not None and self.status.text() == "not checked":
            self.status.setText(deployed.describe())  # a reopened project's last deployment
        self.table.setRowCount(len(rs))
        for i, r in enumerate(rs):
            for j, (key, _) in enumerate(COLUMNS):
                v = getattr(r, key)
                text = ("–" if v is None else "yes" if v is True else "no" if v is False
                        else f"{v:.1f}" if isinstance(v, float) else str(v))
                item = self.table.item(i, j)
                if item is None:
                    self.table.setItem(i, j, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
        forms = [(f"row {r.row}", f"{r.row}") for r in rs]
        ms = [("local cold", LOCAL, [r.local_cold_ms or 0.0 for r in rs]),
              ("server cold", COLD, [r.cold_ms for r in rs]),
              ("server warm", WARM, [r.warm_ms for r in rs])]
        self.ttft_chart.set_series(forms, [BarSeries(n, c, v, v, v) for n, c, v in ms], "row")
        toks = [("static prefix", LOCAL, [float(r.prefix_tokens) for r in rs]),
                ("reused by server", WARM, [float(r.server_cached_tokens or 0) for r in rs])]
        self.cached_chart.set_series(forms, [BarSeries(n, c, v, v, v) for n, c, v in toks], "row",
                                     unit="tokens")
