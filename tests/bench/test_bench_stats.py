"""The bench's maths: medians, pairwise ratios, fixed-cost ratios and goal verdicts (no timing)."""
import pytest

from bench.ratios import (GOALS, compose_accuracy, compute_ratios, compute_reuse_ratios,
                          mode_vs_prefix)
from bench.stats import goal_met, pairwise_ratio, summary


def test_summary_median_min_max():
    assert summary([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert summary([])["median"] is None


def test_pairwise_ratio_is_median_of_per_repeat_ratios_not_ratio_of_medians():
    a = [10.0, 20.0, 90.0]
    b = [5.0, 40.0, 30.0]  # per-repeat ratios 2, 0.5, 3 -> median 2
    assert pairwise_ratio(a, b) == 2.0
    assert pairwise_ratio(a, b) != summary(a)["median"] / summary(b)["median"]


def test_pairwise_ratio_needs_paired_lists():
    with pytest.raises(ValueError):
        pairwise_ratio([1.0], [1.0, 2.0])
    assert pairwise_ratio([1.0], [0.0]) is None


def test_fixed_cost_ratio_uses_load_and_restore_only():
    # the whole runs take about as long; the caches' own costs differ 4x
    s = lambda ms, load, restore: {"row": 1, "ms": ms, "evaluated": 5, "load_ms": load,  # noqa
                                   "restore_ms": restore}
    res = {"paths": {"warm_memory": [s(500, 0, 10)], "llamacpp_ram": [s(530, 40, 0)],
                     "warm_file": [s(600, 30, 10)], "llamacpp_disk": [s(660, 160, 0)]}, "sizes": {}}
    ratios, _ = compute_ratios(res)
    assert ratios["restore_cost_vs_llamacpp_ram"] == 0.25
    assert ratios["restore_cost_vs_llamacpp_disk"] == 0.25


def test_goal_met_is_an_upper_bound():
    assert goal_met(1.05, 1.05) is True
    assert goal_met(1.06, 1.05) is False
    assert goal_met(None, 1.05) is None


def _samples(ms, row=1):
    return [{"row": row, "ms": m, "evaluated": 5, "restore_ms": 0.0, "load_ms": 0.0} for m in ms]


def test_compute_ratios_names_and_goals():
    res = {
        "paths": {"cold": _samples([1000, 1100]), "limit": _samples([100, 100]),
                  "warm_in_place": _samples([104, 110]), "warm_memory": _samples([120, 130]),
                  "warm_file": _samples([120, 130]), "limit_cache_context": _samples([400, 400]),
                  "llamacpp_ram": _samples([200, 220]), "llamacpp_disk": _samples([400, 500])},
        "sizes": {"state_file_bytes": 1010, "raw_kv_bytes": 1000,
                  "llamacpp_ram_entry_bytes": 2020, "llamacpp_disk_entry_bytes": 2525},
    }
    ratios, goals = compute_ratios(res)
    assert ratios["warm_vs_fastest_limit"] == pytest.approx((1.04 + 1.10) / 2)
    assert ratios["warm_copy_vs_fastest_limit"] == pytest.approx((1.2 + 1.3) / 2)
    assert ratios["warm_vs_limit"] == pytest.approx((0.3 + 0.325) / 2)  # the old limit
    assert ratios["warm_vs_llamacpp_ram"] == pytest.approx((0.6 + 130 / 220) / 2)
    assert goals["warm_vs_fastest_limit"]["met"] is False
    assert ratios["state_bytes_vs_raw_kv"] == pytest.approx(1.01)
    assert ratios["state_bytes_vs_llamacpp_ram_entry"] == pytest.approx(0.5)
    assert goals["state_bytes_vs_raw_kv"]["met"] is True
    assert goals["warm_vs_llamacpp_ram"]["met"] is True
    assert "q8_0_warm_vs_limit" not in ratios  # paths not run are not reported
    assert set(goals) <= set(GOALS)


def _row(row, reuse, warm_ms, equivalence="bit-identical", kl=0.0, top1=1.0, equal=True,
         error=None):
    return {"row": row, "reuse": reuse, "warm_ms": warm_ms, "reused_tokens": 0,
            "equivalence": equivalence,
            "kl_divergence": kl, "top1_agree": top1, "tokens_equal": equal,
            "max_logit_diff": 0.0 if equivalence == "bit-identical" else 1.5,
            "first_diff": None if equal else 2, "error": error}


def test_mode_ratios_pair_each_row_with_its_prefix_run():
    rows = [_row(2, "prefix", 400), _row(3, "prefix", 500), _row(4, "prefix", 100),
            _row(2, "chain", 400), _row(3, "chain", 250), _row(4, "chain", 30),
            _row(2, "compose", 0, error="too long")]
    # per-row ratios 1.0, 0.5, 0.3 -> median 0.5 (not 250/400 of the medians)
    assert mode_vs_prefix(rows, "chain") == 0.5
    assert mode_vs_prefix(rows, "compose") is None  # failed rows are left out
    fork = {"fork_ms": [101.0, 99.0, 100.0], "limit_ms": [100.0, 100.0, 100.0]}
    peer = [{"row": 2, "ttft_ms": 800.0}, {"row": 3, "ttft_ms": 500.0}, {"row": 4, "ttft_ms": 50.0}]
    ratios, goals = compute_reuse_ratios({"rows": rows, "warm_in_place": fork,
                                          "llamacpp_ram_native_recurring": peer})
    assert ratios["chain_vs_prefix_warm"] == 0.5
    assert ratios["warm_in_place_vs_fastest_limit_recurring"] == pytest.approx(1.0)
    assert goals["chain_vs_prefix_warm"] == {"goal": "<= 0.85", "value": 0.5, "met": True}
    assert goals["warm_in_place_vs_fastest_limit_recurring"]["met"] is True
    # per row against the (natively built) peer: chain 400/800, 250/500, 30/50 -> median 0.5
    assert ratios["chain_vs_llamacpp_ram_recurring"] == 0.5
    assert goals["chain_vs_llamacpp_ram_recurring"]["met"] is True
    assert ratios["prefix_vs_llamacpp_ram_recurring"] == pytest.approx(1.0)
    assert goals["compose_vs_prefix_warm"]["met"] is None  # not measured: no verdict


def test_peer_ratios_pair_each_mode_s_row_with_the_same_row_on_each_peer():
    rows = [_row(2, "prefix", 600), _row(3, "prefix", 500), _row(4, "prefix", 400),
            _row(5, "prefix", 800),
            _row(2, "chain", 300), _row(3, "chain", 400), _row(4, "chain", 200, error="x"),
            _row(5, "chain", 600)]
    native = [{"row": n, "ttft_ms": ms} for n, ms in ((2, 500), (3, 500), (4, 500), (5, 500))]
    server = [{"row": n, "ttft_ms": ms} for n, ms in ((2, 300), (3, 200), (5, 1000))]
    project = [{"row": 3, "ttft_ms": 400.0}]
    ratios, goals = compute_reuse_ratios({"rows": rows, "llamacpp_ram_native_recurring": native,
                                          "llama_server_recurring": server,
                                          "llamacpp_ram_recurring": project})
    # chain per row against native: 0.6, 0.8, 1.2 (row 4 failed: left out) -> 0.8
    assert ratios["chain_vs_llamacpp_ram_recurring"] == pytest.approx(0.8)
    assert goals["chain_vs_llamacpp_ram_recurring"] == {"goal": "<= 0.8", "value": 0.8,
                                                        "met": True}
    # against the server: 1.0, 2.0, 0.6 -> 1.0, on the rows the server ran
    assert ratios["chain_vs_llama_server_recurring"] == pytest.approx(1.0)
    assert goals["chain_vs_llama_server_recurring"]["goal"] == "<= 1.0"
    assert ratios["prefix_vs_llama_server_recurring"] == pytest.approx(2.0)  # 2, 2.5, 0.8
    assert ratios["chain_vs_llamacpp_ram_project_recurring"] == pytest.approx(1.0)
    assert "chain_vs_llamacpp_ram_project_recurring" not in goals  # a figure, not a goal
    assert "compose_vs_llama_server_recurring" not in ratios  # no compose rows: not reported


def test_chain_against_prefix_on_the_rows_that_reuse_only_the_static_prefix():
    def r(row, reuse, warm_ms, reused):
        return {**_row(row, reuse, warm_ms), "reused_tokens": reused}

    rows = [r(2, "prefix", 500, 1761), r(3, "prefix", 500, 1761), r(4, "prefix", 500, 1761),
            r(5, "prefix", 400, 1761),
            r(2, "chain", 520, 1761), r(3, "chain", 250, 1790), r(4, "chain", 500, 1761),
            r(5, "chain", 440, 1761)]
    ratios, goals = compute_reuse_ratios({"rows": rows})
    # rows 2, 4, 5 reuse the prefix only: 1.04, 1.0, 1.1 -> 1.04 (row 3's 0.5 is left out)
    assert ratios["chain_vs_prefix_static_rows"] == pytest.approx(1.04)
    assert goals["chain_vs_prefix_static_rows"] == {"goal": "<= 1.02", "value": pytest.approx(1.04),
                                                    "met": False}
    assert ratios["chain_vs_prefix_warm"] == pytest.approx(1.02)  # all four: .5, 1, 1.04, 1.1
    # ABBA pairs on those rows, where the section made them, give the goal's figure instead;
    # the phases' figure stays beside it
    paired, goals = compute_reuse_ratios({"rows": rows, "static_pairs": {
        "chain_ms": [510, 600, 480, 300], "prefix_ms": [500, 500, 500, 300]}})
    assert paired["chain_vs_prefix_static_rows"] == pytest.approx(1.01)  # 1.02, 1.2, .96, 1.0
    assert paired["chain_vs_prefix_static_rows_phases"] == pytest.approx(1.04)
    assert goals["chain_vs_prefix_static_rows"]["met"] is True


def test_compose_accuracy_shares_and_spread():
    rows = [_row(2, "compose", 1, "bit-identical"),
            _row(3, "compose", 1, "within-noise", kl=0.001),
            _row(4, "compose", 1, "diverged", kl=0.2, top1=0.5, equal=False),
            _row(5, "compose", 1, "diverged", kl=0.05, top1=0.75),
            _row(2, "chain", 1, "diverged", kl=9.0)]  # other modes do not count
    a = compose_accuracy(rows)
    assert a["rows"] == 4
    assert (a["bit_identical"], a["within_noise"], a["diverged"]) == (0.25, 0.25, 0.5)
    assert a["kl_median"] == pytest.approx(0.0255) and a["kl_max"] == 0.2
    assert a["top1_agree_mean"] == pytest.approx(0.8125) and a["top1_agree_min"] == 0.5
    assert a["tokens_equal"] == 0.75 and a["first_diff"] == [None, None, 2, None]
    assert compose_accuracy([]) == {"rows": 0}
