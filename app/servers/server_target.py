"""What a server target is, in one line for people: health, kind, model (and whether it is the
one loaded here), slots, context and build: the window's Check and `kvprimer info --server`
(through app/servers/server_flows.py's check_target)."""
from __future__ import annotations

from dataclasses import dataclass

from .http_stream import ServerError
from .model_match import match_model


@dataclass(frozen=True)
class TargetFacts:
    url: str
    api: str
    flavor: str
    health: str
    model: str
    same_model: bool | None
    model_note: str
    slots: int | None = None
    n_ctx: int | None = None
    build: str = ""

    def describe(self) -> str:
        parts = [self.health, f"{self.flavor} server" if self.api != "llama" else "llama-server"]
        if self.build:
            parts[-1] += f" {self.build}"
        if self.slots is not None:
            parts.append(f"{self.slots} slot{'s' if self.slots != 1 else ''}")
        if self.n_ctx:
            parts.append(f"context {self.n_ctx:,}")
        same = {True: "the model loaded here", False: "not the model loaded here",
                None: "model not compared"}[self.same_model]
        parts.append(f"model {self.model or '?'} ({same}: {self.model_note})")
        return " · ".join(parts)


def target_facts(server, engine=None) -> TargetFacts:
    """The facts of a connected client (LlamaServer or OpenAIServer); ``engine``: the model
    loaded here, to compare with the server's."""
    api = server.api
    health = server.health()
    if health != "ok":
        return TargetFacts(server.url, api, server.flavor, health, "",
                           None, "the server is still loading its model")
    slots = n_ctx = None
    build = ""
    if api == "llama":
        p = server.props()
        model, slots, n_ctx, build = p.model_path, p.total_slots, p.n_ctx, p.build_info
    else:
        model = server.model
    if engine is None:
        same, note = None, "no model loaded here"
    else:
        m = match_model(engine.info.path, engine.info.sha256, model)
        same, note = m.same, m.how
    return TargetFacts(server.url, api, server.flavor, health, model,
                       same, note, slots, n_ctx, build)


__all__ = ["ServerError", "TargetFacts", "target_facts"]
