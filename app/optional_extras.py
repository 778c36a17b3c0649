"""The optional extras, checked in one place: the CLI and the window both ask before using them."""
from __future__ import annotations

from .engine import KvPrimerError


def require_server_clients() -> None:
    """KvPrimerError, in one line saying how to install them, unless the server clients
    (the `server` extra: httpx, httpx-sse) import."""
    try:
        import app.servers.http_stream  # noqa: F401 - the clients' transport
    except ImportError as e:
        raise KvPrimerError(f"the server targets need {e.name}: pip install 'kvprimer[server]'") from None
