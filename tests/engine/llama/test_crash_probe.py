"""The crash check (app/engine/crash_probe.py): a tiny decode in a child process before the
first load of a model kind, its verdict cached; and the CPU kernels that follow (cpu_kernels.py).

The child really dies by a signal in these tests: KVPRIMER_PROBE_CRASH makes it kill itself
where llama.cpp's AMX kernels crash (after loading, before the first batch), with extra buffer
types on ("extra") or always ("always"). The models are tiny: float32 (checked: skipped) and
Q4_0 (checked; this build repacks Q4_0 weights for AVX2, so extra buffer types are visible).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engine.llama import crash_probe
from app.engine.llama.cpu_kernels import (REPACK_BUFFER, BuildFacts, CpuFacts, build_facts, decide,
                                    parse_system_info, read_cpuinfo)
from app.engine.llama.crash_probe import CRASH_TEST_ENV, checked_cpu_kernels
from app.engine.errors import ModelError
from app.engine.llama.native import NativeModel
from tests.tiny_model import write_arch_model
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    """A cache folder of this test's own, so every test starts unchecked."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(CRASH_TEST_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory) -> Path:
    return write_arch_model(tmp_path_factory.mktemp("q4") / "tiny-q4_0.gguf", weight_type="q4_0")


def _no_child(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("a cached verdict must not start a child process")
    monkeypatch.setattr(crash_probe.subprocess, "run", refuse)


def _verdicts(cache_home: Path) -> dict:
    f = cache_home / "kvprimer" / "crash-checks.json"
    return json.loads(f.read_text())["verdicts"] if f.exists() else {}


def test_float32_models_skip_the_check_and_later_loads_read_nothing(tiny_model, cache_home, monkeypatch):
    _no_child(monkeypatch)
    k = checked_cpu_kernels(tiny_model)
    assert k.use_extra_bufts and k.buffers == () and "float32" in k.probe

    def no_read(*a, **kw):
        raise AssertionError("a model seen before in this process must cost a stat, no file read")
    # the test suite loads thousands of models: later loads are one stat and a dict look-up
    monkeypatch.setattr(crash_probe, "_verdict", no_read)
    for _ in range(3):
        assert checked_cpu_kernels(tiny_model) == k
    assert _verdicts(cache_home) == {}


def test_first_load_checks_in_a_child_then_reads_the_cached_verdict(q4_model, cache_home, monkeypatch):
    k = checked_cpu_kernels(q4_model)
    assert k.use_extra_bufts and "passed" in k.probe and "\n" not in k.reason + k.probe
    if build_facts().repack:  # the AVX2 build repacks Q4_0: the child saw it happen
        assert k.buffers == (REPACK_BUFFER,) and "repacked weights" in k.summary()
    (entry,) = _verdicts(cache_home).values()
    assert entry["outcome"] == "default" and entry["kind"].startswith("llama|")
    assert "Q4_0" in entry["kind"] and entry["build"] == build_facts().identity
    # another process: nothing in memory, the verdict comes from the file, without a child
    crash_probe._memo.clear()
    _no_child(monkeypatch)
    again = checked_cpu_kernels(q4_model)
    assert again.use_extra_bufts and again.buffers == k.buffers and "cached" in again.probe


def test_a_crash_with_extra_buffer_types_falls_back_to_plain_kernels(q4_model, cache_home, monkeypatch):
    monkeypatch.setenv(CRASH_TEST_ENV, "extra")
    k = checked_cpu_kernels(q4_model)
    assert not k.use_extra_bufts and not k.amx and not k.repack
    assert "crashed" in k.reason and "SIGSEGV" in k.probe and k.buffers == ()
    assert k.summary() == "plain kernels (AMX and repacked weights turned off)"
    (entry,) = _verdicts(cache_home).values()
    assert entry["outcome"] == "without_extra" and entry["detail"] == "SIGSEGV"
    # the engine's load then really keeps the weights out of the repack buffer
    on, off = NativeModel(q4_model), NativeModel(q4_model, use_extra_bufts=k.use_extra_bufts)
    try:
        if build_facts().repack:
            assert REPACK_BUFFER in on.buffer_types
        assert REPACK_BUFFER not in off.buffer_types and off.buffer_types
    finally:
        on.close()
        off.close()


def test_a_crash_either_way_is_one_line_naming_cause_and_fix(q4_model, cache_home, monkeypatch, capsys):
    from app.cli import main

    monkeypatch.setenv(CRASH_TEST_ENV, "always")
    with pytest.raises(ModelError) as e:
        checked_cpu_kernels(q4_model)
    msg = str(e.value)
    assert "\n" not in msg and "crashes (SIGSEGV)" in msg and "reinstall llama-cpp-python" in msg
    assert q4_model.name in msg
    # cached: the next process gets the same line at once; the CLI prints it and exits 2
    crash_probe._memo.clear()
    _no_child(monkeypatch)
    assert main(["info", "-m", str(q4_model), "-t", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"kvprimer: error: {msg} (-m/--model PATH)\n"  # the CLI names its option


def test_an_illegal_instruction_says_the_build_is_for_a_newer_cpu(q4_model, cache_home, monkeypatch):
    monkeypatch.setenv(CRASH_TEST_ENV, "always:SIGILL")
    with pytest.raises(ModelError, match="illegal instruction.*built for a newer CPU"):
        checked_cpu_kernels(q4_model)


def test_a_killed_or_unfinished_check_is_no_verdict(q4_model, cache_home, monkeypatch):
    monkeypatch.setenv(CRASH_TEST_ENV, "always:SIGKILL")  # as the out-of-memory killer would
    k = checked_cpu_kernels(q4_model)
    assert k.use_extra_bufts and "SIGKILL" in k.probe and k.buffers is None
    crash_probe._memo.clear()
    monkeypatch.delenv(CRASH_TEST_ENV)
    monkeypatch.setenv(CRASH_TEST_ENV, "hang")  # a child that never answers: the timeout ends it
    k = checked_cpu_kernels(q4_model, timeout=1)
    assert "did not finish" in k.probe
    assert _verdicts(cache_home) == {}  # neither is cached: the next start checks again


def test_an_amx_build_on_an_amx_cpu_stays_off_until_a_check_passes(q4_model, cache_home, monkeypatch):
    real = build_facts()
    amx_build = BuildFacts(real.features + ("AMX_INT8",), real.identity + "|amx", real.library_dir)
    monkeypatch.setattr(crash_probe, "build_facts", lambda: amx_build)
    monkeypatch.setattr(crash_probe, "cpu_facts", lambda: CpuFacts("Xeon", frozenset({"amx_int8", "amx_tile"})))
    monkeypatch.setenv(CRASH_TEST_ENV, "hang")
    k = checked_cpu_kernels(q4_model, timeout=1)  # no verdict: the guard decides
    assert not k.use_extra_bufts and "20824" in k.reason and "did not finish" in k.probe
    crash_probe._memo.clear()
    monkeypatch.setenv(CRASH_TEST_ENV, "extra")  # the GCC 12 crash
    k = checked_cpu_kernels(q4_model)
    assert not k.use_extra_bufts and "GCC 12" in k.reason and "SIGSEGV" in k.reason
    # a check that passes on another build (its own cache entry) turns AMX on
    other = BuildFacts(amx_build.features, real.identity + "|amx-gcc13", real.library_dir)
    monkeypatch.setattr(crash_probe, "build_facts", lambda: other)
    monkeypatch.delenv(CRASH_TEST_ENV)
    crash_probe._memo.clear()
    k = checked_cpu_kernels(q4_model)
    assert k.use_extra_bufts and k.amx and k.reason.startswith("AMX kernels on")
    assert len(_verdicts(cache_home)) == 2


def test_llama_cpp_pythons_llama_loads_with_the_engines_setting(q4_model, cache_home, monkeypatch, tmp_path):
    import llama_cpp as L

    from bench.llamacpp_paths import LlamaPaths

    monkeypatch.setenv(CRASH_TEST_ENV, "extra")
    lp = LlamaPaths(q4_model, n_ctx=256, n_batch=16, n_threads=1, cache_dir=tmp_path / "dc")
    try:
        assert lp.use_extra_bufts is False and lp.llm.model_params.use_extra_bufts is False
        lp.llm.eval([1, 5, 9, 13])  # a batch of 4 runs on the plain kernels
    finally:
        lp.close()
    assert L.llama_cpp.llama_model_default_params().use_extra_bufts is True  # restored


def test_the_bundles_launcher_runs_the_child(q4_model):
    """A PyInstaller bundle has no `python -m`: the engine starts the bundle's executable with
    CHILD_ARG, and its launcher sends that to the child's code."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("launcher", ROOT / "packaging" / "kvprimer_launcher.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    assert launcher.CRASH_PROBE_ARG == crash_probe.CHILD_ARG
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(CRASH_TEST_ENV, None)
    r = subprocess.run([sys.executable, str(ROOT / "packaging" / "kvprimer_launcher.py"),
                        crash_probe.CHILD_ARG, str(q4_model), "0"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"ok": True, "buffers": []}
    env[CRASH_TEST_ENV] = "always"
    r = subprocess.run([sys.executable, str(ROOT / "packaging" / "kvprimer_launcher.py"),
                        crash_probe.CHILD_ARG, str(q4_model), "0"], capture_output=True, env=env,
                       timeout=60)
    assert r.returncode == -signal.SIGSEGV


def test_in_a_bundle_the_child_is_the_bundles_own_executable(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert crash_probe._child_command() == [sys.executable, crash_probe.CHILD_ARG]
    monkeypatch.setattr(sys, "frozen", False)
    assert crash_probe._child_command() == [sys.executable, "-m", "app.crash_probe_child"]


def test_info_and_the_model_panel_show_the_cpu_kernels(q4_model, cache_home, capsys, qtbot):
    from app.cli import main
    from app.engine import Engine, EngineConfig, EngineStatus
    from app.ui.model_panel import ModelPanel

    assert main(["info", "-m", str(q4_model), "-t", "1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    k = info["cpu_kernels"]
    assert k["use_extra_bufts"] is True and "passed" in k["probe"] and k["reason"] and k["summary"]
    assert main(["info", "-m", str(q4_model), "-t", "1"]) == 0
    text = capsys.readouterr().out
    assert f"cpu kernels: {k['summary']}\n  - {k['reason']}\n  - crash check: " in text
    with Engine(EngineConfig(model_path=str(q4_model), n_ctx=256, n_batch=16, n_threads=1)) as eng:
        from app.engine.session import Options, Session

        status = EngineStatus()
        panel = ModelPanel(Session(Options(engine=eng.config)), status)
        qtbot.addWidget(panel)
        status.info = eng.info
    shown = panel.fact_labels["cpu kernels"].text()
    assert shown.startswith(k["summary"]) and k["reason"] in shown and "Crash check: " in shown


# ---- the facts and the policy, without llama.cpp ---------------------------------------------


def test_system_info_parses_per_backend():
    text = "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | "
    assert parse_system_info(text) == {
        "CPU": {"SSE3": "1", "AVX2": "1", "AMX_INT8": "1", "REPACK": "1"},
        "CUDA": {"ARCHS": "890", "USE_GRAPHS": "1"}}


def test_cpuinfo_gives_the_model_and_flags(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                 "flags\t\t: fpu avx2 avx512f amx_tile amx_int8\n\nprocessor\t: 1\n"
                 "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu\n")
    cpu = read_cpuinfo(f)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+" and cpu.amx
    assert cpu.identity != CpuFacts(cpu.model, frozenset({"fpu"})).identity
    assert read_cpuinfo(tmp_path / "missing").flags == frozenset()


def test_decide_explains_every_case():
    amx, plain = BuildFacts(("AVX2", "AMX_INT8", "REPACK"), "a", ""), BuildFacts(("AVX2", "REPACK"), "p", "")
    xeon, desktop = CpuFacts("Xeon", frozenset({"amx_int8", "amx_tile"})), CpuFacts("Ryzen", frozenset())
    assert decide(amx, xeon, "default", buffers=("AMX",)).summary() == "AMX"
    assert not decide(amx, xeon, "unknown", "no crash check: ...").use_extra_bufts
    off = decide(amx, xeon, "without_extra", "SIGSEGV", ())
    assert not off.use_extra_bufts and "GCC 12" in off.reason and "turned off" in off.summary()
    on = decide(amx, desktop, "unknown", "no crash check: ...")
    assert on.use_extra_bufts and not on.amx and "this CPU has no AMX" in on.reason
    portable = decide(plain, xeon, "default", buffers=())
    assert portable.use_extra_bufts and "compiled without it" in portable.reason
    assert "no weight type of this model" in portable.summary()
    for k in (off, on, portable):
        assert "\n" not in k.reason + k.probe + k.summary()
        json.dumps(k.as_dict())


def test_type_names_agree_with_the_gguf_package():
    from gguf.constants import GGMLQuantizationType

    from app.engine.llama.ggml_types import GGML_TYPE_NAMES

    assert all(GGMLQuantizationType(t).name == n for t, n in GGML_TYPE_NAMES.items())


def test_the_check_hashes_the_model_file_meanwhile(q4_model, cache_home):
    """A first start pays the longer of the child's check and the file's hash, not both: the
    parent fills the fingerprint cache while the child runs, and the engine reads it there."""
    import hashlib

    from app.engine.llama import model_files

    checked_cpu_kernels(q4_model)
    cached = json.loads((cache_home / "kvprimer" / "fingerprints.json").read_text())
    want = hashlib.sha256(q4_model.read_bytes()).hexdigest()
    assert list(cached.values()) == [want]
    assert model_files.model_fingerprint(q4_model) == want
