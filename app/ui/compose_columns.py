"""Compose's trade where people choose: the recompute box (a share of each module, or a count
of its first tokens) shared by the Run panel and the Benchmark view, and a run's accuracy
columns (what it recomputed, same tokens, top-1 agreement, KL)."""
from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QWidget

from ..engine import KvPrimerError, RunReport
from ..engine.runs.recompute_choice import parse_recompute
from ..engine.session import Options, Session
from .session_edits import SessionEdits

RECOMPUTE_CHOICES = ("0%", "5%", "10%", "15%", "20%", "30%", "100%", "0", "4", "8", "16")


def recompute_box(session: Session, edits: SessionEdits, parent: QWidget | None = None,
                  bench: bool = False) -> QComboBox:
    """Compose mode's recompute setting (a share of each module, or a count of its first
    tokens; one may be typed), bound to the session's options; enabled when runs (or, with
    ``bench``, benchmarks) use compose. A value the engine refuses goes back to the option's."""
    k = QComboBox(parent)
    k.setObjectName("recompute")
    k.setEditable(True)
    k.addItems(RECOMPUTE_CHOICES)
    k.setToolTip("Compose mode: tokens of each module evaluated again in context, a share "
                 "(15%: the first 15% of each module) or a count (8: its first 8 tokens); "
                 "more is closer to the cold run and slower")

    def show(o: Options) -> None:
        text = parse_recompute(o.recompute).text
        if k.currentText() != text:
            k.setCurrentText(text)
        k.setEnabled("compose" in o.bench_modes if bench else o.reuse_mode == "compose")

    def chosen() -> None:
        try:
            text = parse_recompute(k.currentText()).text
        except KvPrimerError:
            show(session.options)
            return
        if text != parse_recompute(session.options.recompute).text:
            edits.set_option("recompute", text, text="set compose's recompute share")

    show(session.options)
    k.lineEdit().editingFinished.connect(chosen)
    k.activated.connect(lambda _i: chosen())
    session.events.options.connect(show)
    return k


def accuracy_texts(report: RunReport, warm: bool) -> list[str]:
    """A run's line in the accuracy columns: what compose recomputed, then the verdict's
    greedy-token match, top-1 agreement and KL (warm lines only)."""
    v, c = report.verdict, report.recompute
    return [f"{c.share:.0%}" if c and warm else "",
            ("yes" if v.tokens_equal else "NO") if v and warm else "",
            f"{v.top1_agree:.0%}" if v and warm else "",
            f"{v.kl_divergence:.3g}" if v and warm else ""]
