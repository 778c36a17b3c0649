"""The template editor: highlighting, the shaded static prefix, live token counts, syntax errors.

Parsing is cheap and runs on the GUI thread (debounced); counting tokens needs the model, so it
is a worker job. Only one count job is in flight; edits made meanwhile are counted when it ends.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtCore import QRegularExpression, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QTextEdit, QVBoxLayout, QWidget

from ..engine import Template, TemplateSyntaxError
from ..engine.template import FilledPrompt, Literal, Span
from .engine_worker import EngineWorker

PREFIX_SHADE = QColor("#e8f1fb")


def _fmt(color: str, bold: bool = False, background: str | None = None) -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(QColor(color))
    if bold:
        f.setFontWeight(QFont.Bold)
    if background:
        f.setBackground(QColor(background))
    return f


class TemplateHighlighter(QSyntaxHighlighter):
    RULES = [
        # the same rules as app.engine.template: \< escapes, <name> is a placeholder
        (QRegularExpression(r"\\<"), _fmt("#8a8a8a")),
        (QRegularExpression(r"<\|[^|<>\s]+\|>|</?s>"), _fmt("#7b1fa2", bold=True)),
        (QRegularExpression(r"(?<!\\)<[A-Za-z_][A-Za-z0-9_-]*>"),
         _fmt("#0b5cad", bold=True, background="#fff3c4")),
    ]

    def highlightBlock(self, text: str) -> None:
        for rx, fmt in self.RULES:
            it = rx.globalMatch(text)
            while it.hasNext():
                m = it.next()
                self.setFormat(m.capturedStart(), m.capturedLength(), fmt)


@dataclass(frozen=True)
class TokenCounts:
    prefix: int
    segments: tuple[int, ...]  # tokens of each literal part, in order


def count_tokens(engine, template: Template) -> TokenCounts:
    """Worker job body: tokens of the static prefix (with BOS) and of every literal segment."""
    prefix = len(engine.tokenize(template.prefix_prompt()))
    base = len(engine.tokenize(FilledPrompt(())))  # BOS, counted once in the prefix only
    segs = tuple(len(engine.tokenize(FilledPrompt((Span(p.text, True),)))) - base
                 for p in template.parts if isinstance(p, Literal))
    return TokenCounts(prefix, segs)


class TemplateEditor(QWidget):
    template_changed = Signal(object)  # Template, after a successful parse
    counts_changed = Signal(object)  # TokenCounts
    modified = Signal()

    def __init__(self, worker: EngineWorker, parent: QWidget | None = None, debounce_ms: int = 250):
        super().__init__(parent)
        self.worker = worker
        self.edit = QPlainTextEdit()
        self.edit.setObjectName("templateText")
        mono = QFont("DejaVu Sans Mono")
        mono.setStyleHint(QFont.Monospace)
        mono.setPointSize(10)
        self.edit.setFont(mono)
        self.edit.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        self.highlighter = TemplateHighlighter(self.edit.document())
        self.status = QLabel("")
        self.status.setObjectName("templateStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.edit, 1)
        lay.addWidget(self.status)
        self.template: Template | None = None
        self.error: TemplateSyntaxError | None = None
        self.counts: TokenCounts | None = None
        self.path = ""
        self._counting = False
        self._count_again = False
        self._timer = QTimer(self, singleShot=True, interval=debounce_ms)
        self._timer.timeout.connect(self.reparse)
        self.edit.textChanged.connect(self._timer.start)
        self.edit.textChanged.connect(self.modified)
        worker.engine_changed.connect(lambda _info: self.request_counts())

    # ---- text
    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str, path: str = "") -> None:
        self.path = path
        self.edit.setPlainText(text)  # a new document: the undo stack starts here
        self.reparse()

    # ---- parsing
    def reparse(self) -> None:
        self._timer.stop()
        try:
            tpl = Template.parse(self.text())
        except TemplateSyntaxError as e:
            self.error, self.template, self.counts = e, None, None
            self._mark(error=e)
            self.status.setStyleSheet("color: #c62828;")
            self.status.setText(str(e))
            return
        self.error, self.template = None, tpl
        self._mark(prefix_chars=len(_source_prefix(tpl)))
        self._show_status()
        self.template_changed.emit(tpl)
        self.request_counts()

    def _mark(self, prefix_chars: int = 0, error: TemplateSyntaxError | None = None) -> None:
        sels = []
        doc = self.edit.document()
        if prefix_chars:
            s = QTextEdit.ExtraSelection()
            s.format.setBackground(PREFIX_SHADE)
            s.cursor = QTextCursor(doc)
            s.cursor.setPosition(0)
            s.cursor.setPosition(prefix_chars, QTextCursor.KeepAnchor)
            sels.append(s)
        if error:
            block = doc.findBlockByLineNumber(error.line - 1)
            s = QTextEdit.ExtraSelection()
            s.format.setUnderlineStyle(QTextCharFormat.WaveUnderline)
            s.format.setUnderlineColor(QColor("#c62828"))
            s.format.setBackground(QColor("#fde0e0"))
            s.format.setProperty(QTextFormat.FullWidthSelection, False)
            s.cursor = QTextCursor(block)
            start = block.position() + error.column - 1
            s.cursor.setPosition(start)
            s.cursor.setPosition(block.position() + block.length() - 1, QTextCursor.KeepAnchor)
            sels.append(s)
        self.edit.setExtraSelections(sels)

    def _show_status(self) -> None:
        tpl = self.template
        if tpl is None:
            return
        names = ", ".join(f"<{n}>" for n in tpl.placeholders) or "none"
        if self.counts is None:
            counts = "prefix tokens: load a model to count" if self.worker.info is None else \
                "prefix tokens: counting…"
        else:
            segs = " | ".join(f"{n:,}" for n in self.counts.segments)
            counts = f"static prefix (shaded): {self.counts.prefix:,} tokens · segments: {segs}"
        self.status.setStyleSheet("")
        self.status.setText(f"{counts} · placeholders: {names}")

    # ---- token counts (a worker job)
    def request_counts(self) -> None:
        if self.template is None or self.worker.info is None or self.worker.closed:
            self._show_status()
            return
        if self._counting:
            self._count_again = True
            return
        self._counting, self._count_again = True, False
        tpl = self.template
        self.counts = None
        self._show_status()

        def done(counts):
            if tpl is self.template:
                self.counts = counts
                self._show_status()
                self.counts_changed.emit(counts)
            self._finish_count(self._count_again)

        def failed(msg):
            self._finish_count(self._count_again)
            if not self._counting:
                self.status.setText(f"cannot count tokens: {msg}")

        self.worker.submit("count tokens", lambda e, t: count_tokens(e, tpl), on_done=done,
                           on_error=failed, on_cancelled=lambda j: self._finish_count(True),
                           cancel_running=False)

    def _finish_count(self, again: bool) -> None:
        self._counting = False
        if again and not self.worker.closed:
            QTimer.singleShot(0, self.request_counts)


def _source_prefix(tpl: Template) -> str:
    """The static prefix as it stands in the source (escapes included), to shade it."""
    m = re.search(r"(?<!\\)<[A-Za-z_][A-Za-z0-9_-]*>", tpl.source)
    return tpl.source[: m.start()] if m else tpl.source
