"""Model files that are missing, not GGUF, truncated or corrupt: a ModelError, never a crash.

Found while writing these: a GGUF whose vocabulary holds the same text twice (one flipped bit
in '<0x41>', or a NUL byte that ends a token's text early, since llama.cpp reads it as a C
string) makes llama.cpp abort the process (GGML_ASSERT in llama-vocab.cpp). check_gguf_file
walks the header first and refuses it.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.engine import Engine, EngineConfig
from app.engine.errors import ModelError
from app.engine.llama.ggml_types import GGML_BLOCKS
from app.engine.llama.model_files import check_gguf_file
from app.engine.llama.native import NativeModel
from tests.tiny_model import write_unknown_arch_model
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def gguf_offsets(path: Path) -> dict[str, int]:
    import gguf

    r = gguf.GGUFReader(str(path))
    first, last = r.tensors[0], r.tensors[-1]
    return {"data": r.data_offset, "first_tensor": int(first.data_offset),
            "last_end": int(last.data_offset) + int(last.n_bytes),
            "vocab_field": int(r.fields["tokenizer.ggml.tokens"].offset)}


def test_missing_folder_and_not_gguf(tmp_path):
    with pytest.raises(ModelError, match="no model file"):
        check_gguf_file(tmp_path / "nope.gguf")
    with pytest.raises(ModelError, match="is a folder"):
        check_gguf_file(tmp_path)
    for name, raw in (("empty.gguf", b""), ("text.gguf", b"hello, I am a text file\n" * 10),
                      ("ggml.bin", b"lmgg" + bytes(100))):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ModelError, match="not a GGUF"):
            check_gguf_file(tmp_path / name)


def test_unsupported_gguf_version(tiny_model, tmp_path):
    raw = bytearray(tiny_model.read_bytes())
    raw[4] = 9
    (tmp_path / "v9.gguf").write_bytes(raw)
    with pytest.raises(ModelError, match="version 9"):
        check_gguf_file(tmp_path / "v9.gguf")


@pytest.mark.parametrize("where", ["header", "kv", "tensor_infos", "data_start", "first_tensor",
                                   "middle", "last_byte"])
def test_truncated_model_is_refused_before_llama_cpp(tiny_model, tmp_path, where):
    raw = tiny_model.read_bytes()
    o = gguf_offsets(tiny_model)
    cut = {"header": 20, "kv": o["vocab_field"] + 100, "tensor_infos": o["data"] - 200,
           "data_start": o["data"], "first_tensor": o["first_tensor"] + 1000,
           "middle": len(raw) // 2, "last_byte": o["last_end"] - 1}[where]
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(raw[:cut])
    with pytest.raises(ModelError, match="truncated|not a GGUF") as e:
        Engine(EngineConfig(model_path=str(p), n_ctx=64, n_threads=1))
    assert "\n" not in str(e.value)


def test_llama_cpp_also_refuses_truncated_tensor_data(tiny_model, tmp_path):
    # the second line of defence, should our walk of the header ever miss a case
    raw = tiny_model.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(raw[:len(raw) - 4096])
    with pytest.raises(ModelError, match="truncated"):
        check_gguf_file(p)
    with pytest.raises(ModelError, match="not within the file bounds"):
        NativeModel(p)


@pytest.mark.parametrize("old, new", [(b"<0x41>", b"<0x40>"), (b"\xe2\x96\x81are", b"\xe2\x96\x81a\x00e")])
def test_duplicate_vocabulary_entries_are_refused_not_aborted(tiny_model, tmp_path, old, new):
    raw = tiny_model.read_bytes()
    assert raw.count(old) == 1
    p = tmp_path / "dupe.gguf"
    p.write_bytes(raw.replace(old, new))
    with pytest.raises(ModelError, match="vocabulary entries .* are both"):
        Engine(EngineConfig(model_path=str(p), n_ctx=64, n_threads=1))


def test_unknown_architecture_message_quotes_llama_cpp(tmp_path):
    p = write_unknown_arch_model(tmp_path / "odd.gguf")
    with pytest.raises(ModelError, match="unknown model architecture") as e:
        Engine(EngineConfig(model_path=str(p), n_ctx=64, n_threads=1))
    assert "\n" not in str(e.value)


def test_block_table_agrees_with_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES

    known = {int(t): v for t, v in GGML_QUANT_SIZES.items()}
    assert all(known[t] == v for t, v in GGML_BLOCKS.items())


def test_header_fuzz_never_crashes_the_process(tiny_model):
    # In a subprocess, so that an abort inside llama.cpp fails this test instead of killing the
    # run. Seeded: a failure names the case, which replays with the same seed.
    code = textwrap.dedent(f"""
        import random, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from app.engine.errors import KvPrimerError
        from app.engine.llama.model_files import check_gguf_file
        from app.engine.llama.native import NativeModel
        raw = Path({str(tiny_model)!r}).read_bytes()
        rng = random.Random(1234)
        p = Path(sys.argv[1])
        outcomes = {{"loaded": 0, "refused": 0}}
        for k in range(160):
            d = bytearray(raw)
            for _ in range(rng.choice([1, 2, 4, 8])):
                i = rng.randrange(8192)
                if rng.random() < 0.5:
                    d[i] ^= 1 << rng.randrange(8)
                else:
                    d[i] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
            p.write_bytes(bytes(d))
            print("case", k, flush=True)
            try:
                check_gguf_file(p)
                m = NativeModel(p)
                m.facts(); m.control_tokens(); m.tokenize("hello world"); m.close()
                outcomes["loaded"] += 1
            except KvPrimerError as e:
                assert "\\n" not in str(e), e
                outcomes["refused"] += 1
        print(outcomes)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(tiny_model.parent / "fuzz.gguf")],
                       capture_output=True, text=True, timeout=300)
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("case")][-1:]
    assert r.returncode == 0, f"crashed at {last}: {r.stderr[-800:]}"
    assert "'refused': " in r.stdout and "'loaded': " in r.stdout


def test_fingerprint_cache_is_written_whole_and_reused(tiny_model, tmp_path, monkeypatch):
    import hashlib
    import json

    from app.engine.llama import model_files

    cache = tmp_path / "cache" / "fingerprints.json"
    monkeypatch.setattr(model_files, "_cache_file", lambda: cache)
    digest = model_files.model_fingerprint(tiny_model)
    assert digest == hashlib.sha256(Path(tiny_model).read_bytes()).hexdigest()
    assert list(json.loads(cache.read_text()).values()) == [digest]
    assert [p.name for p in cache.parent.iterdir()] == ["fingerprints.json"]  # no temp left
    cache.write_text(json.dumps({k: "cached" for k in json.loads(cache.read_text())}))
    assert model_files.model_fingerprint(tiny_model) == "cached"


def test_an_unwritable_fingerprint_cache_only_costs_time(tiny_model, tmp_path, monkeypatch):
    from app.engine.llama import model_files

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(model_files, "_cache_file", lambda: blocker / "fingerprints.json")
    assert len(model_files.model_fingerprint(tiny_model)) == 64
