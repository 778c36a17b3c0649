"""Whether a server runs the model KV Primer has loaded. Servers do not check a state's model
(llama-server restores any file whose rows fit), so we do: by path, then by content where the
server's file is readable here, then by file name."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.engine.llama.model_files import model_fingerprint


@dataclass(frozen=True)
class ModelMatch:
    same: bool | None  # None: cannot tell (the server's file is not readable here)
    how: str  # what the answer rests on, for people

    def describe(self) -> str:
        return self.how


def match_model(local_path: str, local_sha256: str, server_model: str) -> ModelMatch:
    if not server_model:
        return ModelMatch(None, "the server does not say which model it runs")
    local = Path(local_path)
    remote = Path(server_model)
    try:
        if remote.exists() and os.path.samefile(local, remote):
            return ModelMatch(True, "the same model file")
    except OSError:
        pass
    if remote.is_file():
        try:
            same = model_fingerprint(remote) == local_sha256
        except OSError:
            same = None
        if same is not None:
            return ModelMatch(same, "the same model bytes" if same else
                              f"another model ({remote.name}, other bytes than {local.name})")
    # not on this machine: the file name is all there is to go on
    if _stem(remote.name) == _stem(local.name):
        return ModelMatch(None, f"a model file of the same name ({remote.name}), not readable here")
    return ModelMatch(False, f"another model ({remote.name}; this one is {local.name})")


def _stem(name: str) -> str:
    return name.lower().removesuffix(".gguf")
