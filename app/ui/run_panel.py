"""The Run panel: run selected rows cold, warm or both, stream the text, show what each run cost.

Finished runs are the session's: the panel observes them and shows a table of runs, the
equivalence verdict and a chart of cold vs warm time to first token. The streamed text and the
row being run are transient and come from the jobs. The max-tokens box is the session's option.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QTextCursor
from PySide6.QtWidgets import (QGroupBox, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit,
                               QPushButton, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from ..engine import RunReport, TextDelta
from ..engine.session import RunRecord, Session, run_check
from .charts import TtftBar, TtftChart

COLUMNS = ["row", "path", "reused (tokens)", "evaluated (tokens)", "restore (ms)",
           "first token (ms)", "tokens/s", "speedup", "check"]


def verdict(report: RunReport) -> tuple[bool | None, str]:
    """(passed, text) for the cold/warm equivalence check; None when only one path ran."""
    eq = run_check(report)
    if eq is None:
        return None, "—"
    if eq.tokens_equal:
        how = "bit-identical logits" if eq.max_logit_diff == 0 else \
            f"max |Δlogit| {eq.max_logit_diff:.2g}"
        return True, f"PASS: same tokens, {how}"
    return False, f"FAIL: first difference at generated token {eq.first_diff}"


class RunPanel(QWidget):
    run_requested = Signal(str)  # "both", "cold" or "warm"

    def __init__(self, session: Session, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.current_row = 0
        self.run_buttons: list[QPushButton] = []
        buttons = QHBoxLayout()
        for text, mode, tip in (("▶ Run cold + warm", "both", "Ctrl+R"),
                                ("Cold only", "cold", "Ctrl+Shift+C"),
                                ("Warm only", "warm", "Ctrl+Shift+W")):
            b = QPushButton(text)
            b.setObjectName(f"run_{mode}")
            b.setToolTip(f"Run the selected rows ({tip})")
            b.clicked.connect(lambda _=False, m=mode: self.run_requested.emit(m))
            buttons.addWidget(b)
            self.run_buttons.append(b)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 512)
        self.max_tokens.setValue(session.options.max_tokens)
        self.max_tokens.setPrefix("max new tokens: ")
        self.max_tokens.valueChanged.connect(lambda v: session.set_options(max_tokens=v))
        buttons.addWidget(self.max_tokens)
        buttons.addStretch(1)
        self.verdict = QLabel("Select rows and press Run.")
        self.verdict.setObjectName("verdict")
        f = self.verdict.font()
        f.setBold(True)
        self.verdict.setFont(f)
        buttons.addWidget(self.verdict)

        mono = QFont("DejaVu Sans Mono")
        mono.setPointSize(9)
        self.outputs: dict[str, QPlainTextEdit] = {}
        outs = QHBoxLayout()
        for mode in ("cold", "warm"):
            box = QGroupBox(f"{mode} output")
            t = QPlainTextEdit()
            t.setReadOnly(True)
            t.setFont(mono)
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
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.chart = TtftChart("Time to first token (ms), cold vs warm")

        lower = QSplitter(Qt.Horizontal)
        lower.addWidget(self.table)
        lower.addWidget(self.chart)
        lower.setSizes([600, 300])
        split = QSplitter(Qt.Vertical)
        split.addWidget(out_box)
        split.addWidget(lower)
        split.setSizes([110, 260])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(buttons)
        lay.addWidget(split, 1)
        session.events.runs.connect(self._runs_changed)
        session.events.options.connect(lambda o: self.max_tokens.setValue(o.max_tokens))
        for rec in session.runs:
            self._runs_changed(rec)

    def set_can_run(self, on: bool) -> None:
        for b in self.run_buttons:
            b.setEnabled(on)

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
            if not t.toPlainText():
                t.setPlainText(path.text)
            self._add_line(number, report, path)
        ok, text = verdict(report)
        if ok is not None:
            self.verdict.setText(text)
            self.verdict.setStyleSheet(f"color: {'#2e7d32' if ok else '#c62828'};")
        bars = [TtftBar.single(r.row, r.report.cold.ttft_ms, r.report.warm.ttft_ms)
                for r in self.session.runs if r.report.cold and r.report.warm]
        self.chart.set_bars(bars[-12:])

    def _add_line(self, number: int, report: RunReport, path) -> None:
        ok, text = verdict(report)
        speed = report.speedup
        cells = [str(number), path.mode, f"{path.reused_tokens:,}", f"{path.evaluated_tokens:,}",
                 f"{path.restore_ms:.1f}" if path.mode == "warm" else "—", f"{path.ttft_ms:.1f}",
                 f"{path.tokens_per_s:.1f}",
                 f"×{speed:.1f}" if speed and path.mode == "warm" else "—",
                 ("PASS" if ok else f"FAIL at {run_check(report).first_diff}")
                 if ok is not None and path.mode == "warm" else ""]
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, v in enumerate(cells):
            item = QTableWidgetItem(v)
            item.setToolTip(text)
            if c == len(cells) - 1 and ok is not None and path.mode == "warm":
                item.setForeground(Qt.darkGreen if ok else Qt.red)
            self.table.setItem(r, c, item)
        self.table.scrollToBottom()

    def clear(self) -> None:
        self.table.setRowCount(0)
        self.chart.set_bars([])
        for t in self.outputs.values():
            t.clear()
        self.verdict.setText("Select rows and press Run.")
        self.verdict.setStyleSheet("")
