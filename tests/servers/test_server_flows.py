"""The server flows (app/servers/server_flows.py) are one behaviour for the window's Server tab
and the CLI: the same plan from the same project (new tokens, rows, slot, last deployment),
the same one-line refusal of a row not filled in, and, against a real llama-server on
127.0.0.1 (tiny model, started and stopped here), the same rows, kept in the project and
found there again when it is reopened."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.cli import main
from app.cli.engine_options import read_project
from app.engine import KvPrimerError, MissingValuesError, RowsError, Template
from app.servers import server_flows as flows
from app.engine.prompts.rows import Row
from app.engine.runs.server_results import DeployResult, ServerBench
from app.engine.session import Options
from tests.paths import REPO_ROOT

TPL = "You are a careful assistant. Answer from the passage only. The passage: <passage>\nQ: <q>\nA:"
ROWS = [{"passage": "Cats sleep a lot.", "q": "What do cats do?"},
        {"passage": "Dogs bark at night.", "q": "When do dogs bark?"}]
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a flow that got that far would say so
CLI_ENGINE = ["-c", "1024", "-b", "32", "-t", "1"]  # what make_window(n_ctx=1024) runs


@pytest.fixture
def window(make_window):
    return make_window(n_ctx=1024)


def save_project(session, path: Path) -> str:
    session.to_project().save(path)
    return str(path)


# ---- plans: what both front ends refuse and decide, before any model or server work -------


def test_plans_refuse_in_one_line_what_cannot_run():
    target = flows.server_target("127.0.0.1:8080")
    assert target.url == "http://127.0.0.1:8080"
    tpl = Template.parse(TPL)
    with pytest.raises(KvPrimerError, match="no static prefix"):
        flows.deploy_plan(Template.parse("<q> is the question"), target, "slots")
    with pytest.raises(KvPrimerError, match="slot directory"):
        flows.deploy_plan(tpl, target, " ")
    with pytest.raises(KvPrimerError, match="llama API"):
        flows.deploy_plan(tpl, replace(target, api="openai"), "slots")
    with pytest.raises(RowsError, match="no rows"):
        flows.server_bench_plan(tpl, [], target, Options())
    with pytest.raises(KvPrimerError, match="at least 1 new token"):
        flows.server_bench_plan(tpl, [Row(1, ROWS[0])], target, Options(max_tokens=0))
    with pytest.raises(KvPrimerError, match="OpenAI API"):
        flows.server_bench_plan(tpl, [Row(1, ROWS[0])], replace(target, api="openai"),
                                Options(), slot=0)
    with pytest.raises(KvPrimerError, match="not an http.s. server URL"):
        flows.server_target("ftp://x")
    plan = flows.deploy_plan(tpl, target, "slots")
    assert plan.slot == flows.DEPLOY_SLOT == 0 and plan.filename == ""


def test_window_and_cli_refuse_a_blank_row_with_the_same_line(qtbot, window, tmp_path, capsys):
    w = window
    w.session.set_template(TPL)
    w.session.set_rows([ROWS[0], {"passage": "Dogs bark.", "q": "  "}])
    v = w.server_view
    v.url.setText(NOWHERE)
    assert v.bench() is None  # refused before any job: no row dropped, none sent
    said = v.status.text()
    assert said == str(MissingValuesError(["q"], [], row=2)), said
    assert w.session.server is None

    proj = save_project(w.session, tmp_path / "blank.kvproj")
    assert main(["bench", proj, "--server", NOWHERE, *CLI_ENGINE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvprimer: error: {said}") and err.count("\n") == 1, err
    assert "cannot reach" not in err  # refused before the server was asked


def test_the_cli_makes_the_plan_the_window_makes_from_the_same_project(
        qtbot, window, tmp_path, monkeypatch, capsys):
    w = window
    w.session.set_template(TPL)
    w.session.set_rows(ROWS)
    w.server_view.max_tokens.setValue(5)  # the session's option, saved with the project
    assert w.session.options.max_tokens == 5
    w.session.set_deployed(DeployResult("http://127.0.0.1:8080", 0, "/slots/kvprimer-x.bin", 20,
                                        1000, 20, 1.0, 19, 1, "the same file"))
    plans = []

    def record(engine, plan, task=None):
        plans.append(plan)
        return ServerBench(plan.target.url, plan.target.api, "llama", "m", True, [])

    monkeypatch.setattr(flows, "bench_on_server", record)
    v = w.server_view
    v.url.setText("127.0.0.1:8080")
    job = v.bench()
    qtbot.waitUntil(lambda: job.future.done() and not w.engine_status.busy, timeout=20000)
    proj = save_project(w.session, tmp_path / "p.kvproj")
    assert main(["bench", proj, "--server", "http://127.0.0.1:8080", *CLI_ENGINE]) == 0
    capsys.readouterr()
    window_plan, cli_plan = plans
    assert cli_plan == window_plan
    assert window_plan.max_tokens == 5 and window_plan.slot is None
    assert window_plan.rows == tuple(Row(i + 1, r) for i, r in enumerate(ROWS))
    assert window_plan.deployed == w.session.deployed
    # without a project the defaults are the same ones: Options' new tokens, no deployment
    tpl = tmp_path / "t.tmpl"
    tpl.write_text(TPL)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["bench", str(tpl), "--rows", str(rows), "--server", "127.0.0.1:8080",
                 *CLI_ENGINE]) == 0
    assert plans[-1].max_tokens == Options().max_tokens and plans[-1].deployed is None


# ---- a real llama-server -------------------------------------------------------------------


def test_window_and_cli_give_the_same_rows_kept_in_the_project(qtbot, window, tmp_path, capsys):
    from app.servers.llama_server_process import ServerProcess, find_binary, settings_for

    try:
        find_binary()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"llama-server is not installed ({e})")
    w = window
    w.session.set_template(TPL)
    w.session.set_rows(ROWS)
    w.server_view.max_tokens.setValue(4)
    settings = settings_for(w.worker.engine_for_tests(), str(tmp_path / "slots"))
    proj = str(tmp_path / "p.kvproj")
    with ServerProcess(settings, tmp_path / "server.log").start(60) as server:
        v = w.server_view
        v.url.setText(server.url)
        v.slot_dir.setText(settings.slot_dir)
        qtbot.mouseClick(v.check_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v.status.text().startswith("ok"), timeout=20000)
        checked = v.status.text()
        qtbot.mouseClick(v.deploy_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: w.session.deployed is not None and not w.engine_status.busy,
                        timeout=60000)
        qtbot.mouseClick(v.bench_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: v._bench_job is not None and v._bench_job.future.done()
                        and not w.engine_status.busy, timeout=60000)
        assert v._bench_job.outcome == "done", v._bench_job.error
        in_window = w.session.server
        assert len(in_window.rows) == 2 and v.status.text() == in_window.describe()
        save_project(w.session, Path(proj))

        model = ["-m", str(w.worker.engine_for_tests().info.path), *CLI_ENGINE]
        assert main(["info", "--server", server.url, *model]) == 0
        assert capsys.readouterr().out.strip() == checked  # the window's Check, word for word
        assert main(["deploy", proj, "--server", server.url, "--slot-dir", settings.slot_dir,
                     "--save", *model]) == 0
        assert f"saved the results in {proj}" in capsys.readouterr().out
        assert main(["bench", proj, "--server", server.url, "--save", "--json", *model]) == 0
        from_cli = json.loads(capsys.readouterr().out)

    same = ("row", "prompt_tokens", "prefix_tokens", "server_cached_tokens",
            "server_evaluated_tokens", "tokens", "tokens_equal", "server_cold_equal",
            "miss_reason", "output_note")
    assert [{k: r[k] for k in same} for r in from_cli["rows"]] == \
        [{k: getattr(r, k) for k in same} for r in in_window.rows]
    for r in in_window.rows:  # 4 new tokens (the option), the deployed prefix reused
        assert len(r.tokens) == 4 and r.tokens_equal is True and r.miss_reason == ""

    reopened = read_project(proj)  # as the window opens it
    assert [r.as_dict() for r in reopened.server.rows] == from_cli["rows"]
    assert reopened.server.url == server.url == reopened.deployed.url
    deployed = w.session.deployed
    assert (reopened.deployed.slot, reopened.deployed.prefix_tokens, reopened.deployed.path) == \
        (deployed.slot, deployed.prefix_tokens, deployed.path)
    assert reopened.options.max_tokens == 4


def test_the_front_ends_reach_servers_only_through_the_flows():
    """The window imports only the flows of app.servers, and the CLI also what starts a server
    (`kvprimer serve`): checking, deploying and running rows go through server_flows."""
    import ast

    app_dir = REPO_ROOT / "app"
    allowed = {("cli", "server_commands.py"): {"llama_server_process", "server_flows"},
               ("ui", "server_view.py"): {"server_flows"}}
    for front in ("ui", "cli"):
        for src in (app_dir / front).glob("*.py"):
            for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    module = (node.module or "").split(".")
                    names = ({a.name for a in node.names} if "servers" in module
                             else {"servers"} & {a.name for a in node.names})
                elif isinstance(node, ast.Import):
                    names = {a.name for a in node.names if "servers" in a.name.split(".")}
                else:
                    continue
                assert names <= allowed.get((front, src.name), set()), \
                    f"{front}/{src.name} imports {names} from app.servers"
