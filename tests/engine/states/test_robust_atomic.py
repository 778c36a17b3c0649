"""Saving a state or a project is atomic: kill -9 at any point of a save leaves the previous
file intact (or none), never a half-written file that loads. A full disk or a read-only folder
is an error that names the reason, and the object in memory can still be saved elsewhere.

The kill lands at a chosen point of the save by a hook in a forked child: the child patches one
call of the writer (the data write, fsync, the rename, the folder sync), tells the parent it got
there and waits; the parent kills it with SIGKILL. A few kills without a hook land anywhere.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from app.engine.errors import StateFileError
from app.engine.states.prefix_state import PrefixState
from app.engine.project.project_file import ProjectFile as Workspace, ProjectFileError as WorkspaceError

BIG = 4 << 20  # 4 MiB of KV bytes: the data write is not over in an instant


class BigWriteHook:
    """Wraps the temp file a save writes: ``on_big(file, chunk)`` runs at the first large write
    (the KV data), so a failure or a kill lands in the middle of the data."""

    def __init__(self, f, on_big):
        self.f, self.on_big, self.fired = f, on_big, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

    def write(self, chunk):
        if len(chunk) > 1 << 16 and not self.fired:
            self.fired = True
            self.on_big(self.f, chunk)
        return self.f.write(chunk)

    def __getattr__(self, name):
        return getattr(self.f, name)

def state(gen: int) -> PrefixState:
    return PrefixState(tokens=(1, 2, gen), data=bytes([gen % 256]) * BIG, model_sha256="ab" * 32,
                       model_name="tiny", type_k="f16", type_v="f16", seq_state_version=3,
                       text=f"gen {gen}")


def project(gen: int) -> Workspace:
    return Workspace(template=f"gen {gen} <v>", rows=[{"v": "x" * 1000}] * 2000)


def generation(path: Path, kind: str) -> int | None:
    """Which save the file at ``path`` holds; None if there is none. It must load whole."""
    if not path.exists():
        return None
    if kind == "state":
        s = PrefixState.load(path)  # raises on anything half-written
        assert s.data == bytes([s.tokens[2] % 256]) * BIG
        return s.tokens[2]
    return int(Workspace.load(path).template.split()[1])


def _patch_in_child(hook: str, signal_w: int) -> None:
    """Make the save stop at ``hook``: tell the parent, then block until killed."""
    block_r, _keep = os.pipe()

    def stop(*_a, **_k):
        os.write(signal_w, b"!")
        os.read(block_r, 1)  # never written: wait for SIGKILL

    if hook == "mid-write":
        real_fdopen = os.fdopen

        def half_then_stop(f, chunk):
            f.write(chunk[:len(chunk) // 2])
            f.flush()
            stop()

        os.fdopen = lambda *a, **k: BigWriteHook(real_fdopen(*a, **k), half_then_stop)
    elif hook == "before-fsync":
        os.fsync = stop
    elif hook == "before-rename":
        os.replace = stop
    elif hook == "before-folder-sync":
        real_open = os.open
        os.open = lambda p, flags, *a: stop() if flags == os.O_RDONLY else real_open(p, flags, *a)
    elif hook == "anywhere":
        os.write(signal_w, b"!")  # the parent kills at once; the save is somewhere


def kill_during_save(obj, path: Path, hook: str) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: save with the hook, then exit without cleanup
        try:
            os.close(r)
            _patch_in_child(hook, w)
            obj.save(path)
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"!" or hook == "anywhere"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)


HOOKS = ["mid-write", "before-fsync", "before-rename", "before-folder-sync", "anywhere"]


@pytest.mark.parametrize("kind", ["state", "project"])
def test_kill_9_during_save_leaves_old_file_or_none(tmp_path, kind):
    make = state if kind == "state" else project
    path = tmp_path / ("p.kvstate" if kind == "state" else "p.kvproj")
    kills = 0
    for rnd in range(3):
        for hook in HOOKS:
            gen = 10 * rnd + HOOKS.index(hook) + 1
            before = generation(path, kind)
            kill_during_save(make(gen), path, hook)
            kills += 1
            after = generation(path, kind)
            if hook == "before-folder-sync":
                assert after == gen  # renamed already: the new file, whole
            elif hook == "anywhere":
                assert after in (before, gen)
            else:
                assert after == before
            if rnd == 0 and hook == "mid-write":
                assert after is None  # nothing saved yet, and no half file at the path
            make(gen).save(path)  # the next save works
            assert generation(path, kind) == gen
    assert kills == 15
    # what a kill leaves is a hidden temp file, never the file itself
    for f in tmp_path.iterdir():
        assert f == path or (f.name.startswith(f".{path.name}.") and f.name.endswith(".tmp"))


# ---- full disk, read-only folder ----------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs, and a read-only one; skipped where mounting is not allowed."""
    full, ro = tmp_path / "small", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs; the monkeypatched tests cover the same paths")
    mounted = []
    try:
        for d, opts in ((full, "size=1m"), (ro, "size=64k,ro")):
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)],
                               capture_output=True)
            if r.returncode != 0:
                pytest.skip("cannot mount a tmpfs here")
            mounted.append(d)
        yield full, ro
    finally:
        for d in mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_full_disk_and_read_only_folder_for_real(tiny_fs):
    full, ro = tiny_fs
    small = PrefixState(tokens=(1, 2, 3), data=b"x" * 1000, model_sha256="ab" * 32, model_name="t",
                        type_k="f16", type_v="f16", seq_state_version=3)
    small.save(full / "a.kvstate")
    before = (full / "a.kvstate").read_bytes()
    big = state(7)  # 4 MiB into a 1 MiB disk
    with pytest.raises(StateFileError, match="No space left on device.*save it elsewhere"):
        big.save(full / "a.kvstate")
    assert (full / "a.kvstate").read_bytes() == before
    assert sorted(f.name for f in full.iterdir()) == ["a.kvstate"]  # the temp file is gone
    with pytest.raises(StateFileError, match="Read-only file system"):
        small.save(ro / "a.kvstate")
    with pytest.raises(WorkspaceError, match="No space left on device.*project is still in memory"):
        project(1).save(full / "p.kvproj")
    big.save(full.parent / "elsewhere.kvstate")  # still in memory: saved elsewhere
    assert PrefixState.load(full.parent / "elsewhere.kvstate") == big


def test_disk_full_in_the_middle_of_the_data(tmp_path, monkeypatch):
    p = tmp_path / "a.kvstate"
    state(1).save(p)
    real_fdopen = os.fdopen

    def fill_disk(f, chunk):
        f.write(chunk[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda *a, **k: BigWriteHook(real_fdopen(*a, **k), fill_disk))
    s2 = state(2)
    with pytest.raises(StateFileError, match="No space left on device; the state is still in memory"):
        s2.save(p)
    monkeypatch.undo()
    assert generation(p, "state") == 1
    assert [f.name for f in tmp_path.iterdir()] == ["a.kvstate"]
    s2.save(tmp_path / "b.kvstate")
    assert generation(tmp_path / "b.kvstate", "state") == 2


def test_project_files_that_are_not_projects(tmp_path):
    for raw, expect in ((b"[" * 100_000, "nested too deeply"), (b"\xff\xfe", "cannot read"),
                        (b'{"format": 1, "rows": [[1, 2]]}', "wrong type"), (b"{}", "format 1")):
        (tmp_path / "p.kvproj").write_bytes(raw)
        try:
            Workspace.load(tmp_path / "p.kvproj")
        except WorkspaceError as e:
            assert expect in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(raw[:20])
