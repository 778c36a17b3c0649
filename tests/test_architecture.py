"""The engine is the whole brain and imports no Qt: the CLI and the window share it."""
import ast
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "app" / "engine"
QT = ("PySide6", "PyQt5", "PyQt6", "qasync", "shiboken6", "pyqtgraph")


def test_engine_sources_import_no_qt():
    for src in ENGINE.glob("*.py"):
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
    code = ("import sys, app.engine, app.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in %r]; print(bad); "
            "sys.exit(1 if bad else 0)" % (QT,))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ENGINE.parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr
