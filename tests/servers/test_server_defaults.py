"""A llama-server as its user starts it (model, context and slot directory only: flash
attention auto, four slots in one unified cache), on 127.0.0.1: a prefix primed here with the
other attention kernel deploys, the server reuses it, and its warm answers are its cold ones.

Every server is started on a free port with bounded waits and stopped by its fixture."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.engine import Engine, EngineConfig, Template
from app.servers.server_bench import bench_on_server
from app.engine.states.llama_state_file import read_any_state
from app.engine.states.v_layout import v_layout_of
from app.engine.states.seq_state_layout import parse
from app.engine.prompts.rows import Row
from app.servers import LlamaServer
from app.servers.deploy import deploy, server_layout
from app.servers.llama_server_process import HOST, ServerProcess, ServerSettings, find_binary

TEMPLATE = ("You are a careful assistant. Answer from the passage only, in one sentence. "
            "The passage follows. <passage>\nQuestion: <question>\nAnswer:")
ROWS = [Row(1, {"passage": "Cats sleep a lot.", "question": "What do cats do?"}),
        Row(2, {"passage": "Dogs bark at night.", "question": "When do dogs bark?"}),
        Row(3, {"passage": "Cats sleep a lot.", "question": "Do cats sleep?"})]

try:
    find_binary()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"llama-server is not installed ({e}); `make setup` builds it",
                allow_module_level=True)


def defaults_server(model: Path, tmp: Path, *extra: str) -> ServerProcess:
    """llama-server with what a user types to deploy to it: model, context, slot directory."""
    slots = tmp / "slots"
    proc = ServerProcess(ServerSettings(model_path=str(model), flash_attn=False, n_ctx=1024,
                                        slot_dir=str(slots)), tmp / "server.log")
    proc.cmd = [str(proc.binary), "-m", str(model), "--host", HOST, "--port", str(proc.port),
                "-c", "1024", "--slot-save-path", str(slots), *extra]
    return proc.start(timeout_s=60)


def _engine(model, fa: str) -> Engine:
    return Engine(EngineConfig(model_path=str(model), n_ctx=1024, n_batch=32, n_threads=1,
                               flash_attn=fa))


@pytest.mark.parametrize("ours, server_args", [("off", ()), ("on", ("-fa", "off"))])
def test_a_prefix_primed_with_the_other_kernel_deploys_and_is_reused(tiny_model, tmp_path, ours,
                                                                     server_args):
    tpl = Template.parse(TEMPLATE)
    with _engine(tiny_model, ours) as eng, defaults_server(tiny_model, tmp_path, *server_args) \
            as proc, LlamaServer(proc.url) as c:
        slot_dir = Path(proc.settings.slot_dir)
        layout = server_layout(c, 0, slot_dir, 1)
        assert layout.v_transposed is (ours == "on")  # the server runs the other kernel
        res = deploy(eng, tpl, c, 0, slot_dir)
        prefix = len(eng.tokenize(tpl.prefix_prompt()))
        assert res.restored_tokens == res.prefix_tokens == prefix
        assert res.verify_cached >= prefix - 1
        # the file holds V as the server stores it
        written = read_any_state(res.path)
        assert v_layout_of(parse(written.data, written.seq_state_version)) is (ours == "on")
        # rows as applications send them: no slot named, the server picks the one that holds
        # the prefix
        bench = bench_on_server(eng, tpl, ROWS, c, max_tokens=6, deployed=True)
    for r in bench.rows:
        assert r.server_cached_tokens >= prefix - 1 and r.miss_reason == "", r
        # the restored cells compute what the server's own cold evaluation gives
        assert r.server_cold_equal is True, (r.row, r.text)

