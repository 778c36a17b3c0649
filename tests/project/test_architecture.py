"""The engine is the whole brain and imports no Qt: the CLI and the window share it. No import
cycle in app/ or bench/, the engine's packages in a strict stack, bench/ without Qt at import."""
import ast
import subprocess
import sys
from pathlib import Path
from tests.paths import REPO_ROOT

ENGINE = REPO_ROOT / "app" / "engine"
QT = ("PySide6", "PyQt5", "PyQt6", "qasync", "shiboken6", "pyqtgraph")


SERVERS = ENGINE.parent / "servers"


def test_engine_and_server_sources_import_no_qt():
    for src in [*ENGINE.rglob("*.py"), *SERVERS.rglob("*.py")]:
        tree = ast.parse(src.read_text(), filename=str(src))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in QT, f"{src.name} imports {n}"


def test_importing_engine_and_cli_loads_no_qt():
    code = ("import sys, app.engine, app.cli, app.servers.deploy, app.servers.server_bench, app.servers.server_flows; "
            "bad = [m for m in sys.modules if m.split('.')[0] in %r]; print(bad); "
            "sys.exit(1 if bad else 0)" % (QT,))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ENGINE.parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- the shape of the code: no import cycle, packages in layers -------------------------------

ROOT = ENGINE.parent.parent
PACKAGES = ("app", "bench")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for src in (ROOT / pkg).rglob("*.py"):
            parts = list(src.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = src
    return mods


def _imports(name: str, src: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its source (lazy and type-only imports
    included: a cycle through them is still two modules that cannot be understood apart)."""
    is_pkg = src.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(src.read_text(), filename=str(src))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module
                       for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in mods and t != name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_import_graph_sees_relative_and_lazy_imports():
    mods = _modules()
    graph = {m: _imports(m, src, mods) for m, src in mods.items()}
    assert "app.engine.llama.native" in graph["app.engine.kv_engine"]  # from .native import ...
    assert "app.cli.parser" in graph["app.cli"]  # from .parser import ... in a package
    assert "app.engine" in graph["app.cli.run_commands"]  # from ..engine import ...
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_app_or_bench():
    mods = _modules()
    graph = {m: _imports(m, src, mods) for m, src in mods.items()}
    cycles = _cycles(graph)
    assert cycles == [], "modules that import each other (directly or round a circle): " + "; ".join(
        " <-> ".join(c) for c in cycles)


# ---- the engine's packages in a strict stack -----------------------------------------------------

# bottom to top (see test_engine_packages_import_only_layers_below_them)
ENGINE_LAYERS = ("base", "llama", "states", "prompts", "kv", "cache", "slot", "runs", "benchmarks",
                 "project", "facade")
BASE_MODULES = {"errors", "byte_sizes", "task_state", "progress_plan", "events", "user_files"}
# modules of app/ outside the engine that import nothing else of app/, so the engine may use them
STANDALONE = {"app.cpu_backends", "app.crash_probe_child"}

def _layer(module: str) -> str:
    """The layer of an app.engine module: its package's, or for a module of app/engine itself
    base when listed, the facade otherwise."""
    parts = module.split(".")
    if len(parts) == 2:
        return "facade"  # app.engine's __init__
    name = parts[2]
    if len(parts) > 3 or (ENGINE / name).is_dir():
        assert name in ENGINE_LAYERS, f"app.engine.{name} is in no layer: place it in ENGINE_LAYERS"
        return name
    return "base" if name in BASE_MODULES else "facade"


def _where(module: str) -> str:
    return _layer(module) if module.startswith("app.engine") else "outside the engine"


def _against_the_stack(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    rank = {name: i for i, name in enumerate(ENGINE_LAYERS)}
    bad = set()
    for mod, targets in graph.items():
        if not mod.startswith("app.engine"):
            continue
        for t in targets:
            if t.startswith("app.engine"):
                if rank[_layer(t)] > rank[_layer(mod)]:
                    bad.add((mod, t))
            elif t.startswith("app.") and t not in STANDALONE:
                bad.add((mod, t))
    return bad


def test_the_layer_check_sees_an_import_from_below_of_a_layer_above():
    graph = {"app.engine.llama.native": {"app.engine.states.seq_payload", "app.engine.errors"},
             "app.engine.runs.forked_runs": {"app.engine.kv_engine", "app.engine.slot.run_slot"},
             "app.engine.cache.radix_cache": {"app.ui.kv_map", "app.cpu_backends"},
             "app.engine.user_files": {"app.engine.errors"}}
    assert _against_the_stack(graph) == {
        ("app.engine.llama.native", "app.engine.states.seq_payload"),
        ("app.engine.runs.forked_runs", "app.engine.kv_engine"),
        ("app.engine.cache.radix_cache", "app.ui.kv_map")}


def test_engine_packages_import_only_layers_below_them():
    """The engine's packages in layers, bottom to top; a module imports only modules of its own
    layer or of layers below it:
    - base: the engine's vocabulary, importing nothing else of it: errors, sizes in words, a job's
      progress and cancel, change events, and reading and saving the user's files atomically.
    - llama: talking to llama.cpp (model, context, decoding, the batch policy and the one feeding
      loop, kernels, memory); everything that evaluates sits above it.
    - states: llama.cpp's sequence state bytes and the two state file formats; they read llama's
      type tables, and the cache, the slot and the runs read and write them.
    - prompts: templates, rows and tokens; they need only the model's tokenizer, so they sit low
      and every run and flow above can fill and tokenize a prompt.
    - kv: what the cache context's cells hold (the one owner of its sequences, the cell map).
    - cache: the radix cache over kv; it hands cells out and takes them back.
    - slot: where a run evaluates (the work context or a forked sequence), over the cache.
    - runs: a run warm and cold, its verdict, compose, forked runs, over a slot and the cache.
    - benchmarks: many runs, measured and compared.
    - project: results and persistence, the project file that keeps runs and benchmarks.
    - facade: the rest of the engine's own modules (kv_engine, session, the flows, the config):
      what the window and the CLI call.
    Outside itself the engine imports only modules of app/ that stand alone (``STANDALONE``).
    """
    mods = _modules()
    graph = {m: _imports(m, src, mods) for m, src in mods.items()}
    bad = _against_the_stack(graph)
    new = sorted(bad)
    assert new == [], "imports of a layer above (move the module, or pass what it needs in):\n" + \
        "\n".join(f"{a} ({_layer(a)}) -> {b} ({_where(b)})" for a, b in new)
    for mod in STANDALONE:
        assert graph[mod] <= STANDALONE, f"{mod} imports more of app/ than {STANDALONE}"


def test_bench_loads_the_window_code_only_for_its_gui_measure():
    """bench/ runs without Qt: only the function that measures the window's stalls imports app.ui."""
    for src in (ROOT / "bench").rglob("*.py"):
        tree = ast.parse(src.read_text(), filename=str(src))
        for node in tree.body:  # module level: runs on import
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith("app.ui") and n.split(".")[0] not in QT, f"{src.name} imports {n}"


def test_the_cache_never_calls_the_engine_back():
    """The engine calls the cache; the cache gets the parts it uses once (engine_access.py) and
    holds no engine to call back into."""
    for src in (ENGINE / "cache").glob("*.py"):
        for node in ast.walk(ast.parse(src.read_text(), filename=str(src))):
            if isinstance(node, ast.arg):
                assert node.arg not in ("engine", "eng"), f"{src.name} takes the engine"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("e", "_e", "engine", "_engine"), \
                    f"{src.name}:{node.lineno} holds the engine (.{node.attr})"


def test_the_windows_flows_go_through_the_engines():
    """The KV dock, the KV grid, state loading, paste and export call the engine's flows
    (kv_flows, state_flows, prompts/rows, benchmarks/bench_export): no view walks the cache tree,
    decides which sequence it may change, loads a state file, parses rows or writes CSV itself."""
    reaches = ("cache.tree", "check_user_sequence", "load_any_state", ".keep_only(",
               ".cache.clear(", "seqs.clear(", "seqs.trim(", "seqs.shift(", "seqs.divide(",
               "seqs.fork", "import csv", "set_state(None)", "cache.evict(", "cache.pin(")
    for src in (ROOT / "app" / "ui").rglob("*.py"):
        text = src.read_text()
        found = [r for r in reaches if r in text]
        assert not found, f"{src.name} does itself what an engine flow does: {found}"


def test_one_owner_changes_what_the_cache_contexts_sequences_hold():
    """Every change of the cache context's sequences (their cells and their tokens) goes
    through kv/sequence_ops.py: nothing else calls that context's seq_* / state_set / clear /
    decode or changes ``seq_tokens`` (the work context, the cold reference and the kernel
    measurement have contexts of their own)."""
    import re

    ops = r"\.(?:seq_rm|seq_cp|seq_keep|seq_add|seq_div|state_set|decode|clear)\("
    cache_ctx = re.compile(r"\b(?:engine|eng|e|parts)\.ctx" + ops)
    own_ctx = re.compile(r"\bself\.ctx" + ops)  # in the engine, self.ctx is the cache's
    tokens = re.compile(r"\bseq_tokens\.(?:set|extend|clear|clear_all|keep_only|truncate|trim|"
                        r"copy|moved_from)\(")
    owner = {ENGINE / "kv" / "sequence_ops.py", ENGINE / "kv" / "kv_debug_log.py"}
    bad = []
    for src in (ROOT / "app").rglob("*.py"):
        if src in owner:
            continue
        for i, line in enumerate(src.read_text().splitlines(), 1):
            if cache_ctx.search(line) or tokens.search(line) or (
                    src.name == "kv_engine.py" and own_ctx.search(line)):
                bad.append(f"{src.relative_to(ROOT)}:{i}: {line.strip()}")
    assert bad == [], "changes of the cache's sequences outside SequenceOps:\n" + "\n".join(bad)


def test_tests_live_in_folders_that_mirror_the_code():
    """No test module at tests/'s top level: each sits in the folder of the code it tests, and
    every folder of tests/engine names a package of app/engine."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    for folder in (tests / "engine").iterdir():
        if folder.is_dir() and folder.name != "__pycache__":
            assert (ENGINE / folder.name).is_dir(), f"tests/engine/{folder.name} mirrors no package"
