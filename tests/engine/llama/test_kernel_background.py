"""The engine is usable before its attention kernels are measured: it opens on the safe default,
measures in steps that stop and resume, and switches kernels between jobs when the measurement
picks the other one; a measurement beside a busy process is provisional (or gets the quiet
answer)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from app.engine import Engine, EngineConfig, TaskState, Template, run_prompt
from app.engine.llama import kernel_choice as kc
from app.engine.llama.kernel_measure import KernelMeasurement
from app.engine.llama.machine_load import BUSY_SHARE

TPL = Template.parse("hello world of the answer and question. " * 12 + "<q>")


def make(tiny_model, **kw) -> Engine:
    kw = {"n_ctx": 1024, "n_batch": 32, "n_threads": 1, "flash_attn": "auto", **kw}
    return Engine(EngineConfig(model_path=str(tiny_model), **kw), measure_kernels_later=True)


@pytest.fixture
def forced(monkeypatch):
    """Real timings replaced by fixed ones: flash attention on 10 ms, off 100 ms."""
    real = KernelMeasurement._time_suffix

    def fake(self, kernel, plan):
        real(self, kernel, plan)
        self.samples[(kernel, plan)][-1] = 10.0 if kernel else 100.0
    monkeypatch.setattr(KernelMeasurement, "_time_suffix", fake)


def test_the_engine_answers_before_measuring_then_switches_between_jobs(tiny_model, forced):
    kc._cache_path().unlink(missing_ok=True)
    with make(tiny_model) as e:
        assert e.kernels.how == "until measured" and e.kernels.flash_attn is False
        assert e.kernel_state.status().state == "wanted"
        assert "until measured" in e.kernel_state.status().text()
        rep = run_prompt(e, TPL, {"q": "why?"}, reuse="chain")  # usable at once
        assert rep.verdict.exact and len(e.cache.nodes()) > 0
        # a job of the user's stops it between steps; the next call resumes where it stopped
        task, seen = TaskState(), []

        def on_status(st):
            seen.append(st)
            if len(seen) == 3:
                task.cancel()
        st = e.measure_kernels(task, on_status)
        assert st.state == "measuring" and 0 < st.done < st.total and st.eta_s is not None
        assert "s left" in st.text() or "<1 s left" in st.text()
        assert e.kernels.flash_attn is False and len(e.cache.nodes()) > 0  # nothing switched yet
        st = e.measure_kernels()
        assert st.state == "done" and e.kernels.how == "measured" and e.kernels.flash_attn is True
        # the contexts run the new kernel; the cache's cells had the old V layout: dropped, said
        assert e.context_params(1).flash_attn is True and e.info.kernels == e.kernels
        assert len(e.cache.nodes()) == 0
        assert "switched to flash attention on" in st.note and "cached prompt" in st.note
        again = run_prompt(e, TPL, {"q": "why?"}, reuse="chain")
        assert again.verdict.exact
    # the next start pays nothing
    with make(tiny_model) as e:
        assert e.kernels.how == "measured earlier" and e.kernels.flash_attn is True
        # a provisional one (a busy machine) is used, and wanted again only once it is old
        # enough: not at every start
        assert e.kernel_state.status().state == "done"
        assert e.kernels.measuring_wanted is False


def test_without_deferring_the_engine_measures_first(tiny_model, forced):
    kc._cache_path().unlink(missing_ok=True)
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_batch=32, n_threads=1,
                             flash_attn="auto")) as e:
        assert e.kernels.how == "measured" and e.kernels.flash_attn is True
        assert e.context_params(1).flash_attn is True
        assert e.kernels.rounds >= 3 and e.kernels.load is not None and e.kernels.measured_at > 0


def _spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                             "while time.time() - t < 60: pass"])


def test_a_measurement_beside_a_busy_process_is_provisional_or_gets_the_quiet_answer(tiny_model):
    params = EngineConfig(n_ctx=1024, n_batch=32, n_threads=1).context_params(1)
    with make(tiny_model, n_batch=32) as e:
        quiet_measurement = kc.new_measurement(e.model, params)
        quiet_measurement.run()
        quiet = kc._decide(quiet_measurement.result.timings, "measured", 0.0)
        spinners = [_spinner() for _ in range(2)]  # both cores, bounded to 60 s
        try:
            busy = kc.new_measurement(e.model, params)
            busy.run()
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        r = busy.result
        choice = kc._decide(r.timings, "measured", 0.0)
        if r.load.source == "/proc/stat":  # the load was seen: at least one core's worth
            assert r.load.share > BUSY_SHARE and r.load.busy
        assert r.provisional or choice.flash_attn == quiet.flash_attn


def test_kvprimer_info_measures_in_the_foreground_and_shows_the_figures(tiny_model, capsys):
    from app.cli import main

    kc._cache_path().unlink(missing_ok=True)
    m = ["-m", str(tiny_model), "-tb", "1", "-c", "512", "-b", "24", "-fa", "auto"]
    assert main(["info", *m]) == 0
    out, err = capsys.readouterr()
    assert "measuring the attention kernels first (no trusted measurement yet)" in err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("attention kernel: "))
    assert "(measured" in lines[head]
    figures = "\n".join(lines[head + 1:head + 6])
    assert figures.count("24-token suffix") == 2 and "±" in figures  # both kernels, spread
    assert "cores" in figures and "rounds" in figures and "measured 2" in figures  # load, when
    assert ("provisional" in lines[head]) == ("provisional:" in figures)
    # the next command reads it: a trusted one is not measured again (a provisional one is
    # re-measured only once it is older than a while)
    assert main(["info", *m, "--json"]) == 0
    out, err = capsys.readouterr()
    import json

    k = json.loads(out)["kernels"]
    assert k["how"] == "measured earlier" and "measuring" not in err
    assert k["load"]["n_cores"] >= 1 and k["figures"]


@pytest.mark.parametrize("arch", ["lfm2", "granitehybrid", "nemotron_h"])
def test_auto_measures_hybrid_models_whose_state_cannot_be_cut_back(arch_models, arch):
    """The timing prefix is put back from a saved state, not trimmed with seq_rm, which a
    recurrent state refuses (the next decode then failed: `-fa auto` broke on lfm2)."""
    kc._cache_path().unlink(missing_ok=True)
    with Engine(EngineConfig(model_path=str(arch_models[arch]), n_ctx=512, n_batch=32,
                             n_threads=1, flash_attn="auto")) as e:
        assert e.info.traits.hybrid
        assert e.kernels.how == "measured" and len(e.kernels.timings) == 2
        assert all(t.suffix_ms > 0 and t.split_suffix_ms > 0 for t in e.kernels.timings)
        # what the old measurement did fails here: the recurrent part cannot be cut back
        from app.engine.llama.native import NativeContext

        ctx = NativeContext(e.model, e.context_params(1))
        try:
            ctx.decode([(i + 3, i, (0,), False) for i in range(16)])
            assert not ctx.seq_rm(0, 8, -1)
        finally:
            ctx.close()
        rep = run_prompt(e, Template.parse("hello world <q>"), {"q": "why?"}, warm=False)
        assert rep.cold.tokens  # the engine runs on the measured kernel


def test_recurrent_models_have_no_attention_kernel_to_choose(arch_models):
    with Engine(EngineConfig(model_path=str(arch_models["mamba2"]), n_ctx=512, n_batch=32,
                             n_threads=1, flash_attn="auto"), measure_kernels_later=True) as e:
        assert (e.kernels.flash_attn, e.kernels.how) == (None, "required")
        assert e.kernel_state.status().state == "done"


def test_runs_far_from_the_measurement_make_the_engine_measure_again(tiny_model, forced,
                                                                      monkeypatch):
    from app.engine.llama import kernel_watch

    kc._cache_path().unlink(missing_ok=True)
    short = Template.parse("hello world <q>")
    with make(tiny_model) as e:
        e.measure_kernels()
        assert e.kernels.how == "measured" and e.kernel_state.status().state in ("done", "wanted")
        e.kernel_state.wanted = False  # trusted, as on a quiet machine
        # the forced figures (10 ms for 32 tokens) are far from what these runs take
        monkeypatch.setattr(kernel_watch, "MARGIN", 1.0 + 1e-9)
        msgs = []
        for q in ("why is the world of the answer?", "how is the world of the answer?",
                  "what is the world of the answer?"):
            rep = run_prompt(e, short, {"q": q}, reuse="prefix", cold=False, oneshot=False)
            msgs.append(e.note_run(rep.warm))
        assert not any(msgs[:-1]) and "measuring them again" in msgs[-1]
        st = e.kernel_state.status()
        assert st.state == "wanted" and "measuring them again" in st.text()
        assert e.info.kernels.provisional and e.kernels.provisional


def _entry() -> tuple[str, dict]:
    data = json.loads(kc._cache_path().read_text())
    assert len(data) == 1, data
    return next(iter(data.items()))


def test_commands_never_measure_they_say_which_kernel_and_info_measures(tiny_model, tmp_path,
                                                                          capsys):
    """run and prime use the last choice or the safe default and say which in one line; only
    `kvprimer info` measures; a provisional measurement is not measured again by the next
    commands, only once it is old enough."""
    from app.cli import main
    from app.engine.engine_kernels import RETRY_S

    kc._cache_path().unlink(missing_ok=True)
    tpl = tmp_path / "t.tmpl"
    tpl.write_text("hello world of the answer. the context is the world. <q>")
    m = ["-m", str(tiny_model), "-tb", "1", "-c", "512", "-b", "24", "-fa", "auto"]
    state = str(tmp_path / "p.kvstate")
    run = ["run", str(tpl), *m, "--set", "q=why?", "--warm"]
    for argv in (["prime", str(tpl), *m, "-o", state], run):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "measuring" not in err
        lines = [line for line in err.splitlines() if "flash attention" in line]
        assert lines == ["kvprimer: flash attention off, the safe default: the attention kernels "
                         "are not measured on this model yet (`kvprimer info` measures them, in "
                         "seconds)"]
        assert not kc._cache_path().exists()  # nothing measured, nothing cached
    assert main(["info", *m]) == 0
    err = capsys.readouterr().err
    assert "measuring the attention kernels first (no trusted measurement yet)" in err
    key, entry = _entry()

    # the measurement came out provisional (a busy machine) a minute ago
    entry.update(provisional=True, why="the machine was busy: other programs used 1.50 of 2 "
                 "cores (75%, injected)", tries=1, at=time.time() - 60)
    kc._cache_path().write_text(json.dumps({key: entry}))
    for argv in (run, ["info", *m]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "measuring" not in err  # not measured again by every command, info neither
        assert _entry()[1]["at"] == entry["at"]
    assert main(run) == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "flash attention" in line)
    assert "measured earlier and provisional (the machine was busy" in line
    assert "measured again later, or now with `kvprimer info --remeasure`" in line

    # once it is old enough, info measures again; the commands still do not
    entry["at"] = time.time() - RETRY_S - 60
    kc._cache_path().write_text(json.dumps({key: entry}))
    assert main(run) == 0
    err = capsys.readouterr().err
    assert "measuring" not in err and "`kvprimer info` measures again" in err
    assert main(["info", *m]) == 0
    err = capsys.readouterr().err
    assert "the last measurement is provisional and 16 minutes old: measuring again" in err
    again = _entry()[1]
    assert again["at"] > entry["at"]
    # provisional again (still busy): the next try waits twice as long
    assert again["tries"] == (2 if again["provisional"] else 0)
