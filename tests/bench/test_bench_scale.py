"""The bench's scale section (bench/scale.py) at toy sizes on the tiny model: every path runs in
its own process, the figures land where the report, the chart and results.json read them, and
every ratio and goal is computed from the same run's figures."""
from __future__ import annotations

import json

import pytest

from bench import scale
from bench.scale import MODEL_1B, MODEL_32K, ScaleConfig, goal_rows, run_ratios, run_scale


def _server_built() -> bool:
    from app.servers.llama_server_process import ServeError, find_binary

    try:
        find_binary()
    except ServeError:
        return False
    return True


@pytest.fixture(scope="module")
def section(tiny_model):
    # both of the section's models are the tiny model here, at toy sizes
    cfg = ScaleConfig(sizes=(200,), sizes_1b=(300,), repeats=2, max_tokens=4, n_threads=1,
                      n_batch=64, model_paths={MODEL_32K: str(tiny_model), MODEL_1B: str(tiny_model)},
                      head_chars=120,
                      server=_server_built(), timeout_s=300)
    seen = []
    sc = run_scale(cfg, log=lambda _msg: None, on_run=lambda s: seen.append(len(s["runs"])))
    sc["_partials"] = seen
    return sc


def test_each_size_runs_every_path_on_the_same_prompt(section):
    assert section["_partials"] == [1, 2]  # results.json is written after each run
    runs = section["runs"]
    assert [(r["model"], r["label"]) for r in runs] == [(MODEL_32K, "200"), (MODEL_1B, "300")]
    for r in runs:
        assert "error" not in r, r.get("error")
        o = r["ours"]
        assert r["target"] - 2 <= o["prefix_tokens"] <= r["target"] + 150  # whole passage lines
        assert o["prefix_tokens"] + o["suffix_tokens"] == o["prompt_tokens"] <= r["n_ctx"]
        assert o["cold"]["evaluated_tokens"] == o["prompt_tokens"]
        assert o["cold_runs"] == 1  # every warm run was judged against the one cold run
        s = o["samples"]
        for tier, where in (("resident", "resident"), ("ram", "ram"), ("file_tier", "file")):
            assert [x["from_tier"] for x in s[tier]] == [where] * 2, tier
        for tier in ("resident", "ram", "file_tier", "state_file", "state_file_cached", "limit"):
            assert [x["evaluated_tokens"] for x in s[tier]] == [o["suffix_tokens"]] * 2, tier
        assert all(x["load_ms"] > 0 for x in s["state_file"])
        assert all(x["read_ms"] > 0 for x in s["state_file"])  # the floor's read, per repeat
        assert [x["page_cache_dropped"] for x in s["state_file_cached"]] == [False] * 2
        assert all(x["load_ms"] > 0 for x in s["state_file_cached"])
        assert len(o["verdicts"]["state_file_cached"]) == 2
        assert r["ratios"]["warm_file_cached_vs_limit"] > 0
        assert o["limit_seeded_from_state"]
        # every warm run is the cold run's tokens, bit for bit
        assert set(v for vs in o["verdicts"].values() for v in vs) == {"bit-identical"}
        assert o["peak_rss"]["run"] >= o["peak_rss"]["prime"] >= o["peak_rss"]["load"] > 0
        lim = o["limits"]
        assert lim["bytes"] == o["sizes"]["state_bytes"] and lim["memcpy_ms"] > 0
        assert lim["read_cold_ms"] > 0 and lim["read_cached_ms"] > 0
        p = r["llamacpp"]
        assert "error" not in p, p.get("error")
        assert p["cold"]["evaluated_tokens"] == o["prompt_tokens"]
        assert [x["evaluated_tokens"] for x in p["llamacpp_ram"]] == [o["suffix_tokens"]] * 2
        assert p["peak_rss"]["plain"] > 0
        if "llama_server" in r:
            q = r["llama_server"]
            assert not [k for k in q if k.endswith("error")], q
            assert q["slot_file"]["tokens"] == o["prefix_tokens"]
            assert all(x["reused_tokens"] >= o["prefix_tokens"] - 1 for x in q["slot_restore"])


def test_ratios_and_goals_come_from_the_same_run(section):
    runs = section["runs"]
    for r in runs:
        assert r["ratios"] == run_ratios(r)
        rs = r["ratios"]
        sz = r["ours"]["sizes"]
        assert rs["state_bytes_vs_raw_kv"] == sz["state_file_bytes"] / sz["raw_kv_bytes"]
        # the cells, plus a header and the token ids (a share that shrinks at real sizes)
        assert 0 < sz["state_file_bytes"] - sz["raw_kv_bytes"] < 8192
        assert rs["not_bit_identical"] == 0
        # against the floor (limit + the same bytes read), per repeat: a median in its range
        assert 0 < rs["warm_file_vs_floor_min"] <= rs["warm_file_vs_floor"] \
            <= rs["warm_file_vs_floor_max"] <= rs["warm_file_vs_limit_max"]
        assert rs["warm_file_vs_limit_min"] <= rs["warm_file_vs_limit"] <= rs["warm_file_vs_limit_max"]
        assert rs["rss_vs_plain"] > 0 and rs["warm_ram_vs_limit"] > 0
        assert r["goals"]["warm_ram_vs_limit"]["value"] == rs["warm_ram_vs_limit"]
    # the largest prefix of the default model's shape carries the warm / cold goal
    assert "warm_ram_vs_cold" in runs[0]["goals"] and "warm_ram_vs_cold" not in runs[1]["goals"]
    rows = {g["ratio"]: g for g in section["goal_rows"]}
    assert rows == {g["ratio"]: g for g in goal_rows(runs)}
    # the goal is peak RSS less the RAM tier's bytes, which are reported beside it
    assert rows["rss_less_ram_tier_vs_plain"]["value"] == max(
        r["ratios"]["rss_less_ram_tier_vs_plain"] for r in runs)
    for r in runs:
        o, plain = r["ours"], r["llamacpp"]["peak_rss"]["plain"]
        held = scale.ram_tier_bytes(o)
        assert 0 <= held <= min(sum(t["used_bytes"] for t in o[k] if t["name"] == "ram")
                                for k in ("tiers_after_prime", "tiers_after_run"))
        assert r["ratios"]["rss_less_ram_tier_vs_plain"] == (o["peak_rss"]["run"] - held) / plain
        assert r["ratios"]["rss_vs_plain"] == o["peak_rss"]["run"] / plain
    assert rows["warm_ram_vs_cold"]["value"] == runs[0]["ratios"]["warm_ram_vs_cold"]
    assert rows["not_bit_identical"]["value"] == 0 and rows["not_bit_identical"]["met"]
    assert rows["failed_paths"]["value"] == 0  # the tiny model's states load at a tight n_ctx
    key = "scale_smollm2_32k_200_warm_ram_vs_limit"
    assert section["ratios"][key] == runs[0]["ratios"]["warm_ram_vs_limit"]
    assert section["goals"][key]["value"] == runs[0]["ratios"]["warm_ram_vs_limit"]
    est = section["full_run_estimate"]
    assert est["seconds"] > 0 and est["sizes"][MODEL_32K] == list(scale.DEFAULT_SIZES)
    assert set(est["fits"]) == {MODEL_32K, MODEL_1B}
    json.dumps(section)  # results.json can hold it


def test_report_markdown_and_chart(section, tmp_path):
    from bench.scale_chart import render_scale_chart
    from bench.scale_report import format_scale, scale_markdown

    text = format_scale(section)
    assert "restore (GB/s)" in text and "estimated duration of the full scale run" in text
    md = scale_markdown(section)
    assert md.startswith("## Real sizes")
    # a row in each of the two tables per run; the goals table names the worst run
    assert sum(line.startswith(f"| {MODEL_32K} 200 |") for line in md.splitlines()) == 2
    assert md.count("| goal (real sizes) | value | goal | verdict | worst run |") == 1
    out = render_scale_chart(section, tmp_path / "scale.png")
    assert out.stat().st_size > 5000


def test_the_prompt_reaches_its_target_from_the_example_passages(tiny_model):
    from app.engine.llama.native_model import NativeModel

    m = NativeModel(tiny_model)
    try:
        def count(text):
            return len(m.tokenize(text, add_special=True, parse_special=True))

        tpl = scale.build_template(900, count, head_chars=200)
        prefix = tpl.split("<question>")[0]
        n = count(prefix)
    finally:
        m.close()
    assert 900 <= n < 900 + 300
    assert "1. (archive 1) " in tpl and tpl.endswith("<|im_start|>assistant\n")
    lines = [ln for ln in prefix.splitlines() if ln[:1].isdigit()]
    assert len(set(lines)) == len(lines)  # varied, not the same line again


def test_the_bench_command_runs_the_scale_section_alone(section, monkeypatch, tmp_path):
    import bench.__main__ as main

    got = {}

    def fake_run(cfg, log=None, on_run=None):
        got["cfg"] = cfg
        on_run(section)
        return section

    monkeypatch.setattr(scale, "run_scale", fake_run)
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"kept": 1, "ratios": {"other": 2.0}}))
    code = main.main(["--only-scale", "--scale-sizes", "512,1024", "--scale-1b-sizes", "",
                      "--scale-repeats", "2", "--out", str(out),
                      "--scale-chart", str(tmp_path / "scale.png")])
    assert code == 0
    cfg = got["cfg"]
    assert (cfg.sizes, cfg.sizes_1b, cfg.repeats) == ((512, 1024), (), 2)
    res = json.loads(out.read_text())
    assert res["kept"] == 1 and res["ratios"]["other"] == 2.0  # the other figures stay
    assert res["scale"]["runs"] == json.loads(json.dumps(section["runs"]))
    assert res["ratios"]["scale_smollm2_32k_200_warm_ram_vs_limit"] == \
        section["runs"][0]["ratios"]["warm_ram_vs_limit"]
    assert (tmp_path / "scale.png").stat().st_size > 5000


def test_a_stored_section_is_scored_again_from_its_figures(section, tmp_path):
    """`python -m bench.scale_report --rescore` recomputes a stored section's ratios and goals
    (top-level scale_* entries too) from its figures, leaving the figures and the rest alone."""
    import copy

    from bench import scale_report

    sc = copy.deepcopy({k: v for k, v in section.items() if k != "_partials"})
    for r in sc["runs"]:  # as an older run stored it: no RAM-tier figure, no tiers after prime
        r["ratios"].pop("rss_less_ram_tier_vs_plain")
        r["ours"].pop("tiers_after_prime")
    sc["goal_rows"] = [g for g in sc["goal_rows"] if g["ratio"] != "rss_less_ram_tier_vs_plain"]
    sc["ratios"]["scale_old_ratio"] = 1.0  # a ratio the section no longer computes
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"scale": sc, "ratios": {**sc["ratios"], "other": 2.0},
                                "goals": {"other": {}}, "machine": {"x": 1}}), encoding="utf-8")
    assert scale_report.main(["--rescore", str(path)]) == 0
    back = json.loads(path.read_text(encoding="utf-8"))
    rows = {g["ratio"]: g for g in back["scale"]["goal_rows"]}
    assert "rss_less_ram_tier_vs_plain" in rows and "rss_vs_plain" not in rows
    assert back["ratios"]["other"] == 2.0 and back["machine"] == {"x": 1}
    assert "scale_old_ratio" not in back["ratios"]
    key = "scale_smollm2_32k_200_rss_less_ram_tier_vs_plain"
    assert back["ratios"][key] == back["scale"]["runs"][0]["ratios"]["rss_less_ram_tier_vs_plain"]
    assert back["scale"]["runs"][0]["ours"] == sc["runs"][0]["ours"]  # figures untouched


def test_runs_measured_apart_are_added_in_place_and_said(section, tmp_path):
    """`--add-runs FILE` puts another stored section's runs in place of the same model and size
    (or beside them), in the plan's order, scores the whole again, and the report names each
    added run with its own machine and load."""
    import copy

    from bench import scale_report

    sc = copy.deepcopy({k: v for k, v in section.items() if k != "_partials"})
    other = copy.deepcopy(sc)
    other["machine"] = {**sc["machine"], "date_utc": "2001-01-01 00:00 UTC", "cpu_share": 0.5}
    longer = copy.deepcopy(other["runs"][0])  # a larger size of the 32k shape, run apart
    longer.update(target=400, label="400")
    replaced = copy.deepcopy(other["runs"][1])  # the 1B run measured again
    replaced["ours"]["cold"]["ttft_ms"] *= 2
    other["runs"] = [longer, replaced, {"model": MODEL_32K, "target": 800, "label": "800",
                                        "error": "RuntimeError: stopped"}]
    path, other_path = tmp_path / "results.json", tmp_path / "other.json"
    path.write_text(json.dumps({"scale": sc, "ratios": dict(sc["ratios"]),
                                "goals": dict(sc["goals"])}), encoding="utf-8")
    other_path.write_text(json.dumps({"scale": other}), encoding="utf-8")
    assert scale_report.main(["--add-runs", str(tmp_path / "none.json"), str(path)]) == 1
    assert scale_report.main(["--add-runs", str(other_path), str(path)]) == 0
    back = json.loads(path.read_text(encoding="utf-8"))["scale"]
    assert [(r["model"], r["target"]) for r in back["runs"]] == \
        [(MODEL_32K, 200), (MODEL_1B, 300), (MODEL_32K, 400)]  # the failed run not taken
    assert "measured_apart" not in back["runs"][0]
    assert back["runs"][1]["ours"]["cold"]["ttft_ms"] == replaced["ours"]["cold"]["ttft_ms"]
    assert back["runs"][2]["measured_apart"]["cpu_share"] == 0.5
    assert back["settings"]["sizes"] == [200, 400] and back["settings"]["sizes_1b"] == [300]
    # the warm/cold goal belongs to the largest size of the 32k shape, now the added one
    assert "warm_ram_vs_cold" in back["runs"][2]["goals"]
    assert "warm_ram_vs_cold" not in back["runs"][0]["goals"]
    assert any(k.startswith("scale_smollm2_32k_400_") for k in back["goals"])
    md = scale_report.scale_markdown(back)
    assert f"{MODEL_32K} 400 from `{other_path.as_posix()}`" in md and "0.5" in md
    assert f"{MODEL_1B} 300 from" in md and f"{MODEL_32K} 200 from" not in md


def test_the_file_path_is_scored_against_its_floor_repeat_by_repeat():
    """Each warm run from a .kvstate against the limit plus the read of the same file in the
    same repeat; a run stored before samples had their own read uses the read at its end."""
    from bench.scale import file_floor

    files = [{"ttft_ms": 300.0, "read_ms": 100.0}, {"ttft_ms": 240.0, "read_ms": 50.0},
             {"ttft_ms": 260.0, "read_ms": 60.0}]
    ours = {"samples": {"state_file": files, "limit": [{"ttft_ms": 100.0}, {"ttft_ms": 150.0},
                                                       {"ttft_ms": 140.0}]},
            "limits": {"read_cold_ms": 80.0}}
    f = file_floor(ours)
    assert f == {"ratio": 1.3, "min": 1.2, "max": 1.5, "read_ms": 60.0, "paired_read": True,
                 "vs_limit": 200.0 / 140.0}  # the limit + the read, over the limit: 2, 1.33, 1.43
    for x in files:
        del x["read_ms"]
    f = file_floor(ours)
    assert not f["paired_read"] and f["read_ms"] == 80.0
    assert f["ratio"] == 260.0 / 220.0 and f["max"] == 300.0 / 180.0
    ours["samples"]["limit"].pop()  # a path that lost a sample is not paired
    assert file_floor(ours)["ratio"] is None


def test_a_load_is_compared_with_the_read_of_its_own_repeat(section):
    """restore_file_vs_read pairs each load with the read just before it; a stored run whose
    samples have no read of their own keeps the figure it had (the read at its end)."""
    import copy
    import statistics

    from bench.stats import pairwise_ratio

    run = section["runs"][0]
    s = run["ours"]["samples"]["state_file"]
    assert run["ratios"]["restore_file_vs_read"] == pairwise_ratio(
        [x["load_ms"] + x["restore_ms"] for x in s], [x["read_ms"] for x in s])
    old = copy.deepcopy(run)
    for x in old["ours"]["samples"]["state_file"]:
        del x["read_ms"]
    assert run_ratios(old)["restore_file_vs_read"] == statistics.median(
        x["load_ms"] + x["restore_ms"] for x in s) / run["ours"]["limits"]["read_cold_ms"]


def test_a_file_goal_under_the_disks_own_floor_says_so(section):
    """The goal for the file path is missed where the limit plus the disk's read of the same
    bytes is already over it: the verdict names that floor, so a slow disk is not read as a
    slow load. Met, or missed with a floor under the bound: no floor is named."""
    import copy

    from bench.scale import goal_rows

    runs = copy.deepcopy([r for r in section["runs"] if "error" not in r])
    worst = runs[0]
    for r in runs:
        r["ratios"]["warm_file_vs_limit"] = 1.0
    worst["ratios"].update(warm_file_vs_limit=1.4, file_floor_vs_limit=1.3)
    row = next(g for g in goal_rows(runs) if g["ratio"] == "warm_file_vs_limit")
    assert row["met"] is False and row["floor"] == 1.3
    assert row["worst"] == f"{worst['model']} {worst['label']}"
    from bench import scale_report

    back = copy.deepcopy(section)
    back["runs"], back["goal_rows"] = runs, goal_rows(runs)
    assert "(this disk's floor alone: 1.30)" in scale_report.scale_markdown(back)
    worst["ratios"]["file_floor_vs_limit"] = 1.1  # the disk leaves room: the load missed
    row = next(g for g in goal_rows(runs) if g["ratio"] == "warm_file_vs_limit")
    assert row["met"] is False and "floor" not in row
    worst["ratios"]["warm_file_vs_limit"] = 1.15
    assert "floor" not in next(g for g in goal_rows(runs) if g["ratio"] == "warm_file_vs_limit")
