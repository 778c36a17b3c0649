"""What a server target gave back, kept as session results and saved in the project file like
benchmark results: a benchmark of the template's rows on a server (``ServerBench`` of
``ServerRow``), and the last deployment of the static prefix into a slot (``DeployResult``).

Plain dataclasses without the HTTP clients, so the session and the project file hold them
whether or not the server extra is installed; app.servers fills them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median


@dataclass
class ServerRow:
    row: int  # its number in the rows file, as the user sees it
    prompt_tokens: int
    prefix_tokens: int  # the template's static prefix, in this prompt's tokens
    cold_ms: float  # time to first token, cache bypassed
    warm_ms: float  # time to first token, as the workload left the cache
    server_cached_tokens: int | None
    server_evaluated_tokens: int | None
    cold_cached_tokens: int | None  # what the cold request reused: 0 when the bypass worked
    text: str
    tokens: list[int] = field(default_factory=list)
    # against KV Primer's local run (the bench's ``reference``: cold, or warm from the primed
    # prefix); None: not compared
    tokens_equal: bool | None = None
    first_diff: int | None = None  # first generated position that differs
    server_cold_equal: bool | None = None  # the server's warm output equals its own cold one
    output_note: str = ""  # why the output differs from the local cold run, when it does
    local_cold_ms: float | None = None
    miss_reason: str = ""  # empty when the server reused at least the static prefix (− 1)

    @property
    def speedup(self) -> float | None:
        return self.cold_ms / self.warm_ms if self.warm_ms > 0 else None

    def as_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup}


@dataclass
class ServerBench:
    url: str
    api: str
    flavor: str
    model: str  # how we know whether the server runs the local model
    same_model: bool | None
    rows: list[ServerRow]
    reference: str = "cold"  # the local run each row's output is compared with: cold or warm
    render: dict | None = None  # chat API: our rendering against the server's (RenderCheck)
    # the generation threads the local runs were pinned to, the server's (None: not compared)
    gen_threads: int | None = None

    def summary(self) -> dict:
        rs = self.rows
        if not rs:
            return {"rows": 0}
        compared = [r for r in rs if r.tokens_equal is not None]
        return {"rows": len(rs), "median_cold_ms": median(r.cold_ms for r in rs),
                "median_warm_ms": median(r.warm_ms for r in rs),
                "median_speedup": median(r.speedup or 0 for r in rs),
                "misses": sum(bool(r.miss_reason) for r in rs),
                "tokens_equal": sum(bool(r.tokens_equal) for r in compared),
                "compared": len(compared)}

    def describe(self) -> str:
        """One line: the medians, the misses and how many rows gave the local cold tokens."""
        s = self.summary()
        if not s["rows"]:
            return f"no rows run on {self.url}"
        same = (f"; {s['tokens_equal']} of {s['compared']} rows gave the local "
                f"{self.reference} run's tokens" if s["compared"] else "")
        threads = (f" (local runs on the server's {self.gen_threads} generation thread"
                   f"{'s' if self.gen_threads != 1 else ''})"
                   if s["compared"] and self.gen_threads else "")
        return (f"{s['rows']} rows on {self.url}: median warm {s['median_warm_ms']:.1f} ms, cold "
                f"{s['median_cold_ms']:.1f} ms (speedup {s['median_speedup']:.1f}x); "
                f"{s['misses']} of {s['rows']} rows missed the static prefix{same}{threads}")

    def as_dict(self) -> dict:
        out = {"server": self.url, "api": self.api, "flavor": self.flavor,
               "model": self.model, "same_model": self.same_model, "reference": self.reference,
               "gen_threads": self.gen_threads,
               "summary": self.summary(), "rows": [r.as_dict() for r in self.rows]}
        if self.render is not None:
            out["render"] = self.render
        return out


@dataclass(frozen=True)
class DeployResult:
    url: str
    slot: int
    path: str  # the state file in the slot directory
    prefix_tokens: int
    state_bytes: int
    restored_tokens: int
    restore_ms: float
    verify_cached: int  # what the server reused on the checking request
    verify_evaluated: int
    model: str  # how we know the server runs this model

    def describe(self) -> str:
        return (f"deployed {self.prefix_tokens:,} prefix tokens ({self.state_bytes / 1e6:.1f} MB) "
                f"to slot {self.slot} of {self.url}: restored in {self.restore_ms:.0f} ms; the next "
                f"request reused {self.verify_cached:,} and evaluated {self.verify_evaluated:,}")
