"""Rendering chat messages with a model's own chat template, as llama-server renders them
(its ``/apply-template``, and the prompt of a ``/v1/chat/completions`` request), so that a
prefix primed here is the prefix the server sees.

llama-server runs the GGUF's Jinja template with its own Jinja engine; Jinja2 with the same
settings and globals gives the same text: blocks trimmed (``trim_blocks``, ``lstrip_blocks``),
``none`` printed as nothing, ``tojson`` without HTML escaping, ``raise_exception``,
``strftime_now``, ``date_string`` and ``datetime`` (today, local time), ``bos_token`` and
``eos_token``, ``enable_thinking`` and ``add_generation_prompt``. As the server does, a
rendering that starts with the BOS text loses it when the tokenizer adds BOS anyway, the
``developer`` role becomes ``system``, and a system message is merged into the next message
for a template that has no system role.

A chat template (chat_messages.py) becomes an ordinary Template: its placeholders are
rendered as markers that no template changes, and the text between them is template text
(special tokens parsed) while values stay plain text, as for a ``.tmpl``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError as JinjaError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError
from .chat_format import ChatFormat, read_chat_format
from .chat_messages import ChatTemplate
from .template import Literal, Placeholder, Template, render_parts

# Placeholders are rendered as characters of Unicode's private use plane 15, one per name,
# which neither templates nor ordinary text use.
_MARK = 0xF0000


@dataclass(frozen=True)
class RenderedChat:
    template: Template  # the rendered prompt, placeholders in place
    note: str  # one line when the rendering is not the model's own template, else ''


def render_messages(fmt: ChatFormat, messages: list[dict], tools: list | tuple = (),
                    add_generation_prompt: bool = True) -> str:
    """The prompt llama-server renders for these OpenAI messages (its /apply-template)."""
    source = fmt.source_for(bool(tools))
    tmpl = _compile(source)
    msgs = [dict(m) for m in messages]
    for m in msgs:
        if m.get("role") == "developer" and "<|channel|>" not in source:
            m["role"] = "system"
    system_role, thinking = _traits(source)
    if msgs and msgs[0].get("role") == "system" and not system_role:
        first = msgs.pop(0)
        if msgs:  # the server joins the system text to the next message
            joined = f"{first.get('content', '')}\n{msgs[0].get('content', '')}"
            msgs[0] = {**msgs[0], "content": joined}
    env = {"messages": msgs, "bos_token": fmt.bos_token, "eos_token": fmt.eos_token,
           "enable_thinking": thinking}
    if tools:
        env["tools"] = [_server_tool(t) for t in tools]
    now = datetime.now()
    env.update(datetime=now.strftime("%b %d %Y"), date_string=now.strftime("%d %b %Y"))
    if add_generation_prompt:
        env["add_generation_prompt"] = True
    try:
        text = tmpl.render(env)
    except Exception as e:  # noqa: BLE001 - the model's template is code we do not control
        raise ChatTemplateError(f"the model's chat template cannot render these messages "
                                f"({_one_line(e)}); check the roles and their order") from None
    if fmt.add_bos and fmt.bos_token and text.startswith(fmt.bos_token):
        text = text[len(fmt.bos_token):]
    if fmt.add_eos and fmt.eos_token and text.endswith(fmt.eos_token):
        text = text[:-len(fmt.eos_token)]
    return text


def render_chat(fmt: ChatFormat, chat: ChatTemplate) -> RenderedChat:
    """The chat template rendered for this model: a Template whose static prefix is the
    rendered text before the first placeholder."""
    names = chat.placeholders
    marks = {name: chr(_MARK + k) for k, name in enumerate(names)}
    messages = []
    for k, m in enumerate(chat.messages, 1):
        if any(_MARK <= ord(c) < _MARK + 0xFFFE for c in m.content):
            raise ChatTemplateError(f"message {k} holds characters of Unicode's private use "
                                    "plane 15, which mark placeholders here; remove them")
        parts = m.parsed(f"message {k}").parts
        text = "".join(marks[p.name] if isinstance(p, Placeholder) else p.text for p in parts)
        messages.append({"role": m.role, "content": text})
    text = render_messages(fmt, messages, chat.tools)
    by_mark = {v: k for k, v in marks.items()}
    parts: list[Literal | Placeholder] = []
    buf: list[str] = []
    for ch in text:
        name = by_mark.get(ch)
        if name is None:
            buf.append(ch)
            continue
        if buf:
            parts.append(Literal("".join(buf)))
            buf = []
        parts.append(Placeholder(name))
    if buf:
        parts.append(Literal("".join(buf)))
    lost = [n for n in names if n not in {p.name for p in parts if isinstance(p, Placeholder)}]
    if lost:
        raise ChatTemplateError(f"the model's chat template leaves out the message that holds "
                                f"<{lost[0]}>; move that placeholder into a user message")
    # parsed back from its source (the same parts), so placeholders know their line and column
    return RenderedChat(Template.parse(render_parts(parts)), fmt.note)


def _server_tool(tool: dict) -> dict:
    """A function tool as llama-server passes it on: type and function's name, description
    and parameters, in that order; other keys dropped."""
    f = tool.get("function") or {}
    return {"type": "function",
            "function": {"name": f.get("name", ""), "description": f.get("description", ""),
                         "parameters": f.get("parameters", {})}}


# -- Jinja as llama-server runs it -----------------------------------------------------------

def _raise(message: str):
    raise JinjaError(str(message))


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(_whole_floats(value), indent=indent, ensure_ascii=ensure_ascii,
                      separators=separators, sort_keys=sort_keys)


def _whole_floats(v):
    """llama-server writes 2.0 as 2 in JSON."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _whole_floats(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_whole_floats(x) for x in v]
    return v


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"],
                                        finalize=lambda v: "" if v is None else v)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = _environment()
_COMPILED: dict[str, object] = {}
_TRAITS: dict[str, tuple[bool, bool]] = {}


def _compile(source: str):
    tmpl = _COMPILED.get(source)
    if tmpl is None:
        try:
            tmpl = _ENV.from_string(source)
        except JinjaError as e:
            raise ChatTemplateError(f"the model's chat template is not valid Jinja "
                                    f"({_one_line(e)}); choose another model") from None
        _COMPILED[source] = tmpl
    return tmpl


def _traits(source: str) -> tuple[bool, bool]:
    """(has a system role, reasons) of a template, asked once."""
    if source not in _TRAITS:
        tmpl = _compile(source)
        _TRAITS[source] = (_has_system_role(tmpl), _thinking(tmpl))
    return _TRAITS[source]


def _probe(tmpl, messages: list[dict], **extra) -> str | None:
    try:
        return tmpl.render(messages=messages, bos_token="", eos_token="",
                           add_generation_prompt=True, **extra)
    except Exception:  # noqa: BLE001 - a template refusing the probe is the answer
        return None


def _has_system_role(tmpl) -> bool:
    """Does the template show a system message's text? (llama-server asks the same.)"""
    out = _probe(tmpl, [{"role": "system", "content": "System message"},
                        {"role": "user", "content": "User message"}], tools=[])
    return out is not None and "System message" in out


def _thinking(tmpl) -> bool:
    """llama-server passes enable_thinking true to a template that reasons (one whose output
    depends on it), else false."""
    msgs = [{"role": "user", "content": "test"}]
    return _probe(tmpl, msgs, enable_thinking=True) != _probe(tmpl, msgs, enable_thinking=False)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:160] or type(e).__name__


def render_chat_file(path, model_path) -> RenderedChat:
    """A chat template file rendered with a model file's chat template, read without loading
    the model's weights; errors name the file."""
    chat = ChatTemplate.load(path)
    try:
        return render_chat(read_chat_format(model_path), chat)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{Path(path).name}: {e}") from None
