"""Compose's recompute setting (a count of first tokens or a share of each module), the
selection of tokens by a signal, and the composed run it gives on the tiny model: 100% is the
cold run bit for bit, 0% is plain compose, runs in the middle of a module build the sequence
left to right; the CLI takes `15%` and `8` and refuses bad values in one line."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.engine import GenerationConfig, KvPrimerError, Template, run_prompt
from app.engine.runs import module_compose, warm_runs
from app.engine.runs.recompute_choice import (Recompute, RecomputeChoice, choose_runs,
                                              default_recompute, module_runs, parse_recompute,
                                              row_counts, row_runs, spread)

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
VALS = {"c1": "the world is a question of the answer", "c2": "hello answer of the context world",
        "question": "why?"}
GEN = GenerationConfig(max_tokens=3)


def compose(eng, recompute, **kw):
    return run_prompt(eng, TPL, VALS, reuse="compose", recompute=recompute, gen=GEN, **kw)


def module_sizes(rep) -> list[int]:
    """Each composed module's tokens: placed plus recomputed, read from the sources."""
    out = []
    for name, n in rep.sources:
        if name.startswith("module"):
            k = int(name.split("(recomputed ")[1].rstrip(")")) if "(recomputed" in name else 0
            out.append(n + k)
    return out


# ---- the setting


@pytest.mark.parametrize("given, want", [
    ("15%", Recompute(share=0.15)), ("0%", Recompute(share=0.0)), ("100%", Recompute(share=1.0)),
    ("12.5 %", Recompute(share=0.125)), ("8", Recompute(count=8)), (8, Recompute(count=8)),
    (" 0 ", Recompute(count=0))])
def test_a_setting_is_a_count_or_a_share(given, want):
    got = parse_recompute(given)
    assert got == want
    assert parse_recompute(got.text) == got  # written back as a user writes it


@pytest.mark.parametrize("bad, says", [
    ("150%", "between 0% and 100%"), ("-5%", "between 0% and 100%"),
    ("-3", "0 or more tokens"), (-3, "0 or more tokens"),
    ("abc", "a count of tokens per module (8) or a share of each module (15%)"),
    ("8.5", "a count of tokens per module"), (1.5, "a count of tokens per module")])
def test_a_bad_setting_is_one_clear_line(bad, says):
    with pytest.raises(KvPrimerError, match=r"recompute") as e:
        parse_recompute(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_share_takes_its_part_of_each_module_and_one_token_at_least():
    assert Recompute(share=0.15).tokens_of(40) == 6
    assert Recompute(share=0.15).tokens_of(3) == 1  # above 0: never nothing
    assert Recompute(share=0.0).tokens_of(40) == 0
    assert Recompute(share=1.0).tokens_of(40) == 40
    assert Recompute(count=8).tokens_of(5) == 5


# ---- the selection


def test_the_selection_picks_what_the_signal_ranks_highest_in_runs():
    scores = [0.1, 5.0, 0.3, 9.0, 8.0, 0.0, 7.0]
    assert choose_runs(scores, 4) == [(1, 2), (3, 5), (6, 7)]
    assert choose_runs(scores, 1) == [(3, 4)]
    assert choose_runs(scores, 0) == []
    assert choose_runs([1.0, 1.0, 1.0], 2) == [(0, 2)]  # ties: the earlier tokens
    # the signal in use ranks a module's first tokens highest: one run at its start
    assert module_runs(20, Recompute(share=0.25)) == [(0, 5)]
    assert module_runs(20, Recompute(count=3)) == [(0, 3)]
    assert module_runs(20, Recompute(share=0.0)) == []


def test_a_first_module_in_place_gives_its_share_to_the_later_modules():
    sizes = [40, 20, 60]
    old = [Recompute(share=0.15).tokens_of(n) for n in sizes]  # 6, 3, 9: 18 in all
    assert row_counts(sizes, Recompute(share=0.15), False) == old
    moved = row_counts(sizes, Recompute(share=0.15), True)
    assert moved[0] == 0 and sum(moved) == sum(old) and moved[1:] == [5, 13]  # 18 × 20/80, 60/80
    # a count is per module: the first one's evaluation is saved
    assert row_counts(sizes, Recompute(count=8), True) == [0, 8, 8]
    assert row_counts(sizes, Recompute(count=8), False) == [8, 8, 8]
    # at most all of the later modules; nothing asked, nothing given
    assert row_counts(sizes, Recompute(share=1.0), True) == [0, 20, 60]
    assert row_counts(sizes, Recompute(share=0.8), True) == [0, 20, 60]  # 96 asked, 80 there
    assert row_counts(sizes, Recompute(share=0.6), True) == [0, 18, 54]  # 72 of 80
    assert row_counts(sizes, Recompute(share=0.0), True) == [0, 0, 0]
    assert row_counts([30], Recompute(share=0.5), True) == [0]
    assert row_runs(sizes, Recompute(share=0.15), True) == [[], [(0, 5)], [(0, 13)]]
    # the result says what it kept and why
    assert RecomputeChoice("8", 16, 120, 2, in_place=40).describe() == (
        "recomputed 16 of 120 module tokens (13%) in context: the first 8 tokens of each later "
        "module; the first module's 40 tokens not, as it lies where it was made, right after "
        "the static prefix")
    assert RecomputeChoice("8", 16, 120, 2, in_place=40).as_dict()["in_place"] == 40


def test_a_spread_keeps_the_budget_in_proportion():
    assert spread(3, [10, 10, 10]) == [1, 1, 1]
    assert spread(2, [10, 10, 10]) == [1, 1, 0]  # ties: the earlier module
    assert spread(7, [1, 30]) == [0, 7]
    assert spread(40, [5, 10]) == [5, 10]
    assert spread(0, [5, 10]) == [0, 0]
    for budget in range(0, 31):
        got = spread(budget, [4, 9, 17])
        assert sum(got) == budget and all(0 <= k <= n for k, n in zip(got, [4, 9, 17]))


# ---- composed runs on the tiny model


def test_a_full_share_is_the_cold_run_bit_for_bit(engine):
    rep = compose(engine, "100%")
    assert rep.verdict.equivalence == "bit-identical"
    sizes = module_sizes(rep)
    # <c1> lies where its module was made: its cached cells are kept, the rest recomputed
    assert rep.reused_tokens == rep.prefix_tokens + sizes[0]
    c = rep.recompute
    assert c.module_tokens == sum(sizes) and c.tokens == sum(sizes[1:]) and c.in_place == sizes[0]
    assert c.share == sum(sizes[1:]) / sum(sizes)
    assert c.runs == 1  # no cached cell between the later modules' runs: one evaluation


def test_a_zero_share_is_plain_compose(engine):
    plain = compose(engine, 0)
    zero = compose(engine, "0%")
    assert zero.recompute.tokens == 0 and zero.recompute.runs == 0
    assert zero.recompute.in_place == 0  # nothing asked: nothing to keep from recompute
    assert zero.reused_tokens == plain.reused_tokens and zero.sources == plain.sources
    assert zero.warm.tokens == plain.warm.tokens
    assert len(zero.warm.logits) == len(plain.warm.logits) > 0
    assert all((a == b).all() for a, b in zip(zero.warm.logits, plain.warm.logits))
    assert not zero.verdict.exact  # <c2>'s module never attended to <c1>


def test_a_share_recomputes_its_part_of_each_module_and_says_why(engine):
    plain = compose(engine, 0)
    rep = compose(engine, "30%")
    sizes = module_sizes(rep)
    # <c1> lies where its module was made: <c2> takes the tokens 30% of each would
    want = [0, sum(max(1, round(0.3 * n)) for n in sizes)]
    assert len(sizes) == 2 and want[1] < sizes[1]
    c = rep.recompute
    assert c.tokens == sum(want) and c.module_tokens == sum(sizes) and c.setting == "30%"
    assert c.in_place == sizes[0]
    assert rep.reused_tokens == plain.reused_tokens - sum(want)
    assert [(name.split(" = ")[0], name.endswith(f"(recomputed {want[1]})"))
            for name, _n in rep.sources[1:]] == [("module <c1>", False), ("module <c2>", True)]
    assert c.describe() == (f"recomputed {sum(want)} of {sum(sizes)} module tokens "
                            f"({c.share:.0%}) in context: each later module's first tokens, up "
                            "to 30% of all the modules' tokens (signal first_k); the first "
                            f"module's {sizes[0]} tokens not, as it lies where it was made, "
                            "right after the static prefix")
    assert rep.verdict.note == ("composed modules never attended to each other (but the "
                                f"{sum(want)} tokens recomputed in context)")
    # closer to the cold run than plain compose: <c2>'s first cells now saw <c1>
    assert rep.verdict.kl_divergence < plain.verdict.kl_divergence


def test_the_first_module_in_place_is_kept_with_the_cold_runs_cells(engine):
    """<c1>'s module was made right after the static prefix, where the row puts it: it is not
    recomputed, and its cells in the composed row are byte for byte those of a cold run in the
    same batches (<c2>'s, made without <c1> before it, are not)."""
    compose(engine, "30%")  # builds the modules
    rep = compose(engine, "30%", cold=False)  # warm only: the work context keeps the row
    sizes = module_sizes(rep)
    p, n0, n1 = rep.prefix_tokens, sizes[0], sizes[1]
    assert rep.recompute.in_place == n0 and rep.recompute.tokens > 0
    work = engine.work
    assert work.composed_from == p + n0  # the row is a cold run's up to <c2>
    warm_c1, warm_c2 = work.cells(p, p + n0), work.cells(p + n0, p + n0 + n1)
    tokens, cuts = list(work.tokens), list(work.cuts)
    work.reset()
    end = p + n0 + n1
    work.evaluate(tokens[:end], engine.batching.replay(end, cuts), want_logits=False)
    assert work.cells(p, p + n0) == warm_c1
    assert work.cells(p + n0, end) != warm_c2


def test_a_first_module_is_in_place_only_right_after_the_static_prefix():
    from types import SimpleNamespace as NS
    from app.engine.prompts.prompt_segments import Segment
    base = list(range(10))
    prefix = NS(depth=10, tokens=lambda: base)
    row = base + [50, 51, 52, 60, 61, 70]

    def plan(reused, *starts, pre=prefix):
        mods = tuple((Segment(a, b, f"m{a}", "c"), None) for a, b in starts)
        return module_compose.ModulePlan(NS(reused=reused), pre, mods, 0.0)
    assert module_compose.first_in_place(plan(10, (10, 13), (13, 15)), row)
    # a first module after a deeper exact part, or starting elsewhere than the prefix's end
    assert not module_compose.first_in_place(plan(13, (13, 15)), row)
    assert not module_compose.first_in_place(plan(9, (9, 13)), row)
    # the static prefix's last tokens merged with the first value's: other text before it
    merged = NS(depth=10, tokens=lambda: base[:9] + [99])
    assert not module_compose.first_in_place(plan(10, (10, 13), pre=merged), row)
    assert not module_compose.first_in_place(plan(10), row)  # no module at all


def test_runs_inside_a_module_build_the_sequence_left_to_right(engine, monkeypatch):
    """A selected run in the middle of a module: its cached cells before it are placed, the
    run evaluated in context, the rest placed after it. Cutting each module in two runs that
    cover it all gives the cold run bit for bit (every token evaluated after all cells before
    it), the runs with no cached cell between them evaluated as one; one run in the middle
    recomputes exactly its tokens."""
    plain_reused = compose(engine, 0).reused_tokens

    def every_module(runs_of):  # the same runs in every module, the first one included
        return lambda sizes, _setting, _in_place: [runs_of(n) for n in sizes]
    monkeypatch.setattr(module_compose, "row_runs", every_module(lambda n: [(0, n // 2),
                                                                            (n // 2, n)]))
    whole = compose(engine, "100%")
    assert whole.verdict.equivalence == "bit-identical"
    assert whole.recompute.runs == 1 and whole.recompute.in_place == 0

    monkeypatch.setattr(module_compose, "row_runs", every_module(lambda n: [(2, 5)]))
    rep = compose(engine, "10%")
    assert rep.recompute.tokens == 3 * len(module_sizes(rep)) and rep.recompute.runs == 2
    assert rep.recompute.in_place == 0  # <c1> was recomputed in part: the count says so
    assert rep.reused_tokens == plain_reused - rep.recompute.tokens
    assert rep.verdict is not None and rep.verdict.positions > 0


TPL3 = Template.parse(TPL.source.replace("<c2>\n", "<c2>\n<c3>\n"))
VALS3 = {**VALS, "c3": "of the question the world is hello and the answer"}


class DecodeLog:
    """The work context's moves (seq_add) and decodes while a run composes and evaluates."""

    def __init__(self, eng, monkeypatch):
        ctx = eng.work.ctx
        self.shifts, self.decodes, self.rotations, self.composing = [], [], 0, False
        self._pending = False
        add, decode = ctx.seq_add, ctx.decode

        def seq_add(seq, p0, p1, delta):
            self.shifts.append((p0, p1, delta))
            self._pending = self._pending or delta != 0
            return add(seq, p0, p1, delta)

        def counted(entries):
            if self._pending:  # this decode re-rotates K across the cache first
                self.rotations += 1
                self._pending = False
            if self.composing:
                self.decodes.append(len(entries))
            return decode(entries)
        monkeypatch.setattr(ctx, "seq_add", seq_add)
        monkeypatch.setattr(ctx, "decode", counted)
        real = module_compose.compose

        def compose_logged(*a, **kw):
            self.composing = True
            try:
                return real(*a, **kw)
            finally:
                self.composing = False
        monkeypatch.setattr(warm_runs, "compose", compose_logged)


def test_each_module_moves_once_per_row_and_the_row_re_rotates_once(engine, monkeypatch):
    """Shift-once assembly: every module's cached cells are moved to their places in the row
    (one move per module that moved; <c1>, where it was made, is not recomputed), so the row's
    decodes re-rotate K once, not once per placed part; each run is one decode (runs under a
    batch), and the sequence is still built left to right."""
    for share in ("30%", "0%"):
        run_prompt(engine, TPL3, VALS3, reuse="compose", recompute=share, gen=GEN)  # modules
    log = DecodeLog(engine, monkeypatch)
    rep = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="30%", gen=GEN)
    sizes = module_sizes(rep)
    assert len(sizes) == 3 and rep.build_ms == 0
    counts = row_counts(sizes, Recompute(share=0.3), True)
    assert counts[0] == 0 and sum(counts) == sum(max(1, round(0.3 * n)) for n in sizes)
    # <c1> lies where its module was made; <c2> and <c3> move, once each, by their whole span
    assert [d for _p0, _p1, d in log.shifts] == [sizes[0], sizes[0] + sizes[1]]
    assert [p1 - p0 for p0, p1, _d in log.shifts] == [n - k for n, k in zip(sizes[1:],
                                                                           counts[1:])]
    assert log.decodes == counts[1:]  # one decode a run
    assert rep.recompute.runs == 2 and rep.recompute.tokens == sum(counts)
    assert log.rotations == 1  # the whole row, generation included
    # plain compose: the same moves, one re-rotation, no decode before the last segment
    log = DecodeLog(engine, monkeypatch)
    zero = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="0%", gen=GEN)
    assert [d for _p0, _p1, d in log.shifts] == [sizes[0], sizes[0] + sizes[1]]
    assert log.decodes == [] and log.rotations == 1 and zero.recompute.runs == 0
    # everything recomputed but <c1>: nothing moves, the later modules are one evaluation in
    # n_batch batches
    log = DecodeLog(engine, monkeypatch)
    full = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="100%", gen=GEN)
    assert log.shifts == [] and log.rotations == 0 and full.recompute.runs == 1
    rest = sum(sizes[1:])
    assert log.decodes == [min(32, rest - i) for i in range(0, rest, 32)]
    assert full.verdict.equivalence == "bit-identical"


# ---- the command line


@pytest.fixture
def cli_files(tmp_path, tiny_model):
    (tmp_path / "t.tmpl").write_text(TPL.source, encoding="utf-8")
    vals = [x for k, v in VALS.items() for x in ("--set", f"{k}={v}")]
    return (["run", str(tmp_path / "t.tmpl"), "-m", str(tiny_model), "-t", "1", "-c", "1024",
             "-b", "32", *vals, "--reuse", "compose", "--max-tokens", "2"])


@pytest.mark.parametrize("given, setting, signal", [("15%", "15%", "first_k"),
                                                    ("8", "8", "first_k")])
def test_the_cli_takes_a_share_or_a_count(cli_files, capsys, given, setting, signal):
    assert main([*cli_files, "--recompute", given, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    c = rep["recompute"]
    assert c["setting"] == setting and c["signal"] == signal and c["tokens"] > 0
    assert c["text"].startswith(f"recomputed {c['tokens']} of {c['module_tokens']} module tokens")
    assert main([*cli_files, "--recompute", given]) == 0
    assert c["text"] in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("command", ["run", "bench"])
def test_the_help_shows_the_default_setting(capsys, command):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--recompute K|P%" in text and f"({default_recompute()})" in text


@pytest.mark.parametrize("bad", ["150%", "-3", "abc"])
def test_the_cli_refuses_a_bad_share_in_one_line(cli_files, capsys, bad):
    assert main([*cli_files, "--recompute", bad]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(--recompute)" in err[0] and "Traceback" not in err[0]


def test_a_saved_run_keeps_what_it_recomputed(engine):
    """A project file stores the run as report_dict gives it and reads it back."""
    from app.engine.project.project_file import report_from_dict
    from app.engine.runs.prompt_runs import report_dict

    rep = compose(engine, "30%")
    back = report_from_dict(json.loads(json.dumps(report_dict(rep))))
    assert back.recompute == rep.recompute and back.recompute.describe() == rep.recompute.describe()
    assert report_from_dict(json.loads(json.dumps(report_dict(compose(engine, 0))))).recompute \
        == RecomputeChoice("0", 0, rep.recompute.module_tokens, 0)
