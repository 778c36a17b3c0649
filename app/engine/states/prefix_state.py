"""One sequence's saved KV state, and its ``.kvstate`` file format.

The file is ours, not llama.cpp's 'ggsq' file, because that one carries no model identity and
no KV type: loading it under another model fails late or not at all. Layout (little endian)::

    0   8   magic  b"KVPSTATE"
    8   4   format version (u32)
    12  4   meta length M (u32, at most 64 KiB)
    16  8   body length B (u64)
    24  32  checksum of meta + body: XXH3-128 then 16 zero bytes (version 2), SHA-256 (1)
    56  M   meta: UTF-8 JSON (model fingerprint, KV types, llama.cpp's seq-state version, ...)
    56+M B  body: the token ids (int32 each), then llama_state_seq_get_data's bytes

llama_state_file.py reads llama.cpp's own per-sequence file into a PrefixState with
``origin == "llama.cpp"`` and no model identity; ``Engine.load_state`` takes either file.

Every field is checked before any byte reaches llama.cpp; llama.cpp's seq-state version in the
meta first (seq_state_layout.py reads one version: another is refused in one line). The checksum runs on every load, so
it is XXH3-128 (about 13 ms for a 40 MB state here, SHA-256 about 100 ms): it guards against
truncation and corruption, not tampering. Version 1 files (SHA-256) are still read. Writes are atomic: a temp file in the
same folder, fsync, then rename, so a crash leaves the old file or none, never half of one.

A file wholly in the page cache is loaded through a mapping instead (mapped_state.py, from
``state_flows.load_state``): its cells go from the cached pages into the work context while a
thread copies and checksums them; ``read_head`` and ``from_file_parts`` are shared with it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ..errors import StateFileError, StateFitError
from ..llama.ggml_types import KV_TYPES
from ..user_files import atomic_write, open_user_file
from .body_buffer import read_body
from .seq_payload import check_seq_payload
from .seq_state_layout import check_version

MAGIC = b"KVPSTATE"
FORMAT_VERSION = 2  # the version written
_CHECKSUMS = {1: hashlib.sha256, 2: xxhash.xxh3_128}  # the versions read, by their checksum
_HEADER = struct.Struct("<8sIIQ32s")
MAX_META = 64 * 1024
SUFFIX = ".kvstate"
NO_IDENTITY_NOTE = ("llama.cpp state files carry no model identity: only token count, token ids "
                    "and row sizes were checked")


@dataclass(frozen=True)
class PrimeTiming:
    """How long the prime that made a state took to evaluate positions ``start``..``end``-1
    from scratch, and on what (``machine``: the CPU, threads, batch size and kernel). A later
    engine on the same machine takes it as a sample for its cold-run estimate, so that a run
    from a loaded state need not guess the cold run's length from its own few suffix tokens."""
    start: int
    end: int
    ms: float
    machine: str

    def as_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "ms": self.ms, "machine": self.machine}

    @classmethod
    def from_meta(cls, raw, n_tokens: int) -> "PrimeTiming | None":
        """The timing in the metadata of a file of ``n_tokens`` tokens; None when absent or
        not well-formed (older files have none: nothing depends on it)."""
        try:
            t = cls(int(raw["start"]), int(raw["end"]), float(raw["ms"]), str(raw["machine"]))
        except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: Infinity
            return None
        ok = 0 <= t.start < t.end <= n_tokens and 0 < t.ms < 1e12  # under 30 years
        return t if ok else None


@dataclass(frozen=True)
class PrefixState:
    tokens: tuple[int, ...]
    data: bytes = field(repr=False)
    model_sha256: str
    model_name: str
    type_k: str
    type_v: str
    seq_state_version: int
    template_sha256: str = ""
    created: float = field(default_factory=time.time)
    text: str = ""  # the prefix text, for people looking at the file
    # "kvprimer" (our file or a live snapshot) or "llama.cpp" (its per-sequence file, which
    # carries no model fingerprint: model_sha256 is empty and only the layout can be checked)
    origin: str = "kvprimer"
    # what was done to the state on loading ("rewritten for flash attention off"), or ''
    note: str = field(default="", compare=False)
    prime_timing: PrimeTiming | None = field(default=None, compare=False)

    def __post_init__(self):
        if not self.tokens:
            raise StateFileError("a prefix state needs at least one token")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def warning(self) -> str:
        """What the user should know before trusting this state, or ''."""
        notes = [NO_IDENTITY_NOTE] if self.origin == "llama.cpp" else []
        return "; ".join(notes + ([self.note] if self.note else []))

    @property
    def nbytes(self) -> int:
        return len(self.data) + 4 * len(self.tokens)

    def meta(self) -> dict:
        return {
            "model_sha256": self.model_sha256,
            "model_name": self.model_name,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "seq_state_version": self.seq_state_version,
            "template_sha256": self.template_sha256,
            "created": self.created,
            "n_tokens": len(self.tokens),
            "data_bytes": len(self.data),
            "text": self.text[:2000],
            **({"prime_timing": self.prime_timing.as_dict()} if self.prime_timing else {}),
        }

    def check_compatible(self, model_sha256: str, type_k: str, type_v: str, seq_state_version: int,
                         n_ctx: int) -> None:
        """Raise StateFileError naming what differs from the loaded model and context."""
        if self.origin == "llama.cpp":
            # no fingerprint to compare; its version decides how the rest is laid out
            self._check_version(seq_state_version)
        elif self.model_sha256 != model_sha256:
            raise StateFileError(
                f"this state was made with another model ({self.model_name}, fingerprint "
                f"{self.model_sha256[:12]}…); load that model or prime the prefix again"
            )
        # a llama.cpp state whose layout we cannot read has no types: check_payload says why
        if self.type_k and (self.type_k, self.type_v) != (type_k, type_v):
            raise StateFileError(
                f"this state has KV types {self.type_k}/{self.type_v} but the context uses "
                f"{type_k}/{type_v}; set the KV cache types to {self.type_k}/{self.type_v} or prime again"
            )
        self._check_version(seq_state_version)
        if self.n_tokens >= n_ctx:  # the cells it needs, and the context size that holds them
            raise StateFitError(self.n_tokens, n_ctx)

    def _check_version(self, seq_state_version: int) -> None:
        check_version(self.seq_state_version)  # a format this reader does not know
        if self.seq_state_version != seq_state_version:  # the running llama.cpp's is another
            raise StateFileError(
                f"this state is in llama.cpp's seq-state version {self.seq_state_version}, and "
                f"the llama.cpp this KV Primer runs reads version {seq_state_version}; prime "
                "the prefix again"
            )

    def check_payload(self, n_vocab: int, family: str = "attention",
                      recurrent_bytes: int = 0) -> None:
        """Raise StateFileError unless the tokens and KV bytes are safe to give llama.cpp.

        Cheap (a walk over the layout, see seq_payload); run before every restore, since a
        state may come from a file whose checksum was recomputed after tampering. A state of a
        seq-state version this reader does not know is refused before its bytes are read.
        """
        if min(self.tokens) < 0 or max(self.tokens) >= n_vocab:
            raise StateFileError(f"this state holds token ids outside this model's vocabulary of "
                                 f"{n_vocab}; it is corrupt or for another model; prime again")
        check_seq_payload(self.data, self.n_tokens, _type_ids(self.type_k, self.type_v), family,
                          recurrent_bytes, self.seq_state_version)

    # ---- file format -------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> int:
        """Write atomically; returns the file size in bytes."""
        if self.origin != "kvprimer":
            raise StateFileError("a state read from a llama.cpp file has no model identity to "
                                 "save in a .kvstate; restore it and prime again, or save it "
                                 "in llama.cpp's format")
        path = Path(path)
        meta = json.dumps(self.meta(), sort_keys=True).encode("utf-8")
        toks = array("i", self.tokens)
        if toks.itemsize != 4:  # pragma: no cover - every platform we ship has 4-byte int
            raise StateFileError("this platform's int is not 4 bytes")
        tok_bytes = toks.tobytes() if sys.byteorder == "little" else _swapped(toks)
        h = _CHECKSUMS[FORMAT_VERSION](meta)
        h.update(tok_bytes)
        h.update(self.data)
        body_len = len(tok_bytes) + len(self.data)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(meta), body_len,
                              h.digest().ljust(_HEADER.size - 24, b"\0"))
        atomic_write(path, (header, meta, tok_bytes, self.data), StateFileError, "state")
        return len(header) + len(meta) + body_len

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PrefixState":
        path = Path(path)
        f = open_user_file(path, StateFileError, "state file")
        with f:
            return cls._read(f, os.fstat(f.fileno()).st_size, path.name)

    @classmethod
    def _read(cls, f, size: int, name: str) -> "PrefixState":
        head = read_head(f, size, name)
        h = head.hasher()
        if head.sizes_ok:
            # Read tokens and KV data as two objects: slicing one body would copy 40 MB again.
            tok_bytes = f.read(head.token_bytes)
            h.update(tok_bytes)
            data = _read_hashed(f, head.meta["data_bytes"], h)
        else:
            h.update(f.read(head.body_len))
            tok_bytes = data = b""  # check_digest refuses the file
        head.check_digest(h)
        return cls.from_file_parts(head, tok_bytes, data)

    @classmethod
    def from_file_parts(cls, head: "FileHead", tok_bytes: bytes, data) -> "PrefixState":
        """The state a file's checked head, token bytes and KV data describe (their checksum
        already matched)."""
        toks = array("i")
        toks.frombytes(tok_bytes)
        if sys.byteorder != "little":  # pragma: no cover
            toks.byteswap()
        if min(toks) < 0:
            raise StateFileError(f"{head.name} is corrupt: it holds a negative token id")
        meta = head.meta
        return cls(tokens=tuple(toks), data=data, seq_state_version=meta["seq_state_version"],
                   created=meta["created"], text=meta["text"],
                   prime_timing=PrimeTiming.from_meta(meta["prime_timing"], len(toks)),
                   **meta["fields"])


@dataclass(frozen=True)
class FileHead:
    """A .kvstate's header and metadata, checked against the file's size (``read_head``)."""
    name: str
    version: int
    meta_raw: bytes
    meta: dict | None  # None: unreadable (the checksum says first whether it is corrupt)
    body_len: int
    digest: bytes

    @property
    def sizes_ok(self) -> bool:
        m = self.meta
        return m is not None and m["n_tokens"] > 0 and \
            m["n_tokens"] * 4 + m["data_bytes"] == self.body_len

    @property
    def token_bytes(self) -> int:
        return 4 * self.meta["n_tokens"]

    @property
    def body_offset(self) -> int:
        """Where the KV data starts in the file (after the header, metadata and tokens)."""
        return _HEADER.size + len(self.meta_raw) + self.token_bytes

    def hasher(self):
        """The file's checksum, fed its metadata: the body comes next."""
        return _CHECKSUMS[self.version](self.meta_raw)

    def check_digest(self, h) -> None:
        """Raise StateFileError unless ``h`` (fed the whole body) matches the header, the
        metadata is readable and the sizes agree."""
        if h.digest().ljust(len(self.digest), b"\0") != self.digest:
            raise StateFileError(f"{self.name} is corrupt: checksum mismatch")
        if self.meta is None:
            raise StateFileError(f"{self.name} is corrupt: unreadable metadata")
        if not self.sizes_ok:
            raise StateFileError(f"{self.name} is corrupt: its token count does not match its size")


def read_head(f, size: int, name: str) -> FileHead:
    """The header and metadata of a .kvstate ``f`` of ``size`` bytes (read from its start),
    refused in one line when the magic, version or sizes are wrong."""
    if size < _HEADER.size:
        raise StateFileError(f"{name} is truncated or not a KV Primer state ({size} bytes)")
    magic, version, meta_len, body_len, digest = _HEADER.unpack(f.read(_HEADER.size))
    if magic != MAGIC:
        raise StateFileError(f"{name} is neither a KV Primer state nor a llama.cpp sequence "
                             "state (wrong magic)")
    if version not in _CHECKSUMS:
        raise StateFileError(
            f"{name} has state format version {version}; this KV Primer reads versions "
            f"{min(_CHECKSUMS)} to {max(_CHECKSUMS)}; prime the prefix again"
        )
    if meta_len > MAX_META:
        raise StateFileError(f"{name} is corrupt: its header declares {meta_len:,} bytes of metadata")
    expected = _HEADER.size + meta_len + body_len
    if expected != size:
        what = "truncated" if expected > size else "longer than its header says"
        raise StateFileError(f"{name} is {what} ({size:,} bytes, header declares {expected:,})")
    meta_raw = f.read(meta_len)
    meta = _parse_meta(meta_raw)
    if meta is not None:  # llama.cpp's bytes of another version: refused before reading them
        check_version(meta["seq_state_version"])
    return FileHead(name, version, meta_raw, meta, body_len, digest)


def _read_hashed(f, n: int, h) -> bytes:
    """The next ``n`` bytes of ``f`` as one bytes object, read straight into it (in huge
    pages where the kernel gives them: body_buffer.py) and hashed chunk by chunk as they
    arrive: one pass over memory, each chunk hashed soon after its read, in this thread while a
    reader thread reads the next ones (and, from a file not in the page cache, the disk reads
    ahead)."""
    _advise_sequential(f)
    data, got = read_body(f, n, on_chunk=h.update)
    return data if got == n else data[:got]  # a short read fails the checksum


def _advise_sequential(f) -> None:
    """Tell the kernel the rest of ``f`` is read once, front to back (a larger read-ahead)."""
    try:
        os.posix_fadvise(f.fileno(), f.tell(), 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass  # not a file on disk, or no posix_fadvise here


def _parse_meta(raw: bytes) -> dict | None:
    """The metadata fields with their types checked, or None."""
    try:
        meta = json.loads(raw.decode("utf-8"))
        n_tokens, data_bytes = meta["n_tokens"], meta["data_bytes"]
        if not all(type(v) is int for v in (n_tokens, data_bytes)):  # not 1.5, not true
            return None
        fields = {k: meta[k] for k in ("model_sha256", "model_name", "type_k", "type_v",
                                       "template_sha256")}
        if not all(isinstance(v, str) for v in fields.values()):
            return None
        return {"n_tokens": n_tokens, "data_bytes": data_bytes, "fields": fields,
                "seq_state_version": int(meta["seq_state_version"]),
                "created": float(meta["created"]), "text": str(meta.get("text", "")),
                "prime_timing": meta.get("prime_timing")}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError, AttributeError,
            OverflowError):
        return None


_KV_TYPE_IDS = {name: t.id for name, t in KV_TYPES.items()}


def _type_ids(type_k: str, type_v: str) -> tuple[int, int] | None:
    if type_k in KV_TYPES and type_v in KV_TYPES:
        return KV_TYPES[type_k].id, KV_TYPES[type_v].id
    return None


def read_state_meta(path: str | os.PathLike) -> dict:
    """A .kvstate's metadata from its first few KB, for listing a folder of states quickly;
    ``{"error": reason}`` when unreadable. The full check happens on load."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return {"error": "truncated"}
            magic, _version, meta_len, _body, _digest = _HEADER.unpack(head)
            if magic != MAGIC or meta_len > MAX_META:
                return {"error": "not a KV Primer state"}
            meta = json.loads(f.read(meta_len).decode("utf-8"))
            return meta if isinstance(meta, dict) else {"error": "unreadable metadata"}
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {"error": "unreadable metadata"}


def _swapped(toks: array) -> bytes:  # pragma: no cover - big-endian hosts only
    t = array("i", toks)
    t.byteswap()
    return t.tobytes()
