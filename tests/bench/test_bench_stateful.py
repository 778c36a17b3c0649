"""The bench's stateful-model section on the tiny hybrid and recurrent models: it runs prefix
and chain mode and llama-cpp-python's LlamaRAMCache on every architecture and writes the keys
results.json carries. Timings are not checked here: the bench is for that."""
import json

import pytest

from bench.stateful_bench import (MODES, StatefulConfig, format_stateful, model_file, run_stateful,
                                  short_rag_template)
from app.resources_path import examples_dir

ARCHS = ("lfm2", "granitehybrid", "mamba2")


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    cfg = StatefulConfig(layouts=None, n_embd=128, n_ff=256, weight_type="f32", rows=2,
                         prefix_chars=200, n_ctx=1024, n_batch=32, n_threads=1, max_tokens=3,
                         model_dir=str(tmp_path_factory.mktemp("bench-models")))
    return cfg, run_stateful(cfg, log=lambda msg: None)


def test_section_runs_every_architecture_and_writes_the_keys(section):
    cfg, st = section
    assert "random-weight" in st["note"]
    assert 0 < st["machine"]["cpu_share"] and st["machine"]["loadavg_end"] is not None
    assert list(st["archs"]) == list(ARCHS)
    for arch in ARCHS:
        a = st["archs"][arch]
        assert a["model"]["architecture"] == arch
        assert [(r["row"], r["reuse"]) for r in a["rows"]] == [(n, m) for m in MODES
                                                                for n in (2, 3)]
        assert all(r["error"] is None for r in a["rows"]), a["rows"]
        # exact on every row, and every warm run reused at least the static prefix
        assert a["bit_identical"] == {m: {"rows": 2, "bit_identical": 2} for m in MODES}
        assert all(r["reused_tokens"] >= r["prefix_tokens"] > 0 for r in a["rows"])
        # the peer ran each row after ours, beside every mode
        assert ({m: [p["row"] for p in a["llamacpp_ram"][m]] for m in MODES}
                == {m: [2, 3] for m in MODES})
        assert all(p["evaluated_tokens"] > 0 for m in MODES for p in a["llamacpp_ram"][m])
        for key in ("warm_vs_cold", "chain_vs_cold", "chain_vs_llamacpp_ram",
                    "prefix_vs_llamacpp_ram", "chain_vs_llamacpp_ram_evaluated"):
            assert a["ratios"][key] > 0, key
            assert st["ratios"][f"stateful_{arch}_{key}"] == a["ratios"][key]
    json.dumps(st)  # results.json takes it as it is
    text = format_stateful(st)
    assert all(arch in text for arch in ARCHS) and "bit-identical: prefix 2/2, chain 2/2" in text


def test_model_is_written_once_per_parameters(section, tmp_path):
    cfg, _ = section
    path = model_file(cfg, "lfm2")
    mtime = path.stat().st_mtime_ns
    assert model_file(cfg, "lfm2") == path and path.stat().st_mtime_ns == mtime
    from dataclasses import replace
    assert model_file(replace(cfg, n_ff=128), "lfm2") != path


def test_short_template_keeps_slots_and_cuts_the_system_text():
    full = (examples_dir() / "rag.tmpl").read_text(encoding="utf-8")
    short = short_rag_template(full, 700)
    assert short.endswith(full[full.index("# Context\n"):])
    assert 300 < short.index("# Context") <= 702 and full.startswith(short[:300])


def test_benchmarks_md_quotes_the_stored_stateful_run():
    """Every cell of BENCHMARKS.md's stateful table is the stored run's figure."""
    from tests.docs.test_doc_figures import BENCHMARKS, ROOT, table_rows

    st = json.loads((ROOT / "bench" / "results-stateful.json").read_text())["stateful"]
    doc = BENCHMARKS[BENCHMARKS.index("## Hybrid and recurrent models"):]
    rows = table_rows(doc, "| model | layers |")
    assert [r[0] for r in rows] == list(st["archs"])
    for arch, layers, mb, kv, rec, pre, chain, *ratios, peer in rows:
        a, m = st["archs"][arch], st["archs"][arch]["model"]
        assert (layers, mb, kv, rec) == (a["layout"], f"{m['file_bytes'] / 1e6:.1f}",
                                         f"{m['kv_bytes_per_token']:,}",
                                         f"{m['traits']['recurrent_state_bytes']:,}")
        assert [pre, chain] == [f"{c['bit_identical']}/{c['rows']}"
                                for c in a["bit_identical"].values()]
        names = ("warm_vs_cold", "chain_vs_cold", "prefix_vs_llamacpp_ram", "chain_vs_llamacpp_ram")
        assert ratios == [f"{a['ratios'][n]:.3f}" for n in names]
        assert peer == str(max(p["reused_tokens"] for m in MODES for p in a["llamacpp_ram"][m]))
        assert f"{a['ratios']['chain_vs_llamacpp_ram_evaluated']:.3f}" == "0.316"
    # the run with the peer after ours that the text quotes, model by model in the table's order
    after = json.loads((ROOT / "bench" / "results-stateful-peer-after.json").read_text())
    after = after["stateful"]
    text = " ".join(doc.split())
    for name in ("warm_vs_cold", "chain_vs_llamacpp_ram"):
        a, b, c = (f"{after['archs'][arch]['ratios'][name]:.3f}" for arch in st["archs"])
        assert f"`{name}` {a}, {b} and {c}" in text, name


def test_only_stateful_keeps_the_other_figures_in_out(section, tmp_path, monkeypatch):
    import bench.stateful_bench as sb
    from bench.__main__ import main

    _, st = section
    seen = {}

    def fake_run(cfg, log=print):
        seen["cfg"] = cfg
        return st

    monkeypatch.setattr(sb, "run_stateful", fake_run)
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"reuse": {"rows": []}, "ratios": {"chain_vs_prefix_warm": 0.5}}))
    assert main(["--only-stateful", "--threads", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["reuse"] == {"rows": []} and got["ratios"]["chain_vs_prefix_warm"] == 0.5
    assert got["stateful"]["archs"].keys() == st["archs"].keys()
    assert got["ratios"]["stateful_mamba2_chain_vs_llamacpp_ram"] == st["ratios"][
        "stateful_mamba2_chain_vs_llamacpp_ram"]
    assert seen["cfg"].n_threads == 1 and seen["cfg"].archs == ("lfm2", "granitehybrid", "mamba2")


def test_a_model_that_fails_is_recorded_and_the_others_still_run(section, tmp_path, monkeypatch):
    import bench.stateful_bench as sb
    from dataclasses import replace

    cfg, _ = section
    broken = tmp_path / "lfm2-broken.gguf"
    broken.write_bytes(sb.model_file(cfg, "lfm2").read_bytes()[:4096])  # tensors cut off
    real = sb.model_file
    monkeypatch.setattr(sb, "model_file", lambda c, a: broken if a == "lfm2" else real(c, a))
    st = sb.run_stateful(replace(cfg, archs=("lfm2", "mamba2"), rows=1, llamacpp=False),
                         log=lambda msg: None)
    assert "\n" not in st["archs"]["lfm2"]["error"] and st["archs"]["lfm2"]["error"]
    assert st["archs"]["mamba2"]["bit_identical"]["chain"] == {"rows": 1, "bit_identical": 1}
    assert "lfm2: failed:" in sb.format_stateful(st)
