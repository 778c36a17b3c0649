import os

import pytest

from app.engine.errors import StateFileError
from app.engine.states.prefix_state import PrefixState


def make(**kw):
    base = dict(tokens=(1, 2, 3, 70000), data=bytes(range(256)) * 4, model_sha256="ab" * 32,
                model_name="tiny", type_k="f16", type_v="f16", seq_state_version=3,
                template_sha256="cd" * 32, text="prefix")
    base.update(kw)
    return PrefixState(**base)


def test_round_trip(tmp_path):
    s = make()
    p = tmp_path / "a.kvstate"
    size = s.save(p)
    assert size == p.stat().st_size
    back = PrefixState.load(p)
    assert back == s


def test_truncated_and_extended_and_bitflip(tmp_path):
    p = tmp_path / "a.kvstate"
    make().save(p)
    raw = p.read_bytes()
    p.write_bytes(raw[:-10])
    with pytest.raises(StateFileError, match="truncated"):
        PrefixState.load(p)
    p.write_bytes(raw + b"xx")
    with pytest.raises(StateFileError, match="longer"):
        PrefixState.load(p)
    flipped = bytearray(raw)
    flipped[-5] ^= 1
    p.write_bytes(bytes(flipped))
    with pytest.raises(StateFileError, match="checksum"):
        PrefixState.load(p)


def test_wrong_magic_and_version(tmp_path):
    p = tmp_path / "a.kvstate"
    make().save(p)
    raw = bytearray(p.read_bytes())
    p.write_bytes(b"GGSQ" + bytes(raw[4:]))
    with pytest.raises(StateFileError, match="magic"):
        PrefixState.load(p)
    raw[8] = 9
    p.write_bytes(bytes(raw))
    with pytest.raises(StateFileError, match="version 9"):
        PrefixState.load(p)


def test_a_version_1_file_with_its_sha256_still_loads_and_its_corruption_shows(tmp_path):
    import hashlib
    import struct
    p = tmp_path / "a.kvstate"
    s = make()
    s.save(p)
    raw = p.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 2
    body = raw[56:]  # meta + tokens + data: what both versions check
    old = raw[:8] + struct.pack("<I", 1) + raw[12:24] + hashlib.sha256(body).digest() + body
    p.write_bytes(old)
    assert PrefixState.load(p) == s
    p.write_bytes(old[:-1] + bytes([old[-1] ^ 1]))
    with pytest.raises(StateFileError, match="checksum"):
        PrefixState.load(p)


def test_missing_empty_and_folder(tmp_path):
    with pytest.raises(StateFileError, match="no state file"):
        PrefixState.load(tmp_path / "nope.kvstate")
    (tmp_path / "e.kvstate").write_bytes(b"")
    with pytest.raises(StateFileError, match="truncated"):
        PrefixState.load(tmp_path / "e.kvstate")
    with pytest.raises(StateFileError, match="folder"):
        PrefixState.load(tmp_path)


def test_compatibility_messages_name_what_differs():
    s = make()
    with pytest.raises(StateFileError, match="another model"):
        s.check_compatible("00" * 32, "f16", "f16", 3, 4096)
    with pytest.raises(StateFileError, match="KV types f16/f16.*q8_0/q8_0"):
        s.check_compatible(s.model_sha256, "q8_0", "q8_0", 3, 4096)
    with pytest.raises(StateFileError, match="seq-state version 3"):
        s.check_compatible(s.model_sha256, "f16", "f16", 4, 4096)
    with pytest.raises(StateFileError, match="context has 4 cells"):
        s.check_compatible(s.model_sha256, "f16", "f16", 3, 4)
    s.check_compatible(s.model_sha256, "f16", "f16", 3, 4096)


def test_save_into_missing_folder_and_read_only_folder(tmp_path, monkeypatch):
    with pytest.raises(StateFileError, match="does not exist"):
        make().save(tmp_path / "no" / "a.kvstate")
    import tempfile

    def denied(*a, **k):  # what a read-only folder gives (tests run as root, so simulate it)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(StateFileError, match="cannot save.*Permission denied"):
        make().save(tmp_path / "a.kvstate")


def test_failed_save_keeps_previous_file(tmp_path, monkeypatch):
    p = tmp_path / "a.kvstate"
    make().save(p)
    before = p.read_bytes()

    def boom(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(StateFileError, match="No space left"):
        make(text="new").save(p)
    assert p.read_bytes() == before
    assert [f.name for f in tmp_path.iterdir()] == ["a.kvstate"]


def test_temp_files_of_killed_saves_are_cleaned_up_but_live_ones_kept(tmp_path):
    import time

    from app.engine.user_files import STALE_TEMP_S
    stale = tmp_path / ".a.kvstate.abc123.tmp"
    live = tmp_path / ".a.kvstate.def456.tmp"
    other = tmp_path / ".b.kvstate.xyz.tmp"
    for f in (stale, live, other):
        f.write_bytes(b"half")
    old = time.time() - STALE_TEMP_S - 5
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    s = make()
    s.save(tmp_path / "a.kvstate")
    assert not stale.exists() and live.exists() and other.exists()
    assert PrefixState.load(tmp_path / "a.kvstate") == s
