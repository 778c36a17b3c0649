"""The window's panels observe the engine status (app/engine/engine_status.py), not the worker:
a run through the window's action moves the cache revision and the Cache panel and the KV dock
read again because of it (one read, app/ui/cache_watch.py, whose picture both draw); the status bar and the Model panel show the model the status holds.
Driven through actions and buttons on the tiny model, offscreen; waits poll the window."""
from __future__ import annotations

import threading
from dataclasses import replace

from PySide6.QtWidgets import QPushButton

from app.ui.engine_worker import JobKind
from tests.ui.test_ui_window import SHORT_TPL
from tests.ui_actions import CANCEL, PRIME, RUN_BOTH, action, idle, job_log, trigger, wait_for_job

VIEWS = (JobKind.CACHE_VIEW, JobKind.KV_VIEW)  # reads of the cells and the cache


def reads_after(log, seen: int) -> list[JobKind]:
    return [j.kind for j in log.jobs[seen:] if j.kind in VIEWS]


def drawn_together(w) -> bool:
    """The Cache panel and the KV dock show the same picture, the watch's last."""
    p = w.cache_panel.watch.picture
    return p is not None and w.cache_panel.snapshot is p.cache and w.kv_dock.view is p.view


def test_a_run_moves_the_cache_revision_and_both_cache_views_read_again(qtbot, make_window):
    w = make_window()
    status, panel, dock = w.engine_status, w.cache_panel, w.kv_dock
    w.editor.set_text(SHORT_TPL)
    w.session.set_rows([{"question": "what", "topic": "it"}])
    w.session.set_selection([0])
    revisions: list[int] = []
    status.events.cache_revision.connect(revisions.append)
    log = job_log(w)

    before = status.cache_revision
    assert trigger(qtbot, w, PRIME).outcome == "done"
    idle(qtbot, w)
    assert revisions == [before + 1]  # one job that changes cells: one revision
    primed = w.session.state.n_tokens
    assert [n.label for n in panel.snapshot.nodes] == ["static prefix"]
    assert dock.view.used_cells == primed and dock.nodes

    seen, rev = len(log.jobs), status.cache_revision
    job = trigger(qtbot, w, RUN_BOTH)
    assert job.outcome == "done" and status.cache_revision == rev + 1
    idle(qtbot, w)
    kinds = [j.kind for j in log.jobs[seen:]]
    # one read once the run was delivered, and only then, drawn by both panels
    assert kinds[0] is JobKind.RUN and reads_after(log, seen) == [JobKind.CACHE_VIEW]
    assert drawn_together(w)
    assert revisions == [before + 1, rev + 1]
    # what they show is the cache after the run: its row's tokens reused and cached
    assert panel.snapshot.nodes[0].hits >= 1
    assert panel.tree.topLevelItem(0).text(5) == str(panel.snapshot.nodes[0].hits)
    assert dock.view.used_cells > primed

    # background work that changes no cell (token counts while typing) moves nothing
    seen = len(log.jobs)
    w.editor.edit.setPlainText(SHORT_TPL + " again")
    w.editor.flush()
    qtbot.waitUntil(lambda: w.editor.counts is not None
                    and w.editor.template.source.endswith("again"), timeout=10000)
    idle(qtbot, w)
    assert JobKind.COUNT_TOKENS in [j.kind for j in log.jobs[seen:]]
    assert reads_after(log, seen) == [] and revisions == [before + 1, rev + 1]

    # and the revision alone, with no job behind it, is what makes them read
    seen = len(log.jobs)
    status.bump_cache_revision()
    idle(qtbot, w)
    assert reads_after(log, seen) == [JobKind.CACHE_VIEW] and drawn_together(w)


def test_the_status_bar_and_model_panel_show_the_model_the_status_holds(qtbot, make_window):
    w = make_window(load=False)
    status, panel, bar = w.engine_status, w.model_panel, w.status
    assert status.info is None and bar.model.text() == "no model"
    assert panel.fact_labels["name"].text() == "—" and not action(w, PRIME).isEnabled()

    apply = w.findChild(QPushButton, "applyModel")
    assert wait_for_job(qtbot, w, JobKind.LOAD_MODEL, apply.click, timeout=20000).outcome == "done"
    info = status.info
    assert info is not None and status.config == w.session.options.engine
    assert bar.model.text().startswith(info.name or "tiny") and info.architecture in bar.model.text()
    assert f"0/{info.n_ctx:,} tokens" in bar.context.text()
    assert panel.fact_labels["context"].text().startswith(f"{info.n_ctx:,} tokens")
    assert panel.fact_labels["attention"].text() == status.kernels.describe()
    assert panel.pending.text() == "" and action(w, PRIME).isEnabled()

    # other settings in the panel: it says so until the status holds them
    panel.form.n_ctx.setValue(2048)
    assert "other settings" in panel.pending.text()
    assert wait_for_job(qtbot, w, JobKind.LOAD_MODEL, apply.click, timeout=20000).outcome == "done"
    assert status.info.n_ctx == 2048 and status.config.n_ctx == 2048
    assert panel.pending.text() == "" and "/2,048 tokens" in bar.context.text()
    assert panel.fact_labels["context"].text().startswith("2,048")
    # the panel compares with what the status says is loaded, whoever wrote it
    loaded = status.config
    status.config = replace(loaded, n_batch=loaded.n_batch * 2)
    assert "other settings" in panel.pending.text()
    status.config = loaded
    assert panel.pending.text() == ""


def test_the_users_job_shows_in_the_status_bar_and_disables_the_actions(qtbot, make_window):
    w = make_window()
    status, bar = w.engine_status, w.status
    gate = threading.Event()
    job = w.worker.submit(JobKind.TASK, lambda e, t: gate.wait(10), label="hold")
    try:
        assert status.working and status.job == "hold" and not status.ready
        assert bar.bar.isVisibleTo(w) and bar.bar.format() == "hold…"
        assert not action(w, PRIME).isEnabled() and action(w, CANCEL).isEnabled()
    finally:
        gate.set()
    qtbot.waitUntil(lambda: job.future.done() and not status.working, timeout=10000)
    assert status.job == "" and bar.bar.isHidden() and action(w, PRIME).isEnabled()
