"""The project being worked on, as one Qt-free object: the window, the CLI and tests drive it.

A ``Session`` holds the template text (and its parse), the rows of placeholder values, the
options of runs and of the model, the prefix state in use and the typed results of runs,
benchmarks, sweeps, benchmarks on a server and the last deployment to one. Each kind of change has its own ``Event``; observers (the window's
panels, a test) connect plain callbacks and read the session when called. The session never
calls llama.cpp: jobs do, and put their results here.

Rows keep the values of every placeholder they have had, so a placeholder renamed while typing
(``<questio>`` on the way to ``<question>``) gets its values back; only the template's current
placeholders are shown and saved.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .benchmarks.bench_rows import BenchResult, bench_summary  # noqa: F401 (the window's import)
from .errors import KvPrimerError, TemplateSyntaxError
from .events import Event
from .runs.generation import GenerationConfig
from .engine_config import EngineConfig
from .states.prefix_state import PrefixState
from .state_flows import check_belongs, state_problem
from .benchmarks.prefix_sweep import SweepPoint
from .project.project_file import ProjectFile, SavedResults, read_results, result_dicts
from .runs.prompt_runs import REUSE_MODES, RunReport, check_reuse_modes
from .runs.result_origin import ResultOrigin
from .runs.recompute_choice import default_recompute
from .runs.reuse_modes import check_recompute
from .runs.server_results import DeployResult, ServerBench, ServerRow
from .prompts.chat_messages import ChatTemplate
from .prompts.rows import Row
from .prompts.template import Template


@dataclass
class SessionEvents:
    template: Event = field(default_factory=Event)  # () text, path or parse changed
    rows: Event = field(default_factory=Event)  # (RowsChange)
    selection: Event = field(default_factory=Event)  # ()
    options: Event = field(default_factory=Event)  # (Options)
    state: Event = field(default_factory=Event)  # (StateRef)
    runs: Event = field(default_factory=Event)  # (RunRecord), or (None) when cleared
    bench: Event = field(default_factory=Event)  # (BenchResult | None)
    sweep: Event = field(default_factory=Event)  # (list[SweepPoint])
    server: Event = field(default_factory=Event)  # () the server benchmark or deployment changed
    file: Event = field(default_factory=Event)  # () path or unsaved-changes flag changed
    model: Event = field(default_factory=Event)  # (ModelInfo) the engine loaded another model


@dataclass(frozen=True)
class RowsChange:
    kind: str  # "reset": rows or columns changed; "values": one cell
    row: int = -1
    name: str = ""


_GEN = GenerationConfig  # generation defaults are defined once, there


@dataclass(frozen=True)
class Options:
    """How runs and benchmarks go: the window's boxes and the CLI's options set these, and
    their defaults are the only ones (the CLI's help shows them)."""
    max_tokens: int = _GEN.max_tokens  # tokens generated per run at most
    repeat: int = 3  # benchmark repeats per row
    reuse_mode: str = "chain"  # how a warm run reuses the cache (one of REUSE_MODES)
    # compose mode: tokens of each module recomputed in context, a count of first tokens (8)
    # or a share of each module ("15%"; recompute_choice.py)
    recompute: int | str = default_recompute()
    # the reuse modes a benchmark compares: the exact ones, so that a default benchmark's
    # verdicts all read bit-identical; compose (approximate by design) is one tick away
    bench_modes: tuple[str, ...] = ("prefix", "chain")
    engine: EngineConfig = field(default_factory=EngineConfig)  # the project's model settings
    temperature: float = _GEN.temperature  # 0: greedy
    top_p: float = _GEN.top_p
    seed: int = _GEN.seed  # the sampler's seed
    # measure the model's noise floor (a third, one-shot cold evaluation) on every run, not
    # only on runs whose warm result differs from the cold one
    measure_noise: bool = False

    def generation(self) -> GenerationConfig:
        return GenerationConfig(self.max_tokens, self.temperature, self.top_p, self.seed)


@dataclass(frozen=True)
class StateRef:
    """The prefix state runs start from: in memory, and the file it came from or went to."""
    state: PrefixState | None = None
    path: str = ""
    model_sha256: str = ""  # the model's it was checked against (a llama.cpp state names none)


@dataclass(frozen=True)
class RunRecord:
    row: int  # as the rows table numbers it, from 1
    report: RunReport
    origin: ResultOrigin | None = None  # the template, model and settings that made it

    def summary(self) -> str:
        return run_summary(self.report)


def run_summary(r: RunReport) -> str:
    parts = []
    if r.cold:
        parts.append(f"cold {r.cold.ttft_ms:,.0f} ms")
    if r.warm:
        parts.append(f"warm ({r.reuse}) {r.warm.ttft_ms:,.0f} ms, reused {r.reuse_text()}")
    if r.speedup:
        parts.append(f"×{r.speedup:.1f} faster to first token")
    if r.verdict:
        parts.append(r.verdict.describe())
    return "run: " + ", ".join(parts)


class Session:
    def __init__(self, options: Options | None = None):
        self.events = SessionEvents()
        self.template_text = ""
        self.template_path = ""
        self.template: Template | None = Template.parse("")
        self.template_error: TemplateSyntaxError | None = None
        # the chat template's messages, and the rendering of them the template was given:
        # the chat API sends a row as these messages while the template is still that text
        self.chat: ChatTemplate | None = None
        self.chat_text = ""
        self.placeholders: list[str] = []
        self._rows: list[dict[str, str]] = []
        self.selection: list[int] = []  # selected row indexes, from 0
        self.current = -1  # the row the form edits
        self.options = options or Options()
        self.state_ref = StateRef()
        self.model = None  # the ModelInfo of the model the engine has loaded (set_model)
        self.runs: list[RunRecord] = []
        self.bench: BenchResult | None = None
        self.sweep: list[SweepPoint] = []
        self.server: ServerBench | None = None  # the rows run on a server (so far, while running)
        self.deployed: DeployResult | None = None  # the last deployment of the prefix to a server
        self.path = ""  # the project file, "" until saved
        self.dirty = False

    # ---- template
    def set_template(self, text: str, path: str | None = None) -> None:
        if text == self.template_text and (path is None or path == self.template_path):
            return
        changed = text != self.template_text
        self.template_text = text
        if path is not None:
            self.template_path = path
        if changed:
            try:
                self.template, self.template_error = Template.parse(text), None
            except TemplateSyntaxError as e:
                self.template, self.template_error = None, e
            if self.template is not None:
                self._set_columns(self.template.placeholders)
        self.events.template.emit()
        if changed:
            self.mark_dirty()

    def set_chat(self, chat: ChatTemplate | None, rendered: str = "") -> None:
        """The messages whose rendering (``rendered``) the template is, or None (a text
        template). Observers of the template hear of it."""
        if (chat, rendered if chat else "") == (self.chat, self.chat_text):
            return
        self.chat, self.chat_text = chat, rendered if chat else ""
        self.events.template.emit()

    def chat_template(self) -> ChatTemplate | None:
        """The messages the template is the rendering of; None when it is text (typed or
        opened as text, or changed as text since the messages were rendered)."""
        if self.chat is not None and self.chat_text == self.template_text:
            return self.chat
        return None

    def _set_columns(self, names: list[str]) -> None:
        if names == self.placeholders:
            return
        self.placeholders = list(names)
        self.events.rows.emit(RowsChange("reset"))

    # ---- rows
    @property
    def rows(self) -> list[dict[str, str]]:
        return [self.row_values(i) for i in range(len(self._rows))]

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def row_values(self, index: int) -> dict[str, str]:
        r = self._rows[index]
        return {n: r.get(n, "") for n in self.placeholders}

    def value(self, index: int, name: str) -> str:
        return self._rows[index].get(name, "")

    def set_value(self, index: int, name: str, value: str) -> None:
        if self._rows[index].get(name, "") == value:
            return
        self._rows[index][name] = value
        self.events.rows.emit(RowsChange("values", index, name))
        self.mark_dirty()

    def set_rows(self, rows: list[dict[str, str]]) -> None:
        self._rows = [{str(k): str(v) for k, v in r.items()} for r in rows]
        self._reset_rows([0] if self._rows else [], 0 if self._rows else -1)

    def add_rows(self, rows: list[dict[str, str]]) -> list[int]:
        first = len(self._rows)
        self._rows.extend({str(k): str(v) for k, v in r.items()} for r in rows)
        added = list(range(first, len(self._rows)))
        if added:
            self._reset_rows([added[-1]], added[-1])
        return added

    def remove_rows(self, indexes: list[int]) -> list[tuple[int, dict[str, str]]]:
        """Returns what was removed, (index, every value the row had), for ``insert_rows``."""
        gone = sorted({i for i in indexes if 0 <= i < len(self._rows)})
        if not gone:
            return []
        removed = [(i, dict(self._rows[i])) for i in gone]
        for i in reversed(gone):
            del self._rows[i]
        cur = min(gone[0], len(self._rows) - 1)
        self._reset_rows([cur] if cur >= 0 else [], cur)
        return removed

    def insert_rows(self, items: list[tuple[int, dict[str, str]]]) -> None:
        """Put rows back where ``remove_rows`` took them from (indexes ascending), selected."""
        for i, values in sorted(items, key=lambda x: x[0]):
            self._rows.insert(min(i, len(self._rows)), {str(k): str(v) for k, v in values.items()})
        back = [min(i, len(self._rows) - 1) for i, _ in items]
        if back:
            self._reset_rows(sorted(back), back[-1])

    def raw_rows(self) -> list[dict[str, str]]:
        """Every value of every row, the placeholders no longer in the template's too: what
        ``set_rows`` needs to give an earlier set of rows back exactly."""
        return [dict(r) for r in self._rows]

    def _reset_rows(self, selection: list[int], current: int) -> None:
        """After rows were added or removed: observers see the new rows and selection together."""
        self.selection, self.current = selection, current
        self.events.rows.emit(RowsChange("reset"))
        self.events.selection.emit()
        self.mark_dirty()

    def set_selection(self, indexes: list[int], current: int | None = None) -> None:
        sel = sorted({i for i in indexes if 0 <= i < len(self._rows)})
        cur = current if current is not None else (sel[-1] if sel else self.current)
        cur = cur if 0 <= cur < len(self._rows) else -1
        if (sel, cur) == (self.selection, self.current):
            return
        self.selection, self.current = sel, cur
        self.events.selection.emit()

    def selected_rows(self) -> list[Row]:
        """The selected rows, else the current one, numbered from 1 as the table shows them."""
        idx = self.selection or ([self.current] if self.current >= 0 else [])
        return [Row(i + 1, self.row_values(i)) for i in idx]

    def all_rows(self) -> list[Row]:
        return [Row(i + 1, self.row_values(i)) for i in range(len(self._rows))]

    # ---- options and state
    def set_options(self, *, edit: bool = True, **changes) -> None:
        """``edit=False``: not the user's change to the project (a model loaded), so no unsaved mark."""
        new = replace(self.options, **changes)
        if new != self.options:
            self.options = new
            self.events.options.emit(new)
            if edit:
                self.mark_dirty()

    @property
    def state(self) -> PrefixState | None:
        return self.state_ref.state

    def set_state(self, state: PrefixState | None, path: str = "") -> None:
        """Raises StateFileError for a state of another model than the loaded one."""
        if state is not None and self.model is not None:
            check_belongs(state, self.model)
        self.state_ref = StateRef(state, path, self.model.sha256 if self.model else "")
        self.events.state.emit(self.state_ref)

    def set_model(self, info) -> str:
        """The engine loaded ``info``'s model: a state not of it is dropped; returns why."""
        self.model, why = info, state_problem(self.state, info, self.state_ref.model_sha256)
        if why:
            self.set_state(None)
        self.events.model.emit(info)
        return why

    # ---- results
    def origin(self) -> ResultOrigin:
        """The template, model and settings a result made now comes from."""
        return ResultOrigin.of(self.template_text, self.template_path, self.model)

    def add_run(self, record: RunRecord, stamp: bool = True) -> None:
        """``stamp``: a record without an origin is of what the session shows now (not one
        read from a project saved before results had one: that origin is unknown)."""
        if record.origin is None and stamp:
            record = replace(record, origin=self.origin())
        self.runs.append(record)
        self.events.runs.emit(record)
        self.mark_dirty()

    def clear_runs(self) -> None:
        self.runs = []
        self.events.runs.emit(None)

    def set_bench(self, result: BenchResult | None, stamp: bool = True) -> None:
        if result is not None and result.origin is None and stamp:
            result.origin = self.origin()
        self.bench = result
        self.events.bench.emit(result)
        self.mark_dirty()

    def set_sweep(self, points: list[SweepPoint]) -> None:
        self.sweep = list(points)
        self.events.sweep.emit(self.sweep)
        self.mark_dirty()

    def set_server_bench(self, result: ServerBench | None) -> None:
        """A server benchmark: an empty one when it starts, its rows added as they finish."""
        self.server = result
        self.events.server.emit()
        self.mark_dirty()

    def add_server_row(self, row: ServerRow) -> None:
        if self.server is not None:
            self.server.rows.append(row)
            self.events.server.emit()
            self.mark_dirty()

    def set_deployed(self, result: DeployResult | None) -> None:
        self.deployed = result
        self.events.server.emit()
        self.mark_dirty()

    # ---- file
    def mark_dirty(self) -> None:
        if not self.dirty:
            self.dirty = True
            self.events.file.emit()

    def mark_clean(self, path: str | None = None) -> None:
        if path is not None:
            self.path = path
        self.dirty = False
        self.events.file.emit()

    def to_project(self) -> ProjectFile:
        runs = [(r.row, r.report, r.origin) for r in self.runs]
        results = result_dicts(SavedResults(runs, self.bench, self.sweep, self.server,
                                            self.deployed))
        o = self.options
        return ProjectFile(template=self.template_text, template_path=self.template_path,
                           placeholders=list(self.placeholders), rows=self.rows,
                           settings={"engine": asdict(o.engine), "max_tokens": o.max_tokens,
                                     "repeat": o.repeat, "reuse_mode": o.reuse_mode,
                                     "recompute": o.recompute, "bench_modes": list(o.bench_modes),
                                     "temperature": o.temperature, "top_p": o.top_p,
                                     "seed": o.seed, "measure_noise": o.measure_noise},
                           results=results)

    def apply_project(self, project: ProjectFile, path: str = "") -> list[str]:
        """Show a project file's content; returns problems worth telling the user (one line each)."""
        problems = []
        self.set_template(project.template, project.template_path)
        if self.template is None:  # a syntax error: keep the file's columns until it is fixed
            self._set_columns(project.placeholders)
        self.set_rows(project.rows)
        s = project.settings
        opts = {}
        try:
            for key in ("max_tokens", "repeat", "seed"):
                if key in s:
                    opts[key] = int(s[key])
            if "recompute" in s:
                opts["recompute"] = s["recompute"]
                check_recompute(s["recompute"])
            for key in ("temperature", "top_p"):
                if key in s:
                    opts[key] = float(s[key])
            if isinstance(s.get("measure_noise"), bool):
                opts["measure_noise"] = s["measure_noise"]
            if isinstance(s.get("reuse_mode"), str):
                opts["reuse_mode"], = check_reuse_modes(s["reuse_mode"], one=True)
            if isinstance(s.get("bench_modes"), list):
                opts["bench_modes"] = check_reuse_modes(s["bench_modes"])
        except (TypeError, ValueError, KvPrimerError):
            problems.append("the project's run options are unreadable; the defaults are used")
        cfg = EngineConfig.from_stored(s.get("engine"))
        if cfg is not None:
            opts["engine"] = cfg
        self.set_options(**opts)
        saved = read_results(project.results)
        if saved.unreadable:
            problems.append("the project's saved results are unreadable; run them again")
        self.clear_runs()
        for row, report, origin in saved.runs:
            self.add_run(RunRecord(row, report, origin), stamp=False)
        self.set_bench(saved.bench, stamp=False)
        self.set_sweep(saved.sweep)
        self.set_server_bench(saved.server)
        self.set_deployed(saved.deployed)
        self.mark_clean(path)
        return problems

    def clear(self) -> None:
        """An empty project (the prefix state and options stay: they belong to the model)."""
        self.set_template("", "")
        self.set_rows([])
        self.clear_runs()
        self.set_bench(None)
        self.set_sweep([])
        self.set_server_bench(None)
        self.set_deployed(None)
        self.mark_clean("")
