"""Soak: many warm runs back to back on the tiny model, with resident memory (RSS) watched.

A leaked llama batch, context, sampler or state copy per run shows as RSS that keeps growing;
a flat line means every native object a run makes is freed. `python -m bench.soak` runs 1,000
warm runs and prints RSS at the start (after a short warm-up) and at the end; the test suite
runs a short version (tests/bench/test_robust_soak.py).

How much RSS grows in all depends on the machine: glibc makes more arenas on more cores, other
allocators keep other caches, and RSS moves in pages of 4 to 64 KiB. What does not is the
leak's signature: a leak grows RSS in every stretch of runs, a cache or an arena in a few.
So the verdict is ``leak_rate``, the median growth per run over stretches of ``every`` runs, and
it is judged against what a run handles (``leak_bound``), not against a number of MiB.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATE = ("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
            + "hello world of the answer and question. " * 8
            + "\n<c>\n<|im_end|>\n<|im_start|>user\n<q><|im_end|>\n")


# a leak of a quarter of one run's state copy per run fails; stretches of `every` runs make the
# bound at least LARGEST_PAGE a stretch, so a page-sized step is never mistaken for a leak
LEAK_FRACTION = 4
LARGEST_PAGE = 64 << 10


def leak_rate(points: list[tuple[int, int]]) -> float:
    """Bytes per unit of work (a run, a view drawn) by which RSS keeps growing, from points
    (work done, RSS): the median over consecutive points of their growth per unit. One-off
    growth (an arena, a cache filling up) moves fewer than half the stretches and so not the
    median; a leak moves all of them."""
    steps = [(rb - ra) / (ub - ua) for (ua, ra), (ub, rb) in zip(points, points[1:]) if ub > ua]
    return statistics.median(steps) if steps else 0.0


def leak_bound(unit_bytes: int) -> float:
    """The largest leak rate that passes: a fraction of what one unit of work handles (a
    run's state, a view's cell map)."""
    return unit_bytes / LEAK_FRACTION


def stretch_for(bound: float) -> int:
    """Units of work between samples, so that a leak ``bound`` (bytes a unit) covers the
    largest page a stretch."""
    return max(1, -(-LARGEST_PAGE // max(1, int(bound))))


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


@dataclass
class SoakResult:
    runs: int
    rss_start: int  # after the warm-up runs
    rss_end: int
    rss_max: int
    seconds: float
    samples: list[int] = field(default_factory=list)  # RSS every `every` runs, from the start
    every: int = 1
    state_bytes: int = 0  # the primed state a run reuses: what the leak bound is a share of

    @property
    def growth(self) -> int:
        return self.rss_end - self.rss_start

    @property
    def leak_rate(self) -> float:
        return leak_rate([(i * self.every, r) for i, r in enumerate(self.samples)])

    @property
    def leak_bound(self) -> float:
        return leak_bound(self.state_bytes)

    @property
    def leaks(self) -> bool:
        return self.leak_rate > self.leak_bound

    def line(self) -> str:
        mb = 1 / (1 << 20)
        return (f"soak: {self.runs} warm runs in {self.seconds:.1f} s; RSS start "
                f"{self.rss_start * mb:.1f} MiB, end {self.rss_end * mb:.1f} MiB, max "
                f"{self.rss_max * mb:.1f} MiB, growth {self.growth * mb:+.2f} MiB; leak rate "
                f"{self.leak_rate / 1024:+.2f} KiB a run (bound {self.leak_bound / 1024:.1f})")


def soak(runs: int = 1000, warmup: int = 20, every: int | None = None,
         model_path: str | None = None, echo=print) -> SoakResult:
    """Prime once, then ``runs`` warm runs (restore + suffix + 4 generated tokens) with values
    that change every run. Every run must give the tokens the first one gave for its values.
    RSS is sampled every ``every`` runs (default: ``stretch_for`` the state's size)."""
    from app.engine import Engine, EngineConfig, GenerationConfig, Template, run_prompt

    with tempfile.TemporaryDirectory() as tmp:
        if model_path is None:
            from tests.tiny_model import write_tiny_model

            model_path = str(write_tiny_model(Path(tmp) / "tiny.gguf"))
        tpl = Template.parse(TEMPLATE)
        gen = GenerationConfig(max_tokens=4)
        questions = ["hello?", "why?", "the answer?", "and you?"]
        with Engine(EngineConfig(model_path=model_path, n_ctx=1024, n_batch=64, n_threads=1)) as eng:
            state = eng.prime(tpl)
            every = every or stretch_for(leak_bound(state.nbytes))
            expected: dict[str, list[int]] = {}

            def one(i: int) -> None:
                q = questions[i % len(questions)]
                rep = run_prompt(eng, tpl, {"c": f"the world {i % 7}", "q": q}, state=state,
                                 cold=False, oneshot=False, gen=gen)
                key = f"{i % 7}|{q}"
                if expected.setdefault(key, rep.warm.tokens) != rep.warm.tokens:
                    raise AssertionError(f"run {i}: warm tokens changed for the same values")

            for i in range(warmup):
                one(i)
            start = rss_bytes()
            echo(f"soak: RSS at start {start / (1 << 20):.1f} MiB (after {warmup} warm-up runs)")
            samples, peak = [start], start
            t0 = time.perf_counter()
            for i in range(runs):
                one(warmup + i)
                if (i + 1) % every == 0:
                    samples.append(rss_bytes())
                    peak = max(peak, samples[-1])
            end = rss_bytes()
            result = SoakResult(runs, start, end, max(peak, end), time.perf_counter() - t0,
                                samples, every, state.nbytes)
    echo(result.line())
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--model", help="a GGUF model (default: a generated tiny model)")
    args = ap.parse_args(argv)
    res = soak(args.runs, model_path=args.model)
    return 1 if res.leaks else 0  # RSS kept growing by more than leak_bound a run


if __name__ == "__main__":
    sys.exit(main())
