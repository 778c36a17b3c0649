"""The Run panel: run selected rows cold, warm or both, stream the text, show what each run cost.

Finished runs are the session's: the panel observes them and shows a table of runs, the
verdict (bit-identical, within-noise or diverged, coloured, with its figures), what the warm run
reused, where its time went (copy, evaluation, first token; and when chain's batching cost more
than it saves), and a chart of cold vs warm time to first token. A warm-only run shows "not yet
verified" until Verify makes its cold run (between jobs); a verdict judged against a cold run
kept from an earlier run says so. The streamed text, the row being run and a long cold run's
estimate are transient and come from the jobs. A composed run's line also says what it
recomputed and how close it came (same tokens, top-1 agreement, KL). The max-tokens, reuse-mode, recompute and
"always measure noise" boxes are the session's options, changed through SessionEdits (undoable).
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QTextCursor
from PySide6.QtWidgets import (QGroupBox, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit,
                               QPushButton, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from ..engine import RunReport, TextDelta, Verdict
from ..engine.session import RunRecord, Session
from .charts import TtftBar, TtftChart
from .compose_columns import accuracy_texts, recompute_box
from .narrow_widgets import FlowRow
from .result_marks import EarlierNote, changes, grey_rows
# MODE_TIPS serves the Benchmark view too, which imports it from here
from .run_options import MODE_TIPS, noise_box, reuse_mode_box
from .session_edits import SessionEdits

COLUMNS = ["row", "path", "reuse", "reused (tokens)", "evaluated (tokens)", "first token (ms)",
           "speedup", "verdict", "recomputed", "same tokens", "top-1 agree", "KL (nats)",
           "fork (ms)", "tokens/s", "model"]
COMPOSE_COLUMNS = ("recomputed", "same tokens", "top-1 agree", "KL (nats)")
# the verdict's word, coloured: exact, as close as the model's own noise, different
VERDICT_COLORS = {"bit-identical": "#2e7d32", "within-noise": "#b26a00", "diverged": "#c62828"}


def verdict_color(v: Verdict | None) -> QColor:
    return QColor(VERDICT_COLORS.get(v.equivalence, "#455a64") if v else "#455a64")


def verdict_details(v: Verdict) -> str:
    """The verdict's one line (``describe()``) without its leading word, which is shown apart."""
    rest = v.describe()[len(v.equivalence):].lstrip(" ;")
    if rest.startswith("("):
        inner, _, note = rest[1:].partition(")")
        rest = inner + note
    exact = "same tokens, logits equal bit for bit" if v.exact else ""
    return "; ".join(x for x in (exact, rest) if x)


def breakdown_text(report: RunReport) -> str:
    """Where the warm time went, and how many evaluations the run made, for the result."""
    b = report.breakdown
    if b is None:
        return ""
    names = {"cold": None if report.cold_kept else report.cold, "warm": report.warm,
             "noise": report.oneshot}
    evals = [name for name, p in names.items() if p is not None]
    noise = ("; noise floor measured (one-shot cold run "
             f"{report.oneshot.ttft_ms:,.0f} ms)" if report.oneshot else "")
    count = f"{len(evals)} evaluation{'s' if len(evals) > 1 else ''} ({', '.join(evals)})"
    if report.cold_kept:
        count += "; its cold run kept from an earlier run"
    text = f"Warm time: {b.describe()} · {count}{noise}"
    return f"{text}\nNote: {b.batching_note}" if b.batching_note else text


class RunPanel(QWidget):
    run_requested = Signal(str)  # "both", "cold" or "warm"
    verify_requested = Signal()  # the shown warm-only run: make its cold run now

    def __init__(self, session: Session, edits: SessionEdits | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        edits = edits or SessionEdits(session, self)
        self.current_row = 0
        self.run_buttons: list[QPushButton] = []
        # one line when there is room, more when the docks beside it leave little
        buttons = FlowRow()
        for text, mode, tip in (("▶ Run cold + warm", "both", "Ctrl+R"),
                                ("Cold only", "cold", "Ctrl+Shift+C"),
                                ("Warm only", "warm", "Ctrl+Shift+W")):
            b = QPushButton(text)
            b.setObjectName(f"run_{mode}")
            b.setToolTip(f"Run the selected rows ({tip})")
            b.clicked.connect(lambda _=False, m=mode: self.run_requested.emit(m))
            buttons.addWidget(b)
            self.run_buttons.append(b)
        self.verify_button = QPushButton("Verify")
        self.verify_button.setObjectName("verify")
        self.verify_button.setToolTip("Make the cold run of the last warm-only run now and judge "
                                      "it (a kept cold run of the same prompt if there is one)")
        self.verify_button.setEnabled(False)
        self.verify_button.clicked.connect(lambda _=False: self.verify_requested.emit())
        buttons.addWidget(self.verify_button)
        self._can_run, self._shown = False, None
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 512)
        self.max_tokens.setValue(session.options.max_tokens)
        self.max_tokens.setPrefix("max new tokens: ")
        self.max_tokens.valueChanged.connect(
            lambda v: edits.set_option("max_tokens", v, merge=True))
        buttons.addWidget(self.max_tokens)
        buttons.addWidget(QLabel("reuse:"))
        self.reuse_mode = reuse_mode_box(session, edits, self)
        self.recompute = recompute_box(session, edits, self)
        buttons.addWidget(self.reuse_mode)
        buttons.addWidget(self.recompute)
        self.noise = noise_box(session, edits, self)
        buttons.addWidget(self.noise)
        # what the last warm run reused, and its verdict against the cold run
        self.reuse = QLabel("")
        self.reuse.setObjectName("reuseText")
        self.reuse.setWordWrap(True)  # a chain run's reuse line grows with its values' previews
        self.reuse.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # where the last warm run's time to first token went
        self.breakdown = QLabel("")
        self.breakdown.setObjectName("warmBreakdown")
        self.breakdown.setWordWrap(True)
        self.breakdown.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.verdict = QLabel("Select rows and press Run.")
        self.verdict.setObjectName("verdict")
        # a few words ("bit-identical", "not yet verified"): one line, the details beside it
        # wrap (wrapped, it was given a word's width and broke "Select rows and press Run.")
        self.verdict.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.details = QLabel("")
        self.details.setObjectName("verdictDetails")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        f = self.verdict.font()
        f.setBold(True)
        self.verdict.setFont(f)
        result = QHBoxLayout()
        result.addWidget(self.verdict)
        result.addWidget(self.details, 1)

        mono = QFont("DejaVu Sans Mono")
        mono.setPointSize(9)
        self.outputs: dict[str, QPlainTextEdit] = {}
        outs = QHBoxLayout()
        for mode in ("cold", "warm"):
            box = QGroupBox(f"{mode} output")
            t = QPlainTextEdit()
            t.setReadOnly(True)
            t.setFont(mono)
            # two lines at the least: on a short screen the table and chart below keep theirs
            t.setMinimumHeight(2 * QFontMetrics(mono).lineSpacing() + 12)
            t.setObjectName(f"output_{mode}")
            QVBoxLayout(box).addWidget(t)
            box.layout().setContentsMargins(4, 4, 4, 4)
            self.outputs[mode] = t
            outs.addWidget(box)
        out_box = QWidget()
        out_box.setLayout(outs)
        outs.setContentsMargins(0, 0, 0, 0)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("runsTable")
        # "reused (tokens)" on two lines: the columns are as narrow as their numbers
        self.table.setHorizontalHeaderLabels([c.replace(" (", "\n(") for c in COLUMNS])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self._origins: list = []  # per table line, its run's ResultOrigin
        self.earlier = EarlierNote("run")
        self.chart = TtftChart("Time to first token (ms), cold vs warm")

        lower = QSplitter(Qt.Horizontal)
        lower.addWidget(self.table)
        lower.addWidget(self.chart)
        lower.setSizes([660, 280])
        split = QSplitter(Qt.Vertical)
        split.addWidget(out_box)
        split.addWidget(lower)
        split.setSizes([110, 260])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(buttons)
        lay.addWidget(self.reuse)
        lay.addWidget(self.breakdown)
        lay.addLayout(result)
        lay.addWidget(self.earlier)
        lay.addWidget(split, 1)
        session.events.runs.connect(self._runs_changed)
        session.events.options.connect(self._options_changed)
        session.events.template.connect(self.refresh_marks)
        session.events.model.connect(lambda _info: self.refresh_marks())
        self._options_changed(session.options)
        for rec in session.runs:
            self._runs_changed(rec)

    def minimumSizeHint(self) -> QSize:
        """As tall as the page needs at its width. A layout's own minimum counts the wrapped
        controls and word-wrapped lines as one line each: on a short screen the tabs then gave
        the page less than that, and cut the table and the chart's legend off at the bottom."""
        hint = super().minimumSizeHint()
        if self.width() > 0:
            hint.setHeight(max(hint.height(), self.layout().minimumHeightForWidth(self.width())))
        return hint

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()  # the wrapped height changes with the width

    def _options_changed(self, o) -> None:
        self.max_tokens.setValue(o.max_tokens)
        # chain reuses cells in place or copies them; it forks nothing
        self.table.setColumnHidden(COLUMNS.index("fork (ms)"), o.reuse_mode == "chain")
        self._show_compose_columns()

    def _show_compose_columns(self) -> None:
        """Compose's accuracy columns, while runs compose or a composed run is listed: exact
        runs say all of it in their verdict, and the table fits a small screen without them."""
        shown = self.session.options.reuse_mode == "compose" or any(
            r.report.reuse == "compose" for r in self.session.runs)
        for name in COMPOSE_COLUMNS:
            self.table.setColumnHidden(COLUMNS.index(name), not shown)

    def refresh_marks(self) -> None:
        """Mark the runs of an earlier template, model or settings (kept, greyed)."""
        now = self.session.origin()
        self.earlier.show_for([r.origin for r in self.session.runs], now)
        grey_rows(self.table, changes(self._origins, now), self._origins)

    def show_failure(self, msg: str) -> None:
        """A run that stopped with an error: the verdict area says so, rather than the last
        run's verdict above emptied output boxes."""
        for t in self.outputs.values():
            t.clear()
        self.reuse.setText("")
        self.breakdown.setText("")
        self.verdict.setText("not run")
        self.verdict.setStyleSheet(f"color: {verdict_color(None).name()};")
        self.details.setText(msg)
        self._shown = None
        self._update_verify()

    def set_can_run(self, on: bool) -> None:
        for b in self.run_buttons:
            b.setEnabled(on)
        self._can_run = on
        self._update_verify()

    def _update_verify(self) -> None:
        r = self._shown
        self.verify_button.setEnabled(self._can_run and r is not None and not r.verified)

    def show_estimate(self, text: str) -> None:
        """Before a long cold run: how long it will take, where its verdict will be ("": the
        run stopped; the last verdict again)."""
        if not text:
            if self.verdict.text() == "verifying…":
                self.verdict.setText("")
                self.details.setText("")
                if self._shown is not None:
                    self.show_verdict(self._shown)
            return
        self.verdict.setText("verifying…")
        self.verdict.setStyleSheet("")
        self.details.setText(text)

    def show_verified(self, record: RunRecord) -> None:
        """An earlier run verified later: its cold line, chart bar and verdict."""
        rep, v = record.report, record.report.verdict
        for r in reversed(range(self.table.rowCount())):  # its warm line gets the verdict
            if [self.table.item(r, c).text() for c in (0, 1)] == [str(record.row), "warm"]:
                for col, text in (("speedup", f"×{rep.speedup:.1f}" if rep.speedup else "—"),
                                  ("verdict", v.equivalence if v else ""),
                                  *zip(COMPOSE_COLUMNS, accuracy_texts(rep, True))):
                    self.table.item(r, COLUMNS.index(col)).setText(text)
                if v:
                    self.table.item(r, COLUMNS.index("verdict")).setForeground(verdict_color(v))
                break
        if rep.cold is not None:
            self._add_line(record.row, rep, rep.cold, record.origin)
        self._refresh_chart()
        self.show_verdict(record.report)

    def follow_jobs(self, jobs) -> None:
        """Show what the jobs (prompt_jobs.PromptJobs) tell of runs; Verify asks them."""
        jobs.row_started.connect(self.begin_row)
        jobs.delta.connect(self.on_delta)
        jobs.cold_estimate.connect(self.show_estimate)
        jobs.verified.connect(self.show_verified)
        jobs.run_failed.connect(self.show_failure)
        self.verify_requested.connect(jobs.verify)

    # ---- transient: the row being run and its streamed text
    def begin_row(self, number: int) -> None:
        self.current_row = number
        for t in self.outputs.values():
            t.clear()

    def on_delta(self, delta: TextDelta) -> None:
        t = self.outputs.get(delta.mode)
        if t is not None:
            t.moveCursor(QTextCursor.End)
            t.insertPlainText(delta.text)

    # ---- the session's runs
    def _runs_changed(self, record: RunRecord | None) -> None:
        if record is None:
            self.clear()
            return
        number, report = record.row, record.report
        for path in (report.cold, report.warm):
            if path is None:
                continue
            t = self.outputs[path.mode]
            if t.toPlainText() != path.text:  # the streamed pieces lack a last partial character
                t.setPlainText(path.text)
            self._add_line(number, report, path, record.origin)
        self._show_compose_columns()
        self.show_verdict(report)
        self._refresh_chart()
        self.refresh_marks()

    def _refresh_chart(self) -> None:
        bars = [TtftBar.single(r.row, r.report.cold.ttft_ms, r.report.warm.ttft_ms)
                for r in self.session.runs if r.report.cold and r.report.warm]
        self.chart.set_bars(bars[-12:])

    def show_verdict(self, report: RunReport) -> None:
        if report.warm:
            tier = f"{report.reuse} mode" + (f", {report.build_ms:,.0f} ms building modules"
                                             if report.build_ms else "")
            recomputed = f" · {report.recompute.describe()}" if report.recompute else ""
            self.reuse.setText(f"Reused ({tier}): {report.reuse_text()}{recomputed}")
        self.breakdown.setText(breakdown_text(report))
        self._shown = report
        self._update_verify()
        v = report.verdict
        if v is None:
            if report.warm is not None:  # warm only, and no kept cold run could judge it
                self.verdict.setText("not yet verified")
                self.verdict.setStyleSheet(f"color: {verdict_color(None).name()};")
                self.details.setText("warm only: Verify runs its cold run now")
            return
        self.verdict.setText(v.equivalence)
        kept = "; against a cold run kept from an earlier run" if report.cold_kept else ""
        self.details.setText(verdict_details(v) + kept)
        self.verdict.setStyleSheet(f"color: {verdict_color(v).name()};")

    def _add_line(self, number: int, report: RunReport, path, origin=None) -> None:
        v, warm = report.verdict, path.mode == "warm"
        speed = report.speedup
        cells = [str(number), path.mode, report.reuse if warm else "—",
                 f"{path.reused_tokens:,}", f"{path.evaluated_tokens:,}", f"{path.ttft_ms:,.1f}",
                 f"×{speed:.1f}" if speed and warm else "—", v.equivalence if v and warm else "",
                 *accuracy_texts(report, warm),
                 f"{path.restore_ms:,.1f}" if warm else "—", f"{path.tokens_per_s:,.1f}",
                 origin.model if origin else ""]
        tip = (f"{report.reuse_text()}\n{v.describe()}" if v else report.reuse_text()) if warm else ""
        r = self.table.rowCount()
        self.table.insertRow(r)
        self._origins.append(origin)
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(tip)
            if c == COLUMNS.index("verdict") and v and warm:
                item.setForeground(verdict_color(v))
            self.table.setItem(r, c, item)
        self.table.scrollToBottom()

    def clear(self) -> None:
        self.table.setRowCount(0)
        self._origins = []
        self.earlier.hide()
        self.chart.set_bars([])
        for t in self.outputs.values():
            t.clear()
        self.verdict.setText("Select rows and press Run.")
        self.verdict.setStyleSheet("")
        self.details.setText("")
        self.reuse.setText("")
        self.breakdown.setText("")
        self._shown = None
        self._update_verify()
