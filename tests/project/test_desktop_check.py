"""The check for Qt's xcb libraries that runs before Qt (which would abort the process)."""
import pytest

from app import desktop_check as dc

X11 = {"DISPLAY": ":0"}
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12"\nID=debian\n'
UBUNTU = 'ID=ubuntu\nID_LIKE="debian"\n'
FEDORA = 'ID=fedora\nVERSION_ID=41\n'
ABSENT = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"}


def fresh_debian(soname: str) -> bool:
    return soname not in ABSENT


def test_missing_libraries_give_one_apt_line():
    msg = dc.xcb_problem(X11, "linux", fresh_debian, DEBIAN)
    assert "\n" not in msg
    assert "libxcb-cursor.so.0, libxcb-icccm.so.4, libxcb-keysyms.so.1" in msg
    assert msg.endswith("sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1")
    assert dc.xcb_problem(X11, "linux", fresh_debian, UBUNTU).endswith("libxcb-keysyms1")


def test_fedora_and_unknown_distributions():
    msg = dc.xcb_problem(X11, "linux", fresh_debian, FEDORA)
    assert msg.endswith("sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms")
    both = dc.xcb_problem(X11, "linux", fresh_debian, "ID=arch\n")
    assert "apt install" in both and "dnf install" in both


def test_packages_are_named_once():
    msg = dc.xcb_problem(X11, "linux", lambda s: not s.startswith("libxcb-s"), FEDORA)
    assert msg.endswith("sudo dnf install libxcb")  # shape, shm, sync: all in libxcb


@pytest.mark.parametrize("env,platform", [
    ({}, "linux"),                                              # no display: Qt fails otherwise
    ({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, "linux"),
    ({"DISPLAY": ":0", "QT_QPA_PLATFORM": "wayland"}, "linux"),
    ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, "linux"),  # Qt picks wayland
    (X11, "darwin"),
    (X11, "win32"),
])
def test_no_check_where_qt_does_not_load_xcb(env, platform):
    assert dc.xcb_problem(env, platform, lambda s: False, DEBIAN) is None


def test_xcb_chosen_explicitly_is_checked():
    env = {"DISPLAY": ":0", "QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"}
    assert dc.xcb_problem(env, "linux", fresh_debian, DEBIAN)


def test_all_present_is_no_problem():
    assert dc.xcb_problem(X11, "linux", lambda s: True, DEBIAN) is None


def test_python_m_app_exits_2_with_one_line_before_qt(monkeypatch, capsys):
    import app.__main__ as gui

    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(dc.sys, "platform", "linux")
    monkeypatch.setattr(dc, "loadable", fresh_debian)
    monkeypatch.setattr(dc, "read_os_release", lambda: DEBIAN)
    with pytest.raises(SystemExit) as e:
        gui.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvprimer-gui: error: the window needs")
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in err


def test_the_real_loader_finds_libc_and_not_nonsense():
    assert dc.loadable("libc.so.6")
    assert not dc.loadable("libkvprimer-no-such-lib.so.9")
