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
                                              default_recompute, module_runs, parse_recompute)

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


# ---- composed runs on the tiny model


def test_a_full_share_is_the_cold_run_bit_for_bit(engine):
    rep = compose(engine, "100%")
    assert rep.verdict.equivalence == "bit-identical"
    assert rep.reused_tokens == rep.prefix_tokens  # nothing composed is left
    c = rep.recompute
    assert c.tokens == c.module_tokens == sum(module_sizes(rep)) and c.share == 1.0
    assert c.runs == 1  # no cached cell between the modules' runs: one evaluation


def test_a_zero_share_is_plain_compose(engine):
    plain = compose(engine, 0)
    zero = compose(engine, "0%")
    assert zero.recompute.tokens == 0 and zero.recompute.runs == 0
    assert zero.reused_tokens == plain.reused_tokens and zero.sources == plain.sources
    assert zero.warm.tokens == plain.warm.tokens
    assert len(zero.warm.logits) == len(plain.warm.logits) > 0
    assert all((a == b).all() for a, b in zip(zero.warm.logits, plain.warm.logits))
    assert not zero.verdict.exact  # <c2>'s module never attended to <c1>


def test_a_share_recomputes_its_part_of_each_module_and_says_why(engine):
    plain = compose(engine, 0)
    rep = compose(engine, "30%")
    sizes = module_sizes(rep)
    want = [max(1, round(0.3 * n)) for n in sizes]
    c = rep.recompute
    assert c.tokens == sum(want) and c.module_tokens == sum(sizes) and c.setting == "30%"
    assert rep.reused_tokens == plain.reused_tokens - sum(want)
    assert [f"(recomputed {k})" in name for (name, _n), k
            in zip(rep.sources[1:], want)] == [True] * len(want)
    assert c.describe() == (f"recomputed {sum(want)} of {sum(sizes)} module tokens "
                            f"({c.share:.0%}) in context: the first 30% of each module "
                            "(signal first_k)")
    assert rep.verdict.note == ("composed modules never attended to each other (but the "
                                f"{sum(want)} tokens recomputed in context)")
    # closer to the cold run than plain compose: <c2>'s first cells now saw <c1>
    assert rep.verdict.kl_divergence < plain.verdict.kl_divergence


def test_runs_inside_a_module_build_the_sequence_left_to_right(engine, monkeypatch):
    """A selected run in the middle of a module: its cached cells before it are placed, the
    run evaluated in context, the rest placed after it. Cutting each module in two runs that
    cover it all gives the cold run bit for bit (every token evaluated after all cells before
    it), the runs with no cached cell between them evaluated as one; one run in the middle
    recomputes exactly its tokens."""
    plain_reused = compose(engine, 0).reused_tokens

    def split(n, _setting):
        return [(0, n // 2), (n // 2, n)]
    monkeypatch.setattr(module_compose, "module_runs", split)
    whole = compose(engine, "100%")
    assert whole.verdict.equivalence == "bit-identical"
    assert whole.recompute.runs == 1

    def middle(n, _setting):
        return [(2, 5)]
    monkeypatch.setattr(module_compose, "module_runs", middle)
    rep = compose(engine, "10%")
    assert rep.recompute.tokens == 3 * len(module_sizes(rep)) and rep.recompute.runs == 2
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
    """Shift-once assembly: the first module's run is evaluated in place, then every module's
    cached cells are moved to their places in the row (one move per module that moved), so the
    row's decodes re-rotate K once, not once per placed part; each run is one decode (runs
    under a batch), and the sequence is still built left to right."""
    for share in ("30%", "0%"):
        run_prompt(engine, TPL3, VALS3, reuse="compose", recompute=share, gen=GEN)  # modules
    log = DecodeLog(engine, monkeypatch)
    rep = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="30%", gen=GEN)
    sizes = module_sizes(rep)
    assert len(sizes) == 3 and rep.build_ms == 0
    # <c1> lies where its module was made; <c2> and <c3> move, once each, by their whole span
    assert [d for _p0, _p1, d in log.shifts] == [sizes[0], sizes[0] + sizes[1]]
    assert [p1 - p0 for p0, p1, _d in log.shifts] == [n - max(1, round(0.3 * n))
                                                      for n in sizes[1:]]
    assert log.decodes == [max(1, round(0.3 * n)) for n in sizes]  # one decode a run
    assert rep.recompute.runs == 3
    assert log.rotations == 1  # the whole row, generation included
    # plain compose: the same moves, one re-rotation, no decode before the last segment
    log = DecodeLog(engine, monkeypatch)
    zero = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="0%", gen=GEN)
    assert [d for _p0, _p1, d in log.shifts] == [sizes[0], sizes[0] + sizes[1]]
    assert log.decodes == [] and log.rotations == 1 and zero.recompute.runs == 0
    # everything recomputed: nothing moves, the modules are one evaluation in n_batch batches
    log = DecodeLog(engine, monkeypatch)
    full = run_prompt(engine, TPL3, VALS3, reuse="compose", recompute="100%", gen=GEN)
    assert log.shifts == [] and log.rotations == 0 and full.recompute.runs == 1
    assert log.decodes == [min(32, sum(sizes) - i) for i in range(0, sum(sizes), 32)]
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
