"""The window's Server tab against a real llama-server on 127.0.0.1 (tiny model): Check, Deploy,
then the rows on the server, through the tab's own buttons; the table and both charts fill."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.engine.prompts.chat_messages import ChatMessage, ChatTemplate
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


def test_the_chat_api_is_offered_only_while_the_template_is_messages(qtbot, window, examples):
    from app.engine import KvPrimerError
    from app.servers import server_flows as flows

    w = window
    v = w.server_view
    item = v.api.model().item(v.api.findText("chat"))
    assert [v.api.itemText(i) for i in range(v.api.count())] == ["llama", "openai", "chat"]
    w.session.set_template(TPL)
    assert not item.isEnabled() and "plain text" in item.toolTip()
    v.api.setCurrentText("chat")  # as remembered from an earlier session
    for button in (v.bench_button, v.deploy_button):
        assert not button.isEnabled() and "plain text" in button.toolTip()
    # the flow refuses it in the CLI's words, should the plan be made anyway
    with pytest.raises(KvPrimerError, match="give a chat template"):
        flows.session_server_bench_plan(w.session, flows.server_target("127.0.0.1:9", "chat"))
    assert w.project.open_chat(examples / "chat.json")
    qtbot.waitUntil(lambda: w.messages.attached, timeout=20000)
    assert w.session.chat_template() == w.messages.chat
    assert item.isEnabled() and v.bench_button.isEnabled() and v.deploy_button.isEnabled()
    assert "/v1/chat/completions" in v.bench_button.toolTip()
    w.project.open_template(examples / "few-shot.tmpl")  # a text template over the messages
    assert w.session.chat_template() is None and not item.isEnabled()
    assert not v.bench_button.isEnabled()
    w.edits.stack.undo()
    assert w.session.chat_template() == w.messages.chat and v.bench_button.isEnabled()
    w.editor.set_text(w.editor.text() + "\nmore")  # typed as text: no longer the messages
    assert w.session.chat_template() is None and not item.isEnabled()


def test_chat_deploy_and_rows_from_the_window_send_what_the_cli_sends(
        qtbot, window, tmp_path, monkeypatch, capsys):
    import json

    from app.cli import main
    from app.servers import chat_server

    sent: list[tuple[str, dict]] = []
    real = chat_server.stream_frames

    def record(http, path, body, *a, **k):
        sent.append((path, json.loads(json.dumps(body))))
        return real(http, path, body, *a, **k)

    monkeypatch.setattr(chat_server, "stream_frames", record)
    w = window
    chat_file = tmp_path / "chat.json"  # short: the tiny model's tokens are bytes
    ChatTemplate((ChatMessage("system", "You are Pip, a kitchen helper. Answer in one sentence."),
                  ChatMessage("user", "<message>"))).save(chat_file)
    assert w.project.open_chat(chat_file)
    qtbot.waitUntil(lambda: w.messages.attached, timeout=20000)
    questions = ["Can I freeze bread?", "How long does rice keep?"]
    w.session.set_rows([{"message": q} for q in questions])
    w.server_view.max_tokens.setValue(4)
    engine = w.worker.engine_for_tests()
    settings = settings_for(engine, str(tmp_path / "slots"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"message": q}) + "\n" for q in questions))
    with ServerProcess(settings, tmp_path / "server.log").start(60) as server:
        v = w.server_view
        v.url.setText(server.url)
        v.slot_dir.setText(settings.slot_dir)
        v.api.setCurrentText("chat")
        shown = v.status.text()
        qtbot.mouseClick(v.deploy_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v.status.text() != shown and not w.engine_status.busy,
                        timeout=60000)
        assert v.status.text().startswith("deployed"), v.status.text()
        # the deployment is checked with a chat request, as `deploy chat.json` checks it
        assert [p for p, _ in sent] == ["/v1/chat/completions"]
        sent.clear()
        qtbot.mouseClick(v.bench_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v._bench_job is not None and v._bench_job.future.done()
                        and not w.engine_status.busy, timeout=60000)
        assert v._bench_job.outcome == "done", v._bench_job.error
        in_window, from_window = w.session.server, list(sent)
        sent.clear()
        model = ["-m", str(engine.info.path), "-c", "1024", "-b", "32", "-tb", "1"]
        code = main(["bench", str(chat_file), "--rows", str(rows), "--server",
                     server.url, "--api", "chat", "-n", "4", "--json", *model])
        from_cli = json.loads(capsys.readouterr().out)
        from_file = list(sent)
        sent.clear()
        # the window's project: the CLI finds its messages as the window does when reopening it
        proj = tmp_path / "chat.kvproj"
        w.session.to_project().save(proj)
        assert main(["bench", str(proj), "--server", server.url, "--api", "chat", "--json",
                     *model]) in (0, 1)
        from_project = json.loads(capsys.readouterr().out)
    assert in_window.api == "chat" and in_window.reference == "warm"
    assert in_window.render["same"] is True and from_cli["render"]["same"] is True
    # a warm and a cold request per row, every one the CLI's, body for body
    assert [p for p, _ in from_window] == ["/v1/chat/completions"] * 4
    assert from_window == from_file == sent
    assert from_project["api"] == "chat" and from_project["render"]["same"] is True
    assert from_window[0][1]["messages"][-1] == {"role": "user", "content": questions[0]}
    for r in in_window.rows:
        assert r.server_cached_tokens >= r.prefix_tokens and r.miss_reason == "", r
    same = ("row", "prompt_tokens", "prefix_tokens", "tokens_equal")
    assert [{k: r[k] for k in same} for r in from_cli["rows"]] == \
        [{k: getattr(r, k) for k in same} for r in in_window.rows]
    assert code == (0 if all(r["tokens_equal"] for r in from_cli["rows"]) else 1)
