"""The figures README.md and BENCHMARKS.md quote are the stored results' figures.

Every figure in the two documents comes from a file in the repository: `bench/results.json`
(the last `make bench`), `bench/cli-rag-rows.json`/`.txt` (the CLI run the README shows), the
example rows, or the code's own constants. These tests read the stored files and fail when a
quoted figure and its source drift apart (a new `make bench` without the documents updated, or
a document edited by hand).
"""
from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
README = (ROOT / "README.md").read_text(encoding="utf-8")
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
RES = json.loads((ROOT / "bench" / "results.json").read_text(encoding="utf-8"))
CLI = json.loads((ROOT / "bench" / "cli-rag-rows.json").read_text(encoding="utf-8"))
CLI_TXT = (ROOT / "bench" / "cli-rag-rows.txt").read_text(encoding="utf-8")
REUSE = RES["reuse"]


def flat(text: str) -> str:
    """The text with every run of white space as one space (figures wrap across lines)."""
    return " ".join(text.split())


def ms(x: float) -> str:
    return f"{x:,.0f}"


def table_rows(doc: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header line starts with ``header``."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def assert_quoted(doc: str, *figures: str) -> None:
    text = flat(doc)
    missing = [f for f in figures if flat(f) not in text]
    assert not missing, f"not quoted as stored: {missing}"


# ---- BENCHMARKS.md ------------------------------------------------------------------------

def test_every_ratio_and_goal_in_the_tables_is_the_stored_one():
    rows = (table_rows(BENCHMARKS, "| ratio | value | goal |")
            + table_rows(BENCHMARKS[BENCHMARKS.index("## Reuse beyond"):], "| ratio | value | goal |"))
    assert len(rows) >= 15
    for name_cell, value, goal in rows:
        name = re.match(r"`(\w+)`", name_cell).group(1)
        stored = RES["ratios"][name]
        decimals = len(value.split(".")[1]) if "." in value else 0
        assert value == f"{stored:.{decimals}f}", name
        g = RES["goals"].get(name)
        if goal:
            bound, verdict = re.match(r"≤ ([\d.]+): \**(met|missed)\**", goal).groups()
            assert g is not None and g["goal"] == f"<= {bound}", name
            assert verdict == ("met" if g["met"] else "missed"), name
        else:
            assert g is None, f"{name} has a goal the table does not show"


TTFT_PATHS = {
    "cold": "cold", "fastest limit": "limit", "ours warm, kept in place": "warm_in_place",
    "ours warm, copied from the radix cache": "warm_memory",
    "ours warm, from a .kvstate file": "warm_file",
    "old limit (cache's shared context, small batches)": "limit_cache_context",
    "llama-cpp-python LlamaRAMCache": "llamacpp_ram",
    "llama-cpp-python LlamaDiskCache": "llamacpp_disk",
    "llama-cpp-python in-context reuse": "llamacpp_in_context",
    "ours q8_0 KV warm, from memory": "q8_0_warm_memory", "q8_0 KV limit": "q8_0_limit",
}


def test_the_time_to_first_token_table_is_the_stored_summaries():
    rows = table_rows(BENCHMARKS, "| path | median | min–max | evaluated |")
    assert [r[0] for r in rows] == list(TTFT_PATHS)
    for label, median, span, evaluated in rows:
        s = RES["summaries"][TTFT_PATHS[label]]
        assert (median, span) == (ms(s["median"]), f"{ms(s['min'])}–{ms(s['max'])}"), label
        assert evaluated == " / ".join(ms(n) for n in s["evaluated_tokens"]), label
    w = RES["workload"]
    assert [r["suffix_tokens"] for r in w["rows"]] == [75, 69]
    assert_quoted(BENCHMARKS, f"prefix {w['prefix_tokens']:,} tokens, suffixes 75 and 69 tokens, "
                              f"{RES['settings']['repeats']} repeats")


def test_the_kernel_table_and_choice_are_the_stored_ones():
    rows = table_rows(BENCHMARKS, "| flash attn | n_batch |")
    stored = RES["kernel_table"]["rows"]
    assert len(rows) == len(stored)
    for (fa, nb, per_token, suffix), s in zip(rows, stored):
        assert (fa == "on", int(nb)) == (s["flash_attn"], s["n_batch"])
        assert per_token == f"{s['prefix_ms_per_token']:.2f}"
        assert suffix == f"{ms(s['suffix_ms'])} ms"
    by = {(s["flash_attn"], s["n_batch"]): s["suffix_ms"] for s in stored}
    small = by[(True, 63)] / by[(False, 63)]
    assert_quoted(BENCHMARKS, f"flash attention is {small:.1f}x slower in batches under 64 tokens "
                              f"({ms(by[(True, 63)])} against {ms(by[(False, 63)])} ms)")
    assert_quoted(README, f"took {ms(by[(True, 256)])} ms with flash attention and "
                          f"{ms(by[(False, 256)])} ms without in one batch",
                  f"flash attention was {small:.1f}x slower when the suffix came in batches "
                  f"under 64 tokens ({ms(by[(True, 63)])} against {ms(by[(False, 63)])} ms)")
    k = RES["settings"]["kernels"]
    off, on = (next(t for t in k["timings"] if t["flash_attn"] == fa) for fa in (False, True))
    assert k["flash_attn"] is False
    assert_quoted(BENCHMARKS, f"a 64-token suffix took {ms(off['suffix_ms'])} ms in one batch and "
                              f"{ms(off['split_suffix_ms'])} ms in four with it off, "
                              f"{ms(on['suffix_ms'])} and {ms(on['split_suffix_ms'])} ms with it on",
                  k["reason"].split(" faster")[0] + " faster overall")
    if k["calibration_ms"]:  # a measurement made by this run, not one kept from earlier
        assert_quoted(README, f"{k['calibration_ms'] / 1000:.1f} s for the default model")


def test_the_sweep_table_is_the_stored_sweep():
    rows = table_rows(BENCHMARKS, "| prefix tokens | cold ms |")
    assert len(rows) == len(RES["sweep"])
    for row, p in zip(rows, RES["sweep"]):
        assert row == [ms(p["prefix_tokens"]), ms(p["cold"]["median"]), ms(p["warm"]["median"]),
                       ms(p["limit"]["median"]), f"{p['cold_vs_warm']:.1f}",
                       f"{p['warm_vs_limit']:.2f}"]


def test_the_reuse_section_is_the_stored_one():
    rows = table_rows(BENCHMARKS, "| mode | median warm ms |")
    modes = REUSE["summary"]
    assert [r[0] for r in rows] == REUSE["settings"]["modes"]
    for mode, warm, cold, reused, evaluated, verdicts in rows:
        m = modes[mode]
        assert [warm, cold, reused, evaluated] == [
            ms(m["warm_ms_median"]), ms(m["cold_ms_median"]), ms(m["reused_tokens_median"]),
            ms(m["evaluated_tokens_median"])], mode
        assert verdicts == ", ".join(f"{n} {word}" for word, n in m["equivalence"].items() if n)
    peer = REUSE["llamacpp_ram_recurring"]
    chain = {r["row"]: r for r in REUSE["rows"] if r["reuse"] == "chain"}
    more = [p["reused_tokens"] - chain[p["row"]]["reused_tokens"] for p in peer]
    loads = [p["load_ms"] for p in peer if p["load_ms"] > 10]  # a load_state, not a kept context
    restores = [r["restore_ms"] for r in chain.values()]
    a = REUSE["compose_accuracy"]
    assert_quoted(
        BENCHMARKS,
        f"median {statistics.median(p['ttft_ms'] for p in peer):,.0f} ms to the first token",
        f"on {more.count(0)} of the {len(peer)} rows it reused exactly as many tokens as chain, on "
        f"{sum(1 <= d <= 2 for d in more)} it reused 1–2 more",
        f"its `load_state` takes {min(loads):.0f}–{max(loads):.0f} ms",
        f"in {min(restores):.1f}–{max(restores):.1f} ms",
        f"The section took {REUSE['duration_s']:,.0f} s",
        f"took {RES['machine']['duration_s']:.0f} s",
        f"{REUSE['chain_exact']['bit_identical_rows']}/{REUSE['chain_exact']['rows']} bit-identical",
        f"{REUSE['warm_in_place']['fork']['n']} ABBA pairs",
        f"greedy tokens equal to cold on {a['tokens_equal']:.0%} of rows, top-1 agreement "
        f"{a['top1_agree_mean']:.0%} on average over the compared positions, next-token KL "
        f"median {a['kl_median']:.3f} (max {a['kl_max']:.3f}), max |Δlogit| median "
        f"{a['max_logit_diff_median']:.2f}")
    # every peer starts with the static prefix in its cache, as our engine does (reuse_peers.py)
    assert more.count(0) + sum(1 <= d <= 2 for d in more) == len(peer)
    assert peer[0]["reused_tokens"] >= REUSE["rows"][0]["prefix_tokens"]


def test_the_restore_probe_soak_stalls_and_sizes_are_the_stored_ones():
    rp, s, g, sz = RES["restore_probe"], RES["soak"], RES["gui_stalls"], RES["sizes"]
    ram = RES["summaries"]["llamacpp_ram"]
    saved = ram["load_ms_median"] - RES["summaries"]["warm_memory"]["restore_ms_median"]
    assert_quoted(
        BENCHMARKS,
        f"({rp['state_bytes']:,} bytes of f16 KV)",
        f"file {rp['file_load_ms']:.1f} ms",
        f"in place {rp['set_data_in_place_ms']:.1f} ms (after a ctypes copy "
        f"{rp['set_data_after_copy_ms']:.1f} ms",
        f"`llama_state_seq_get_data` {rp['state_get_ms']:.1f} ms",
        f"state_get {rp['state_get_ms']:.1f} ms + set {rp['set_data_in_place_ms']:.1f} ms",
        f"takes {RES['summaries']['warm_memory']['restore_ms_median']:.1f} ms",
        f"theirs {ram['load_ms_median']:.1f} ms",
        f"of a {sz['llamacpp_ram_entry_bytes'] / 1e6:.1f} MB entry",
        f"their restore is {ram['load_ms_median']:.1f} of their {ms(ram['median'])} ms, and ours "
        f"{saved:.1f} ms less: {100 * saved / ram['median']:.0f}% of the total",
        f"costs {ms(RES['summaries']['limit']['median'])} ms (the fastest limit's median)",
        f"{s['runs']:,} warm runs in {s['seconds']:.1f} s, RSS {s['rss_start_mib']:.1f} MiB at the "
        f"start and {s['rss_end_mib']:.1f} MiB at the end",
        f"primed {g['prefix_tokens']:,} tokens ({g['prime_s']:.1f} s) was {g['max_stall_ms']} ms, "
        f"p99 {g['p99_stall_ms']} ms",
        f"q8_0 paths: same tokens, |Δlogit| {_q8_range()}")
    assert g["stalls_over_50ms"] == 0 and s["growth_mib"] <= 0
    assert RES["machine"]["date_utc"] in BENCHMARKS
    lo, hi = RES["machine"]["loadavg_start"][0], RES["machine"]["loadavg_end"][0]
    assert_quoted(BENCHMARKS, f"load average {lo} at the start of the main paths and {hi} at "
                              f"their end", f"CPU share {RES['machine']['cpu_share']:.2f}")
    f16 = [e["max_abs_logit_diff"] for per in RES["equivalence"].values()
           for name, e in per.items() if not name.startswith("q8_0")]
    assert max(f16) == 0.0


def test_the_settings_and_the_ratios_quoted_in_the_text_are_the_stored_ones():
    m, st, r = RES["machine"], RES["settings"], RES["ratios"]
    rs, pairs = REUSE["settings"], REUSE["static_pairs"]
    assert_quoted(
        BENCHMARKS,
        f"({m['nproc']} vCPUs", f"{st['n_threads']} threads, n_batch = n_ubatch {st['n_batch']}, "
        f"n_ctx {st['n_ctx']}", f"llama-cpp-python {m['llama_cpp_python']}",
        f"same {st['equivalence_tokens']} greedy tokens",
        f"n_ctx {rs['n_ctx']:,}, {rs['max_tokens']} greedy tokens per run",
        f"in batches of up to {rs['n_batch']} tokens",
        f"is at the fastest limit ({r['warm_vs_fastest_limit']:.3f}) and "
        f"{r['warm_vs_llamacpp_in_context']:.3f} of Llama's own in-context reuse",
        f"(`restore_cost_vs_llamacpp_ram` {r['restore_cost_vs_llamacpp_ram']:.3f})",
        f"Against the natively built peer** ({r['chain_vs_llamacpp_ram_recurring']:.3f}, median "
        f"{statistics.median(p['ttft_ms'] for p in REUSE['llamacpp_ram_native_recurring']):,.0f} ms)",
        f"Prefix mode against the peer ({r['prefix_vs_llamacpp_ram_recurring']:.3f})",
        f"medians {ms(pairs['prefix']['median'])} ms both, ratio "
        f"{r['chain_vs_prefix_static_rows']:.3f}" if ms(pairs['prefix']['median'])
        == ms(pairs['chain']['median']) else f"ratio {r['chain_vs_prefix_static_rows']:.3f}",
        f"give {r['chain_vs_prefix_static_rows_phases']:.3f} (`chain_vs_prefix_static_rows_phases`)",
        f"{len(pairs['rows'])} rows, in ABBA pairs of warm runs")
    assert st["kernels"]["flash_attn"] is False and "(flash attention off here)" in BENCHMARKS
    assert RES["same_suffix_tokens"]["ok"]


def _q8_range() -> str:
    d = [e["max_abs_logit_diff"] for per in RES["equivalence"].values()
         for name, e in per.items() if name.startswith("q8_0")]
    return f"{min(d):.2f}–{max(d):.2f}"


INTERNAL = re.compile(r"\bbrief\b|\bthe issue\b|(?<!llama\.cpp )(?<!upstream )\bissue \d"
                      r"|\bissue #\d|\bsession \d|this session", re.I)


def test_no_document_docstring_or_comment_carries_an_internal_reference():
    # llama.cpp's own issues are public references; this project's issues and sessions are not
    sources = [ROOT / "README.md", ROOT / "BENCHMARKS.md",
               *(ROOT / "app").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sources
             for m in INTERNAL.finditer(p.read_text(encoding="utf-8"))]
    assert not found


# ---- README.md ----------------------------------------------------------------------------

def test_the_cli_run_shown_is_the_stored_one():
    block = re.search(r"```text\n\$ [^\n]*kvprimer bench[^\n]*\n(.*?)```", README, re.S).group(1)
    stored = CLI_TXT.splitlines()
    shown = [line for line in block.splitlines() if line.strip() != "..."]
    assert len(shown) >= 3 and all(line in stored for line in shown)
    assert CLI["model"]["kernels"]["flash_attn"] is True
    assert_quoted(README, "flash attention on as the engine measured it there")
    assert_quoted(README, f"SmolLM2-135M-Instruct (Q4_1, {CLI['model']['file_bytes'] / 1e6:.0f} MB")


def test_readme_figures_are_the_stored_ones():
    rz, sz = REUSE["ratios"], RES["sizes"]
    a = REUSE["compose_accuracy"]
    per_token = RES["model"]["kv_bytes_per_token"]
    q8 = [e["max_abs_logit_diff"] for per in RES["equivalence"].values()
          for name, e in per.items() if name.startswith("q8_0")]
    assert_quoted(
        README,
        f"`chain` took {rz['chain_vs_prefix_warm']:.3f} of `prefix` mode's warm time to first "
        f"token",
        f"{REUSE['chain_exact']['rows']} of {REUSE['chain_exact']['rows']} rows "
        f"bit-identical), {rz['chain_vs_llamacpp_ram_recurring']:.3f} of llama-cpp-python's "
        f"`LlamaRAMCache` built natively and {rz['chain_vs_llama_server_recurring']:.3f} of "
        f"llama-server's, and {rz['chain_vs_prefix_static_rows']:.3f} of prefix mode's on the rows "
        f"that reuse only the static prefix",
        f"and `compose` {rz['compose_vs_prefix_warm']:.3f}",
        f"greedy tokens equal to cold on {a['tokens_equal']:.0%} of rows, next-token KL median "
        f"{a['kl_median']:.3f}",
        f"({per_token:,} bytes a token for the default model; "
        f"{RES['summaries']['warm_memory']['restore_ms_median']:.1f} ms, median, for the whole "
        f"{sz['prefix_tokens']:,}-token RAG prefix",
        f"{sz['prefix_tokens']:,} × {per_token:,} bytes of KV plus "
        f"{sz['state_file_bytes'] - sz['raw_kv_bytes']:,} bytes (a {sz['state_file_bytes']:,}-byte "
        f"file",
        f"make the state {RES['ratios']['q8_0_state_bytes_vs_f16_state']:.2f} of f16's",
        f"|Δlogit| up to {max(q8):.2f} on the default model's RAG rows",
        f"n_ctx × {per_token / 1000:.0f} KB for the default model: "
        f"{4096 * per_token / 1e6:.0f} MB each at 4,096",
        f"a {RES['workload']['prefix_tokens']:,}-token support-desk preamble")
    assert (REUSE["chain_exact"]["bit_identical_rows"] == REUSE["chain_exact"]["rows"]
            == REUSE["settings"]["rows"])
    assert a["diverged"] == 1.0  # "every row diverged"


def test_the_reuse_text_quoted_is_a_stored_run():
    row = next(r for r in REUSE["rows"] if r["reuse"] == "chain" and r["row"] == 7)
    text = " + ".join(f"{s['source']} {s['tokens']:,}" for s in row["reused_by_source"])
    assert_quoted(README, f"`{text} · evaluated {row['evaluated_tokens']:,}`")


def test_the_verdict_is_described_as_the_code_makes_it():
    from app.engine.runs.prompt_runs import KEEP_LOGITS
    from app.engine.runs.verdict import ROUNDING_KL, ROUNDING_LOGIT_DIFF

    assert_quoted(README, f"its logits at the first {KEEP_LOGITS} generated positions",
                  f"(|Δlogit| ≤ {ROUNDING_LOGIT_DIFF:.0e} and KL ≤ {ROUNDING_KL:.0e})"
                  .replace("e-0", "e-"))
    assert "every generated position" not in flat(README)
    assert "proves" not in README


def test_the_recurring_workload_is_described_as_the_file_is():
    rows = list(csv.DictReader(open(ROOT / "resources" / "examples" / "rag-recurring.csv",
                                    encoding="utf-8")))
    from resources.examples.make_rag_recurring import POOL, repeats

    rep_c1, rep_c12 = repeats(rows)

    for doc in (README, BENCHMARKS):
        assert_quoted(doc, f"{len(rows)} rows", f"{rep_c1} rows repeat an earlier row's",
                      f"{rep_c12} its `<c1>` and `<c2>`" if doc is BENCHMARKS
                      else f"{rep_c12} its `c1` and `c2`")
    assert_quoted(README, f"a pool of {len(POOL)} support-desk passages")
    assert_quoted(BENCHMARKS, f"a pool of {len(POOL)} with Zipf popularity")


@pytest.mark.parametrize("doc", ["README.md", "BENCHMARKS.md"])
def test_every_stored_file_a_document_cites_exists(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    cited = set(re.findall(r"bench/[\w.-]+\.(?:json|txt|png)", text))
    assert cited and all((ROOT / c).exists() for c in cited), cited


def test_the_versions_the_readme_names_are_the_pinned_ones():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    llama = re.search(r'"llama-cpp-python==([\d.]+)"', pyproject).group(1)
    pyside = re.search(r'"PySide6==([\d.]+)"', pyproject).group(1)
    assert f"llama-cpp-python=={llama}" in README and f"PySide6 is pinned to {pyside}" in README
    assert RES["machine"]["llama_cpp_python"] == llama


# ---- the server run the README quotes ------------------------------------------------------

def test_the_server_figures_are_the_stored_ones():
    dep = json.loads((ROOT / "bench" / "server-deploy.json").read_text(encoding="utf-8"))
    run = json.loads((ROOT / "bench" / "server-rag-rows.json").read_text(encoding="utf-8"))
    txt = (ROOT / "bench" / "server-rag-rows.txt").read_text(encoding="utf-8")
    s = run["summary"]
    assert run["same_model"] is True and dep["restored_tokens"] == dep["prefix_tokens"]
    assert_quoted(README,
                  f"restored the {dep['prefix_tokens']:,}-token RAG prefix "
                  f"({dep['state_bytes'] / 1e6:.1f} MB) in {dep['restore_ms']:.0f} ms",
                  f"the checking request reused {dep['verify_cached']:,} tokens",
                  f"missed the static prefix on {s['misses']} of {s['rows']} rows",
                  f"first token in {ms(s['median_warm_ms'])} ms warm against "
                  f"{ms(s['median_cold_ms'])} ms cold (median, {s['median_speedup']:.1f}×)",
                  f"greedy tokens on {s['tokens_equal']} of {s['compared']} rows")
    # the text file is the same run's words
    assert f"{s['tokens_equal']} of {s['compared']} rows gave the local cold run's tokens" in txt
    assert [r["row"] for r in run["rows"]] == list(range(2, 2 + s["rows"]))


def test_the_busy_machine_figures_are_the_stored_ones():
    b = RES["busy_machine"]
    rows = table_rows(BENCHMARKS, "| load | busy processes |")
    assert [r[0] for r in rows] == [name.replace("_", " ") for name in b["loads"]]
    for (label, busy, auto, every, ratio), (name, load) in zip(rows, b["loads"].items()):
        assert busy == str(load["busy_processes"])
        assert auto == (f"{ms(statistics.median(load['auto_ms']))} ms on "
                        f"{statistics.median(load['auto_threads']):.0f}")
        assert every == f"{ms(statistics.median(load['all_cores_ms']))} ms"
        assert ratio == f"{b['ratios'][name + '_auto_vs_all_cores']:.3f}" \
            == f"{RES['ratios'][name + '_auto_vs_all_cores']:.3f}"
    assert b["bit_identical"]
    for name in ("quiet_auto_vs_all_cores", "busy_auto_vs_all_cores"):
        verdict = "met" if RES["goals"][name]["met"] else "missed"
        assert_quoted(BENCHMARKS, f"`{name}` ≤ {RES['goals'][name]['goal'].split()[-1]}")
        assert re.search(rf"`{name}` ≤ [\d.]+[^*]*\*\*{verdict}\*\*", flat(BENCHMARKS))
    busy, quiet = b["loads"]["busy"], b["loads"]["quiet"]
    assert_quoted(README, f"took {ms(statistics.median(busy['auto_ms']))} ms on auto threads "
                          f"against {ms(statistics.median(busy['all_cores_ms']))} ms on every core",
                  f"quiet, {ms(statistics.median(quiet['auto_ms']))} against "
                  f"{ms(statistics.median(quiet['all_cores_ms']))} ms")


def test_the_scale_section_is_the_stored_one():
    """BENCHMARKS.md's real-size tables are bench/scale_report.py's rendering of the stored run,
    and the prose quotes its ratios."""
    from bench.scale_report import scale_markdown

    sc = RES["scale"]
    assert scale_markdown(sc) in BENCHMARKS
    section = flat(BENCHMARKS[BENCHMARKS.index("## Real sizes"):BENCHMARKS.index("## Hybrid")])
    runs = [r["ratios"] for r in sc["runs"] if "ratios" in r]
    for name, words in (("warm_ram_vs_limit", "{lo:.2f}–{hi:.2f} of it from the RAM tier"),
                        ("warm_file_vs_limit", "takes {lo:.2f}–{hi:.2f}x the limit"),
                        ("warm_file_vs_floor", "the same warm runs took {lo:.2f}–{hi:.2f}"),
                        ("warm_ram_vs_llamacpp_ram", "took {lo:.2f}–{hi:.2f} of LlamaRAMCache"),
                        ("warm_file_vs_llamacpp_disk", "{lo:.2f}–{hi:.2f} of LlamaDiskCache"),
                        ("warm_ram_vs_server_cache_ram", "{lo:.2f}–{hi:.2f} of its `--cache-ram`"),
                        ("warm_file_vs_server_slot_restore", "{lo:.2f}–{hi:.2f} of its slot")):
        values = [r[name] for r in runs if r.get(name) is not None]  # a run without peers
        assert words.format(lo=min(values), hi=max(values)) in section, name


def test_the_state_load_figures_are_the_stored_ones():
    """The paired load of a .kvstate, checksum after each read against the reader thread."""
    r = json.loads((ROOT / "bench" / "results-state-load.json").read_text(encoding="utf-8"))
    d, c = r["dropped"], r["cached"]
    assert_quoted(BENCHMARKS, f"a {r['bytes'] / 1e6:.0f} MB state's load took "
                              f"{d['overlapped_vs_serial']:.2f} of the serial load's time (median "
                              f"of {r['repeats']} pairs in one process, page cache dropped; "
                              f"{c['overlapped_vs_serial']:.2f} cached; load average "
                              f"{r['loadavg_before'][0]:.1f}–{r['loadavg'][0]:.1f} on {r['nproc']} cores")


def test_the_readme_quotes_the_stored_scale_runs():
    """README's "What to expect": the 8k runs' cold over warm (RAM tier) times, and the 1B's."""
    runs = {(r["model"], r["label"]): r["ours"] for r in RES["scale"]["runs"] if "ours" in r}
    text = flat(README)
    for model, words in (("smollm2-135m-32k", "{x:.0f}x sooner than a cold run's on the "
                                              "default model's shape"),
                         ("llama3.2-1b", "{x:.0f}x sooner on a model of Llama 3.2 1B's shape")):
        o = runs[(model, "8k")]
        warm = statistics.median(s["ttft_ms"] for s in o["samples"]["ram"])
        assert words.format(x=o["cold"]["ttft_ms"] / warm) in text, model
    o = runs[("llama3.2-1b", "8k")]
    cold_s = o["cold"]["ttft_ms"] / 1000
    warm_s = statistics.median(s["ttft_ms"] for s in o["samples"]["ram"]) / 1000
    assert f"({warm_s:.1f} s against {cold_s // 60:.0f} min {cold_s % 60:.0f} s)" in text


def test_the_compose_oracle_section_is_the_stored_one():
    """BENCHMARKS.md's compose-oracle table, notes and best points are
    bench/compose_oracle_report.py's rendering of the stored run; the prose's figures are its."""
    from bench.compose_oracle_report import oracle_markdown

    sec = RES["compose_oracle"]
    assert oracle_markdown(sec) in BENCHMARKS
    s = sec["summary"]
    section = flat(BENCHMARKS[BENCHMARKS.index("## Compose with a recomputed share"):
                              BENCHMARKS.index("## Batch threads on a busy machine")])
    assert f"on {s['rows']} of the 48 recurring rows" in section
    assert f"{s['full_bit_identical']} of {s['rows']} rows bit-identical" in section


def test_the_default_share_is_the_rules_pick_from_the_stored_shares():
    """BENCHMARKS.md's table of compose's shares through the engine is bench/compose_shares.py's
    rendering of bench/compose-shares.json; the default share is what the documented rule picks
    from it, and the README and the prose say that share."""
    from app.engine.runs.recompute_choice import DEFAULT_SHARE, default_recompute
    from bench.compose_shares import pick_default, shares_markdown

    data = json.loads((ROOT / "bench" / "compose-shares.json").read_text(encoding="utf-8"))
    assert shares_markdown(data) in BENCHMARKS
    assert pick_default(data["shares"]) == data["default_share"] == DEFAULT_SHARE
    assert f"the default, {default_recompute()}," in flat(README)
    assert f"Compose's default share is {default_recompute()}" in flat(BENCHMARKS)
