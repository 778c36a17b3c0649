"""Before Qt starts: are the system libraries of Qt's xcb (X11) platform plugin installed?

PySide6's wheels bring Qt but not these. Without them Qt aborts the process with a long
message ("Could not load the Qt platform plugin xcb ... xcb-cursor0 or libxcb-cursor0 is
needed") that names one library at a time. We look for all of them first and print one line
with the command that installs every missing one. Qt-free, so it runs before PySide6 loads.
"""
from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class SystemLib:
    soname: str
    debian: str  # Debian/Ubuntu package
    fedora: str  # Fedora package


# What PySide6 6.x's libqxcb.so and libQt6XcbQpa link against beyond Qt itself (from ldd).
XCB_LIBS = (
    SystemLib("libxcb.so.1", "libxcb1", "libxcb"),
    SystemLib("libX11-xcb.so.1", "libx11-xcb1", "libX11-xcb"),
    SystemLib("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"),
    SystemLib("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
    SystemLib("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
    SystemLib("libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
    SystemLib("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
    SystemLib("libxcb-util.so.1", "libxcb-util1", "xcb-util"),
    SystemLib("libxcb-randr.so.0", "libxcb-randr0", "libxcb"),
    SystemLib("libxcb-render.so.0", "libxcb-render0", "libxcb"),
    SystemLib("libxcb-shape.so.0", "libxcb-shape0", "libxcb"),
    SystemLib("libxcb-shm.so.0", "libxcb-shm0", "libxcb"),
    SystemLib("libxcb-sync.so.1", "libxcb-sync1", "libxcb"),
    SystemLib("libxcb-xfixes.so.0", "libxcb-xfixes0", "libxcb"),
    SystemLib("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
    SystemLib("libxkbcommon.so.0", "libxkbcommon0", "libxkbcommon"),
    SystemLib("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
    SystemLib("libGL.so.1", "libgl1", "libglvnd-glx"),
    SystemLib("libEGL.so.1", "libegl1", "libglvnd-egl"),
)


def loadable(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname`` (as Qt's plugin would)."""
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return False


def uses_xcb(env: Mapping[str, str], platform: str) -> bool:
    """Whether Qt will load its xcb plugin: Linux, an X display, and no other platform chosen
    (on a Wayland session Qt picks its wayland plugin when none is set)."""
    if not platform.startswith("linux") or not env.get("DISPLAY"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(":")[0].split(";")[0] == "xcb"
    return not env.get("WAYLAND_DISPLAY")


def missing_xcb_libs(find: Callable[[str], bool]) -> list[SystemLib]:
    return [lib for lib in XCB_LIBS if not find(lib.soname)]


def distro_family(os_release: str) -> str:
    """"debian", "fedora" or "" from the text of /etc/os-release."""
    ids: list[str] = []
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids += value.strip().strip('"').lower().split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "debian"
    if any(i in ("fedora", "rhel", "centos") for i in ids):
        return "fedora"
    return ""


def install_hint(missing: list[SystemLib], family: str) -> str:
    apt = "sudo apt install " + " ".join(dict.fromkeys(lib.debian for lib in missing))
    dnf = "sudo dnf install " + " ".join(dict.fromkeys(lib.fedora for lib in missing))
    if family == "debian":
        return apt
    if family == "fedora":
        return dnf
    return f"{apt} (Debian/Ubuntu) or {dnf} (Fedora)"


def read_os_release() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def xcb_problem(env: Mapping[str, str] | None = None, platform: str | None = None,
                find: Callable[[str], bool] | None = None,
                os_release: str | None = None) -> str | None:
    """One line saying which libraries are missing and how to install them, or None."""
    env = os.environ if env is None else env
    if not uses_xcb(env, sys.platform if platform is None else platform):
        return None
    missing = missing_xcb_libs(find or loadable)
    if not missing:
        return None
    if os_release is None:
        os_release = read_os_release()
    names = ", ".join(lib.soname for lib in missing)
    return (f"the window needs system libraries that are missing ({names}); install them with: "
            f"{install_hint(missing, distro_family(os_release))}")


def exit_if_xcb_libs_missing() -> None:
    """Print the one-line problem and exit 2 before Qt would abort; return when all is well."""
    problem = xcb_problem()
    if problem:
        print(f"kvprimer-gui: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
