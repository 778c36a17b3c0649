"""A KV Primer project file (template, rows, settings, results) and its autosave, Qt-free.

A project file is UTF-8 JSON with a format number; it is the file form of the session
(app.engine.session). Saves are atomic, so a crash leaves the old file or the new one. Autosave
writes the same format to one file in the user's data folder; a clean exit deletes it, so
finding it at start means the last session ended badly and its work can be offered back.

Results are stored as plain dicts: a run as the engine's ``report_dict``, a benchmark as
``BenchResult.as_dict()``, a sweep as its points, a benchmark on a server as
``ServerBench.as_dict()`` and the last deployment to a server as its fields. Files whose run
entries hold only a summary (no ``report``) still open; those runs are skipped.
"""
from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

import numpy as np

from ..benchmarks.bench_rows import BenchResult, BenchRow
from ..errors import KvPrimerError
from ..benchmarks.prefix_sweep import SweepPoint
from ..runs.prompt_runs import PathResult, RunReport, report_dict
from ..runs.result_origin import ResultOrigin
from ..runs.server_results import DeployResult, ServerBench, ServerRow
from ..user_files import atomic_write

FORMAT = 1
SUFFIX = ".kvproj"


class ProjectFileError(KvPrimerError):
    """A project file cannot be read or written."""


@dataclass
class ProjectFile:
    template: str = ""
    template_path: str = ""
    placeholders: list[str] = field(default_factory=list)
    rows: list[dict[str, str]] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # engine config and run options
    results: list[dict] = field(default_factory=list)  # runs, benchmark and sweep, as dicts

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, name: str = "project") -> "ProjectFile":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ProjectFileError(f"{name} is not a KV Primer project (invalid JSON: {e})") from None
        except RecursionError:  # thousands of nested brackets
            raise ProjectFileError(f"{name} is not a KV Primer project (JSON nested too deeply)") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ProjectFileError(f"{name} is not a KV Primer project of format {FORMAT}; "
                                   "open a .kvproj file saved by this version")
        try:
            return cls(template=str(data.get("template", "")),
                       template_path=str(data.get("template_path", "")),
                       placeholders=[str(p) for p in data.get("placeholders", [])],
                       rows=[{str(k): str(v) for k, v in r.items()} for r in data.get("rows", [])],
                       settings=dict(data.get("settings", {})),
                       results=list(data.get("results", [])))
        except (AttributeError, TypeError, ValueError):
            raise ProjectFileError(f"{name} is corrupt: a field has the wrong type") from None

    def save(self, path: str | Path) -> None:
        atomic_write(Path(path), (self.to_json().encode("utf-8"),), ProjectFileError, "project")

    @classmethod
    def load(cls, path: str | Path) -> "ProjectFile":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProjectFileError(f"no project file at {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProjectFileError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        return cls.from_json(text, path.name)


# ---- results <-> dicts

def _dataclass_in(hint):
    """The dataclass a field holds (``X`` or ``X | None``), else None."""
    if is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if is_dataclass(a)), None)


def _build(cls, d: dict, **given):
    """A dataclass from stored data: unknown keys are ignored, nested dataclasses rebuilt, and
    fields that are never stored (arrays of logits) left empty."""
    hints = typing.get_type_hints(cls)
    kw = dict(given)
    for f in fields(cls):
        if f.name in kw:
            continue
        hint = hints[f.name]
        if f.name in d:
            v, inner = d[f.name], _dataclass_in(hint)
            kw[f.name] = _build(inner, v) if inner and isinstance(v, dict) else v
        elif f.default is MISSING and f.default_factory is MISSING:
            origin = typing.get_origin(hint) or hint
            kw[f.name] = np.zeros(0, dtype=np.float32) if origin is np.ndarray else origin()
    return cls(**kw)


def report_from_dict(d: dict) -> RunReport:
    """A RunReport from ``report_dict`` data; the logits are not stored, so they are empty."""
    given = {k: None if d.get(k) is None else _build(PathResult, d[k], mode=d[k].get("mode", k))
             for k in ("cold", "warm", "oneshot") if k in d}
    if "reused_by_source" in d:
        given["sources"] = tuple((s["source"], s["tokens"]) for s in d["reused_by_source"])
    return _build(RunReport, d, **given)


def bench_from_dict(d: dict) -> BenchResult:
    s = d["summary"]
    rows = [_build(BenchRow, row) for row in d["rows"]]
    modes = tuple(s.get("modes") or dict.fromkeys(r.reuse for r in rows) or ("prefix",))
    return BenchResult(model=d.get("model", {}), repeat=s["repeat"], rows=rows, modes=modes,
                       recompute=s.get("recompute", 0),
                       cancelled=bool(s.get("cancelled", False)),
                       origin=ResultOrigin.from_dict(d.get("origin")))


def server_from_dict(d: dict) -> ServerBench:
    return ServerBench(url=str(d.get("server", "")), api=str(d.get("api", "")),
                       flavor=str(d.get("flavor", "")), model=str(d.get("model", "")),
                       same_model=d.get("same_model"),
                       rows=[_build(ServerRow, r) for r in d["rows"]],
                       reference=str(d.get("reference", "cold")), render=d.get("render"),
                       gen_threads=_count(d.get("gen_threads")))


def _count(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


@dataclass
class SavedResults:
    """A project's results, rebuilt: runs as (row, report, origin), the rest as the session
    keeps them. A project saved before results had an origin gives None."""
    runs: list[tuple[int, RunReport, ResultOrigin | None]] = field(default_factory=list)
    bench: BenchResult | None = None
    sweep: list[SweepPoint] = field(default_factory=list)
    server: ServerBench | None = None
    deployed: DeployResult | None = None
    unreadable: bool = False  # some entry could not be read (it is left out)


def result_dicts(saved: SavedResults) -> list[dict]:
    """The ``results`` list of a project file."""
    out: list[dict] = [{"kind": "run", "row": row, "report": report_dict(rep),
                        **({"origin": origin.as_dict()} if origin else {})}
                       for row, rep, origin in saved.runs]
    if saved.bench:
        origin = saved.bench.origin
        out.append({"kind": "benchmark", **saved.bench.as_dict(),
                    **({"origin": origin.as_dict()} if origin else {})})
    if saved.sweep:
        out.append({"kind": "sweep", "points": [p.as_dict() for p in saved.sweep]})
    if saved.server:
        out.append({"kind": "server", **saved.server.as_dict()})
    if saved.deployed:
        out.append({"kind": "deploy", **asdict(saved.deployed)})
    return out


def read_results(results: list[dict]) -> SavedResults:
    """What ``result_dicts`` wrote; an entry that cannot be read is left out and flagged."""
    saved = SavedResults()
    for r in results:
        try:
            kind = r.get("kind")
            if kind == "run" and "report" in r:
                saved.runs.append((int(r["row"]), report_from_dict(r["report"]),
                                   ResultOrigin.from_dict(r.get("origin"))))
            elif kind == "benchmark":
                saved.bench = bench_from_dict(r)
            elif kind == "sweep":
                saved.sweep = [SweepPoint(**p) for p in r["points"]]
            elif kind == "server":
                saved.server = server_from_dict(r)
            elif kind == "deploy":
                saved.deployed = _build(DeployResult, r)
        except (AttributeError, KeyError, TypeError, ValueError):
            saved.unreadable = True
    return saved


# ---- autosave

def autosave_path(folder: str | Path | None = None) -> Path:
    """Where the autosave lives (the user's data folder unless a folder is given, as in tests)."""
    if folder is None:
        from platformdirs import user_data_path

        folder = user_data_path("kvprimer", appauthor=False)
    return Path(folder) / f"autosave{SUFFIX}"


class Autosaver:
    """Writes the project when asked and something changed; forgets it on a clean exit."""

    def __init__(self, path: Path):
        self.path = path
        self._last = ""

    def pending_restore(self) -> ProjectFile | None:
        """The autosaved project left by a session that did not exit cleanly, if readable."""
        if not self.path.is_file():
            return None
        try:
            return ProjectFile.load(self.path)
        except ProjectFileError:
            return None

    def write(self, project: ProjectFile) -> bool:
        text = project.to_json()
        if text == self._last:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, (text.encode("utf-8"),), ProjectFileError, "project")
        self._last = text
        return True

    def discard(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._last = ""
