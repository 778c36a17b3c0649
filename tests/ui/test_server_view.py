"""The window's Server tab against a real llama-server on 127.0.0.1 (tiny model): Check, Deploy,
then the rows on the server, through the tab's own buttons; the table and both charts fill."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.servers.llama_server_process import ServerProcess, find_binary, settings_for

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e})", allow_module_level=True)

TPL = "You are a careful assistant. Answer from the passage only. The passage: <passage>\nQ: <q>\nA:"
ROWS = [{"passage": "Cats sleep a lot.", "q": "What do cats do?"},
        {"passage": "Dogs bark at night.", "q": "When do dogs bark?"}]


@pytest.fixture
def window(make_window):
    return make_window(n_ctx=1024)


def test_server_tab_checks_deploys_and_runs_rows(qtbot, window, tmp_path):
    w = window
    w.session.set_template(TPL)
    w.session.set_rows(ROWS)
    settings = settings_for(w.worker.engine_for_tests(), str(tmp_path / "slots"))
    with ServerProcess(settings, tmp_path / "server.log").start(60) as server:
        v = w.server_view
        w.central_tabs.setCurrentWidget(v)
        v.url.setText(server.url)
        v.slot_dir.setText(settings.slot_dir)
        qtbot.mouseClick(v.check_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v.status.text().startswith("ok"), timeout=20000)
        assert "1 slot" in v.status.text() and "the model loaded here" in v.status.text()

        # job_finished is emitted from the worker thread: wait on what the window shows instead
        qtbot.mouseClick(v.deploy_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: not w.engine_status.busy and v.status.text() != "checking…"
                        and not v.status.text().startswith("ok"), timeout=60000)
        assert v.status.text().startswith("deployed"), v.status.text()
        assert list(Path(settings.slot_dir).glob("kvprimer-*.bin"))

        qtbot.mouseClick(v.bench_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v._bench_job is not None and v._bench_job.future.done()
                        and not w.engine_status.busy, timeout=60000)
        assert v._bench_job.outcome == "done", v._bench_job.error
        assert v.status.text().startswith("2 rows on"), v.status.text()
    assert v.table.rowCount() == 2
    headers = [v.table.horizontalHeaderItem(c).text() for c in range(v.table.columnCount())]
    same = headers.index("same tokens as local cold")
    miss = headers.index("miss")
    assert [v.table.item(r, same).text() for r in range(2)] == ["yes", "yes"]
    assert [v.table.item(r, miss).text() for r in range(2)] == ["", ""]  # deployed: no miss
    assert v.ttft_chart.series_names() == ["local cold", "server cold", "server warm"]
    assert v.cached_chart.series_names() == ["static prefix", "reused by server"]
    assert v.ttft_chart.bar_count == 6
    # the target is remembered for the next start
    assert w.settings.value("server/url") == server.url


def test_server_tab_reports_an_unreachable_server_in_one_line(qtbot, window):
    v = window.server_view
    v.url.setText("http://127.0.0.1:9")
    qtbot.mouseClick(v.check_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "cannot reach" in v.status.text(), timeout=20000)
    assert "\n" not in v.status.text()
