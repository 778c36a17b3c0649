"""llama.cpp's own per-sequence state file: what ``llama_state_seq_save_file`` writes and
``llama_state_seq_load_file`` reads (llama-server's slot save/restore, LLamaSharp).

Layout (little endian; llama.cpp's ``state_seq_save_file`` in src/llama-context.cpp)::

    0     4    magic 'ggsq' (u32 0x67677371)
    4     4    LLAMA_STATE_SEQ_VERSION (u32)
    8     4    token count N (u32)
    12    4N   the token ids (int32 each)
    12+4N ...  the sequence's KV data, as ``state_seq_write_data`` streams it: what
               ``llama_state_seq_get_data`` returns (see seq_state_layout.py) without that buffer's
               first 8 bytes (u32 0xAF143CD8 and the source sequence id, which only the
               in-memory form carries; checked against llama.cpp's source and by the tests)

Nothing in it names the model, so a file saved under another model with the same layer count
and row sizes loads without complaint. We check what can be checked (version, token count,
token ids, the KV layout and row sizes, the template's prefix tokens) and mark the state
``origin="llama.cpp"`` so that the CLI and the window say how little was checked.

We write the file from a ``PrefixState``'s bytes rather than by calling
``llama_state_seq_save_file``: a state from a file or the library need not be resident in any
sequence, and llama.cpp's call writes in place, not atomically. The tests check that our bytes
equal what llama.cpp writes for the same sequence, and that llama.cpp's loader reads ours.
"""
from __future__ import annotations

import os
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import StateFileError
from ..llama.ggml_types import KV_TYPES
from .body_buffer import read_body
from .prefix_state import PrefixState, read_state_meta
from .seq_payload import row_layout
from .seq_state_layout import (FILE_HEAD_BYTES, buffer_head, check_version, file_head,
                               has_buffer_head, is_file_head, read_file_head)
from ..user_files import atomic_write, open_user_file

SUFFIX = ".bin"  # what llama-server's slot save uses; any name is read by content
FORMATS = ("kvprimer", "llama")
_TYPE_NAMES = {t.id: name for name, t in KV_TYPES.items()}
is_llama_state = is_file_head  # True when a file's first bytes are llama.cpp's 'ggsq' magic


@dataclass(frozen=True)
class StateFileInfo:
    """What a state file holds, read from its first bytes (not its KV data), for listings."""
    format: str  # "kvprimer", "llama.cpp", or "" when it is no state we can read
    model_name: str = ""  # a llama.cpp file names none
    n_tokens: int | None = None
    created: float | None = None  # seconds since the epoch (a llama.cpp file: its mtime)
    text: str = ""  # the prefix text a .kvstate records
    seq_state_version: int | None = None
    error: str = ""  # why it cannot be read


def state_file_info(path: str | os.PathLike) -> StateFileInfo:
    """A .kvstate's metadata, or a llama.cpp sequence-state file's token count and version."""
    try:
        with open(path, "rb") as f:
            head = f.read(FILE_HEAD_BYTES)
    except OSError:
        return StateFileInfo("", error="unreadable")
    if is_file_head(head):
        fh = read_file_head(head)
        if fh is None:
            return StateFileInfo("", error="truncated")
        return StateFileInfo("llama.cpp", n_tokens=fh.n_tokens, seq_state_version=fh.version,
                             created=os.path.getmtime(path))
    m = read_state_meta(path)
    if "error" in m:
        return StateFileInfo("", error=str(m["error"]))
    n, created, version = m.get("n_tokens"), m.get("created"), m.get("seq_state_version")
    return StateFileInfo("kvprimer", model_name=str(m.get("model_name", "?")),
                         n_tokens=n if type(n) is int else None,
                         created=float(created) if isinstance(created, (int, float)) else None,
                         text=" ".join(str(m.get("text", "")).split()),
                         seq_state_version=version if type(version) is int else None)


def read_any_state(path: str | os.PathLike) -> PrefixState:
    """A .kvstate or a llama.cpp sequence-state file, told apart by content (not by name)."""
    path = Path(path)
    with open_user_file(path, StateFileError, "state file") as f:
        if not is_llama_state(f.read(4)):
            return PrefixState.load(path)
        f.seek(0)
        return read_llama_state(f, os.fstat(f.fileno()).st_size, path.name)


def read_llama_state(f: BinaryIO, size: int, name: str) -> PrefixState:
    """Parse an open llama.cpp sequence-state file into a PrefixState (origin "llama.cpp").

    Checks the header and token ids here; the version, context size, vocabulary and KV layout
    are checked against the loaded model by ``Engine.check_state`` before a restore.
    """
    if size < FILE_HEAD_BYTES:
        raise StateFileError(f"{name} is truncated: {size} bytes is less than a llama.cpp "
                             "state header")
    head = read_file_head(f.read(FILE_HEAD_BYTES))
    if head is None:
        raise StateFileError(f"{name} is not a llama.cpp sequence state (wrong magic)")
    version, n_tokens = head.version, head.n_tokens
    check_version(version)  # before any other byte is read as this version's
    if n_tokens == 0:
        raise StateFileError(f"{name} holds no tokens; save a sequence that holds a prefix")
    if FILE_HEAD_BYTES + 4 * n_tokens > size:
        raise StateFileError(f"{name} is truncated or corrupt: its header declares {n_tokens:,} "
                             f"tokens but the file has {size:,} bytes")
    toks = array("i")
    toks.frombytes(f.read(4 * n_tokens))
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        toks.byteswap()
    toks = _server_tokens(toks, name)
    if min(toks) < 0:
        raise StateFileError(f"{name} is corrupt: it holds a negative token id")
    data = _read_body(f, size - FILE_HEAD_BYTES - 4 * n_tokens, name)
    layout = row_layout(data, version)
    # KV types from the first layer; check_payload later requires every layer to match them.
    # An unknown layout leaves them empty, and check_payload names what is malformed.
    type_k = type_v = ""
    if layout and layout[0]:
        kt, _, vt, _ = layout[0][0]
        type_k = _TYPE_NAMES.get(kt, f"ggml type {kt}")
        type_v = _TYPE_NAMES.get(vt, f"ggml type {vt}")
    return PrefixState(tokens=tuple(toks), data=data, model_sha256="",
                       model_name=Path(name).stem, type_k=type_k, type_v=type_v,
                       seq_state_version=version, origin="llama.cpp")


def _read_body(f: BinaryIO, n: int, name: str) -> bytes:
    """The file's ``n`` bytes of KV data as the in-memory form llama.cpp's set_data reads (the
    buffer head, then the data), read straight into the bytes kept: no second copy."""
    if n <= 0:
        raise StateFileError(f"{name} is truncated: it has tokens but no KV data")
    data, got = read_body(f, n, head=buffer_head())
    if got < n:
        raise StateFileError(f"{name} is truncated: it ended while its KV data was read")
    return data


def _server_tokens(toks: array, name: str) -> array:
    """The token ids of llama-server's own slot files: since b7000 or so it stores its prompt
    packed as [-1, format version 1, n, n token ids, media count, media...] where the plain
    format has the ids alone (it still reads plain lists, which is what we write)."""
    if not toks or toks[0] != -1:
        return toks
    if len(toks) < 4 or toks[1] != 1 or toks[2] < 0 or len(toks) < 4 + toks[2]:
        raise StateFileError(f"{name} holds llama-server's packed prompt in a form this version "
                             "cannot read; save the slot with the llama-server `make server` builds")
    n = toks[2]
    if toks[3 + n] != 0:
        raise StateFileError(f"{name} holds images or audio besides tokens; KV Primer reads text "
                             "prompts only")
    return toks[3:3 + n]


def save_llama_state(state: PrefixState, path: str | os.PathLike) -> int:
    """Write ``state`` as a llama.cpp sequence-state file, atomically; returns its size."""
    toks = array("i", state.tokens)
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        toks.byteswap()
    head = file_head(state.seq_state_version, len(state.tokens))
    tok_bytes = toks.tobytes()
    body = memoryview(state.data)
    if has_buffer_head(body):
        body = body[len(buffer_head()):]  # no copy of the KV bytes
    atomic_write(Path(path), (head, tok_bytes, body), StateFileError, "state")
    return len(head) + len(tok_bytes) + len(body)


def save_state(state: PrefixState, path: str | os.PathLike, fmt: str = "kvprimer") -> int:
    """Save in our format ("kvprimer", with model identity) or llama.cpp's ("llama")."""
    if fmt == "llama":
        return save_llama_state(state, path)
    if fmt == "kvprimer":
        return state.save(path)
    raise StateFileError(f"unknown state format '{fmt}'; use one of {', '.join(FORMATS)}")


def check_rows_fit(state: PrefixState, n_layer: int, kv_bytes_per_token: int) -> None:
    """Raise StateFileError when a llama.cpp state's layer count or row sizes cannot be this
    model's. Only the plain case is judged (one cache block, rows the same in every layer);
    llama.cpp itself refuses other mismatches on restore."""
    layout = row_layout(state.data, state.seq_state_version)
    if not layout or len(layout) != 1:
        return
    layers = layout[0]
    if len(layers) != n_layer:
        raise StateFileError(f"this llama.cpp state holds K/V rows for {len(layers)} layers but "
                             f"the model has {n_layer}; it was saved with another model")
    per_layer = {k_row + v_row for _, k_row, _, v_row in layers}
    if len(per_layer) == 1 and per_layer.pop() * n_layer != kv_bytes_per_token:
        got = sum(k + v for _, k, _, v in layers)
        raise StateFileError(
            f"this llama.cpp state holds {got:,} bytes of K/V per token but this model with "
            f"{state.type_k}/{state.type_v} KV needs {kv_bytes_per_token:,}; it was saved with "
            "another model")


def check_prefix_tokens(state: PrefixState, prefix_tokens: list[int]) -> None:
    """Raise StateFileError unless one of the state's tokens and the template's static-prefix
    tokens starts the other (a state shorter than the prefix is reused as far as it goes)."""
    n = min(len(state.tokens), len(prefix_tokens))
    first = next((i for i in range(n) if state.tokens[i] != prefix_tokens[i]), None)
    if first is not None:
        raise StateFileError(
            f"this state's tokens differ from the template's static prefix at token {first} "
            f"(state {state.tokens[first]}, template {prefix_tokens[first]}); it was saved for "
            "another prompt or model; prime this template instead")


def load_any_state(engine, path: str | os.PathLike, template=None) -> PrefixState:
    """Read a state file of either format and check it against ``engine``'s model and context
    and, for a llama.cpp file (no model identity), against ``template``'s static prefix."""
    state = engine.load_state(path)
    if state.origin == "llama.cpp" and template is not None:
        check_prefix_tokens(state, engine.tokenize(template.prefix_prompt()))
    return state
