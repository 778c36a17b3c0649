"""Server targets: llama-server and OpenAI-compatible servers, above the engine (Qt-free).

- ``llama_server``: llama-server's own API (token-id prompts, /tokenize, /props, /slots, SSE);
- ``openai_server``: any OpenAI-compatible ``/v1/completions`` (llama-server, vLLM, SGLang);
- ``chat_server``: their ``/v1/chat/completions``, sent chat messages as applications send them;
- ``render_check``: our rendering of a chat template's rows against the server's;
- ``deploy``: a primed prefix into a llama-server slot, checked against the server's layout;
- ``server_bench``: a template's rows on a server, warm and cold, with the reuse explained;
- ``server_flows``: what the window's Server tab and the CLI's server commands run (check,
  deploy, bench), on top of the engine, which imports nothing of this package;
- ``llama_server_process``: start and stop a llama-server that matches KV Primer's states.
"""
from importlib import import_module

# the clients need the optional HTTP extra: they load on first use, so the server flows here
# (server_flows.py, which the CLI and the window import at start) load without it
_CLIENTS = {"Completion": "http_stream", "ServerError": "http_stream",
            "LlamaServer": "llama_server", "OpenAIServer": "openai_server",
            "ChatServer": "chat_server"}


def __getattr__(name: str):
    if name in _CLIENTS:
        return getattr(import_module(f".{_CLIENTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


API_KINDS = ("llama", "openai", "chat")


def connect(url: str, api: str = "llama", flavor: str = "auto", model: str = "",
            api_key: str = ""):
    """A client of the given API kind; ServerError when ``api`` is not one we speak."""
    from .chat_server import ChatServer
    from .http_stream import ServerError
    from .llama_server import LlamaServer
    from .openai_server import OpenAIServer

    if api == "llama":
        return LlamaServer(url)
    if api == "openai":
        return OpenAIServer(url, flavor=flavor, model=model, api_key=api_key)
    if api == "chat":
        return ChatServer(url, flavor=flavor, model=model, api_key=api_key)
    raise ServerError(f"unknown API kind '{api}'; use one of {', '.join(API_KINDS)}")


__all__ = ["API_KINDS", "ChatServer", "Completion", "LlamaServer", "OpenAIServer", "ServerError", "connect"]
