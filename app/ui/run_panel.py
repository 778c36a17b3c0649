"""The Run panel: run selected rows cold, warm or both, stream the text, show what each run cost.

The main window runs the job; this panel receives the row being run, the streamed TextDeltas
and each finished RunReport, and shows them: a table of runs, the equivalence verdict and a
chart of cold vs warm time to first token.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QTextCursor
from PySide6.QtWidgets import (QGroupBox, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit,
                               QPushButton, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from ..engine import BenchRow, RunReport, TextDelta
from .bench_view import TtftChart

COLUMNS = ["row", "path", "reused", "evaluated", "restore ms", "TTFT ms", "tok/s", "speedup",
           "check"]


def verdict(report: RunReport) -> tuple[bool | None, str]:
    """(passed, text) for the cold/warm equivalence check; None when only one path ran."""
    eq = report.equivalence
    if eq is None:
        return None, "—"
    if eq.tokens_equal:
        how = "bit-identical logits" if eq.max_logit_diff == 0 else \
            f"max |Δlogit| {eq.max_logit_diff:.2g}"
        return True, f"PASS: same tokens, {how}"
    return False, f"FAIL: first difference at generated token {eq.first_diff}"


def as_bench_row(number: int, r: RunReport) -> BenchRow:
    return BenchRow(row=number, prefix_tokens=r.prefix_tokens, cold_ms=r.cold.ttft_ms,
                    warm_ms=r.warm.ttft_ms, cold_ms_min=r.cold.ttft_ms, cold_ms_max=r.cold.ttft_ms,
                    warm_ms_min=r.warm.ttft_ms, warm_ms_max=r.warm.ttft_ms,
                    restore_ms=r.warm.restore_ms, speedup=r.speedup or 0.0)


class RunPanel(QWidget):
    run_requested = Signal(str)  # "both", "cold" or "warm"

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.reports: list[tuple[int, RunReport]] = []
        self.current_row = 0
        buttons = QHBoxLayout()
        for text, mode, tip in (("▶ Run cold + warm", "both", "Ctrl+R"),
                                ("Cold only", "cold", "Ctrl+Shift+C"),
                                ("Warm only", "warm", "Ctrl+Shift+W")):
            b = QPushButton(text)
            b.setObjectName(f"run_{mode}")
            b.setToolTip(f"Run the selected rows ({tip})")
            b.clicked.connect(lambda _=False, m=mode: self.run_requested.emit(m))
            buttons.addWidget(b)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 512)
        self.max_tokens.setValue(24)
        self.max_tokens.setPrefix("max new tokens: ")
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

    # ---- fed by the main window
    def begin_row(self, number: int) -> None:
        self.current_row = number
        for t in self.outputs.values():
            t.clear()

    def on_delta(self, delta: TextDelta) -> None:
        t = self.outputs.get(delta.mode)
        if t is not None:
            t.moveCursor(QTextCursor.End)
            t.insertPlainText(delta.text)

    def add_report(self, number: int, report: RunReport) -> None:
        self.reports.append((number, report))
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
        both = [as_bench_row(n, r) for n, r in self.reports if r.cold and r.warm]
        self.chart.set_rows(both[-12:])

    def _add_line(self, number: int, report: RunReport, path) -> None:
        ok, text = verdict(report)
        speed = report.speedup
        cells = [str(number), path.mode, f"{path.reused_tokens:,}", f"{path.evaluated_tokens:,}",
                 f"{path.restore_ms:.1f}" if path.mode == "warm" else "—", f"{path.ttft_ms:.1f}",
                 f"{path.tokens_per_s:.1f}",
                 f"×{speed:.1f}" if speed and path.mode == "warm" else "—",
                 ("PASS" if ok else f"FAIL at {report.equivalence.first_diff}")
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
        self.reports.clear()
        self.table.setRowCount(0)
        self.chart.set_rows([])
        for t in self.outputs.values():
            t.clear()
        self.verdict.setText("Select rows and press Run.")
        self.verdict.setStyleSheet("")
