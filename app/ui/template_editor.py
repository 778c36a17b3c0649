"""The template editor: highlighting, the shaded static prefix, live token counts, syntax errors.

The session holds the template: typing reaches it after a short pause (``flush`` sends it at
once), and text the session gets elsewhere (a project, an example) is shown here. Counting
tokens needs the model, so it is a background worker job; only one is in flight, and edits made
meanwhile are counted when it ends.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRegularExpression, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QTextEdit, QVBoxLayout, QWidget

from ..engine import Template, TemplateSyntaxError
from ..engine.session import Session
from ..engine.prompts.template import PLACEHOLDER_RE, Placeholder
from .engine_worker import EngineWorker, JobKind
from .model_events import follow

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
        # app.engine.prompts.template's rules: \< escapes, <name> is a placeholder
        (QRegularExpression(r"\\<"), _fmt("#8a8a8a")),
        (QRegularExpression(r"<\|[^|<>\s]+\|>|</?s>"), _fmt("#7b1fa2", bold=True)),
        (QRegularExpression(PLACEHOLDER_RE.pattern),
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
    prefix: int  # tokens of the static prefix, BOS included


def count_tokens(engine, template: Template) -> TokenCounts:
    """Worker job body."""
    return TokenCounts(len(engine.tokenize(template.prefix_prompt())))


def source_prefix_chars(tpl: Template) -> int:
    """How many characters of the source (escapes included) come before the first placeholder."""
    first = next((p for p in tpl.parts if isinstance(p, Placeholder)), None)
    if first is None:
        return len(tpl.source)
    lines = tpl.source.split("\n")
    return sum(len(ln) + 1 for ln in lines[:first.line - 1]) + first.column - 1


def prefix_label(tpl: Template, counts: TokenCounts | None, model_loaded: bool) -> str:
    """The line under the editor, e.g. "static prefix: 1,761 tokens (shaded) · placeholders <q>"."""
    if counts is not None:
        size = f"{counts.prefix:,} tokens"
    else:
        size = "counting tokens…" if model_loaded else "tokens counted once a model is loaded"
    names = " ".join(f"<{n}>" for n in tpl.placeholders)
    return f"static prefix: {size} (shaded) · " + (f"placeholders {names}" if names else
                                                    "no placeholders: the whole text is static")


class TemplateEditor(QWidget):
    def __init__(self, worker: EngineWorker, session: Session, parent: QWidget | None = None,
                 debounce_ms: int = 250):
        super().__init__(parent)
        self.worker = worker  # to count tokens
        self.engine_status = worker.engine_status  # to know whether a model can count them
        self.session = session
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
        self.counts: TokenCounts | None = None
        self._counted: Template | None = None  # the template the counts belong to
        self._counting = False
        self._count_again = False
        self._timer = QTimer(self, singleShot=True, interval=debounce_ms)
        self._timer.timeout.connect(self.flush)
        self.edit.textChanged.connect(self._timer.start)
        follow(self, self.engine_status.events.info, lambda _info: self.request_counts())
        session.events.template.connect(self._template_changed)
        self._template_changed()

    # ---- what the session holds
    @property
    def template(self) -> Template | None:
        return self.session.template

    @property
    def error(self) -> TemplateSyntaxError | None:
        return self.session.template_error

    @property
    def path(self) -> str:
        return self.session.template_path

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str, path: str = "") -> None:
        self._timer.stop()
        self.session.set_template(text, path)

    def flush(self) -> None:
        """Send typed text to the session now (before a job or a save)."""
        self._timer.stop()
        self.session.set_template(self.text())

    def _template_changed(self) -> None:
        s = self.session
        if s.template_text != self.text():
            self._timer.stop()
            self.edit.setPlainText(s.template_text)  # a new document: the undo stack starts here
            self._timer.stop()
        tpl = s.template
        if tpl is None:
            self.counts = None
            self._mark(error=s.template_error)
            self.status.setStyleSheet("color: #c62828;")
            self.status.setText(str(s.template_error))
            return
        self._mark(prefix_chars=source_prefix_chars(tpl))
        if tpl != self._counted:
            self.counts = None
            self.request_counts()
        self._show_status()

    def _mark(self, prefix_chars: int = 0, error: TemplateSyntaxError | None = None) -> None:
        sels = []
        doc = self.edit.document()
        if prefix_chars:
            s = QTextEdit.ExtraSelection()
            s.format.setBackground(PREFIX_SHADE)
            s.cursor = QTextCursor(doc)
            s.cursor.setPosition(0)
            s.cursor.setPosition(min(prefix_chars, doc.characterCount() - 1), QTextCursor.KeepAnchor)
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
        tpl = self.session.template
        if tpl is None:
            return
        self.status.setStyleSheet("")
        self.status.setText(prefix_label(tpl, self.counts, self.engine_status.info is not None))

    # ---- token counts (a background worker job)
    def request_counts(self) -> None:
        status = self.engine_status
        if self.template is None or status.info is None or status.closed:
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
                self.counts, self._counted = counts, tpl
                self._show_status()
            self._finish_count(self._count_again)

        def failed(msg):
            self._finish_count(self._count_again)
            if not self._counting:
                self.status.setText(f"cannot count tokens: {msg}")

        self.worker.submit(JobKind.COUNT_TOKENS, lambda e, t: count_tokens(e, tpl), on_done=done,
                           on_error=failed, on_cancelled=lambda j: self._finish_count(True),
                           cancel_running=False)

    def _finish_count(self, again: bool) -> None:
        self._counting = False
        if again and not self.engine_status.closed:
            QTimer.singleShot(0, self.request_counts)
