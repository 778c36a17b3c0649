"""What made a result: the template, the model and the settings a run or a benchmark ran with.

Results stay on screen and in the project file after the template is edited or another model
is loaded; their origin tells which ones came from an earlier template, model or settings, so
that they are marked as such rather than mixed with the new ones.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ResultOrigin:
    template: str  # the template's name: its file's, or "untitled"
    template_sha: str  # the first hex digits of its text's SHA-256: any edit changes them
    model: str  # the model file's name
    model_sha: str = ""  # the model's SHA-256, when known
    settings: str = ""  # the engine's settings that change results, in words

    @classmethod
    def of(cls, template_text: str, template_path: str, info) -> "ResultOrigin":
        """The origin of a result made now, with ``info`` the loaded model's ModelInfo (None:
        no model)."""
        sha = hashlib.sha256(template_text.encode("utf-8")).hexdigest()[:12]
        name = Path(template_path).name if template_path else "untitled"
        if info is None:
            return cls(name, sha, "")
        settings = (f"context {info.n_ctx:,} · batch {info.n_batch:,} · "
                    f"KV {info.type_k}/{info.type_v}")
        return cls(name, sha, info.name or Path(info.path).name, info.sha256 or "", settings)

    def changed(self, now: "ResultOrigin") -> list[str]:
        """What differs from ``now``: "template", "model", "settings", in that order."""
        out = []
        if self.template_sha != now.template_sha:
            out.append("template")
        if (self.model_sha and now.model_sha and self.model_sha != now.model_sha) or \
                (not (self.model_sha and now.model_sha) and self.model != now.model):
            out.append("model")
        elif self.settings != now.settings:
            out.append("settings")
        return out

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> "ResultOrigin | None":
        """From ``as_dict`` data; None for a project saved before results had an origin."""
        if not isinstance(d, dict) or "template_sha" not in d:
            return None
        return cls(**{k: str(d.get(k) or "") for k in
                      ("template", "template_sha", "model", "model_sha", "settings")})


def earlier_text(changed: list[str], origin: ResultOrigin) -> str:
    """A marker for results of an earlier template, model or settings ("" when none changed):
    "from an earlier template and model (SmolLM2, rag.txt)"."""
    if not changed:
        return ""
    names = ("earlier " if changed[0] == "settings" else "an earlier ") + " and ".join(changed)
    what = ", ".join(x for x in (origin.model if "model" in changed else "",
                                 origin.template if "template" in changed else "",
                                 origin.settings if changed == ["settings"] else "") if x)
    return f"from {names}" + (f" ({what})" if what else "")
