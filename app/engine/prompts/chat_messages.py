"""Chat templates: a prompt written as chat messages, the format OpenAI's ``messages`` and
prompt tools (promptfoo, ChainForge) use, in a JSON or YAML file.

A file holds a list of ``{role, content}`` messages, or an object with ``messages`` and an
optional ``tools`` list (OpenAI's function tools, passed to the model's chat template as they
are). A content may hold ``<name>`` placeholders with the rules of a ``.tmpl`` template
(template.py): ``\\<`` writes a literal ``<``. The model's own chat template turns the messages
into the prompt (chat_render.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import ChatTemplateError, MissingValuesError, TemplateSyntaxError
from ..files.user_files import atomic_write, read_user_text
from .template import Placeholder, Template

CHAT_SUFFIXES = (".json", ".yaml", ".yml")
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_BYTES = 16 << 20


def is_chat_file(path: str | os.PathLike) -> bool:
    """Is this file a chat template (by its suffix) rather than a text template?"""
    return Path(path).suffix.lower() in CHAT_SUFFIXES


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str  # template text: placeholders as <name>, a literal '<' of a name as \<

    def parsed(self, where: str = "message") -> Template:
        try:
            return Template.parse(self.content)
        except TemplateSyntaxError as e:
            raise TemplateSyntaxError(e.message, e.line, e.column, where) from None


@dataclass(frozen=True)
class ChatTemplate:
    messages: tuple[ChatMessage, ...]
    tools: tuple[dict, ...] = field(default=())

    @classmethod
    def from_data(cls, data, name: str = "chat template") -> "ChatTemplate":
        """Messages from decoded JSON/YAML; a one-line ChatTemplateError names what is wrong."""
        tools = []
        if isinstance(data, dict):
            unknown = sorted(set(data) - {"messages", "tools"})
            if unknown:
                raise ChatTemplateError(f"{name}: unknown key {unknown[0]!r}; a chat template has "
                                        "'messages' and optionally 'tools'")
            if "messages" not in data:
                raise ChatTemplateError(f"{name} has no 'messages'; write a list of "
                                        "{role, content} messages under 'messages'")
            tools = data.get("tools") or []
            data = data["messages"]
        if not isinstance(data, list):
            raise ChatTemplateError(f"{name}: the messages must be a list of {{role, content}} "
                                    "objects")
        if not data:
            raise ChatTemplateError(f"{name} has no messages; add at least one "
                                    "{role, content} message")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ChatTemplateError(f"{name}: 'tools' must be a list of tool objects "
                                    '({"type": "function", "function": {...}})')
        messages = []
        for k, m in enumerate(data, 1):
            messages.append(_message(m, k, name))
        chat = cls(tuple(messages), tuple(tools))
        chat.check(name)
        return chat

    @classmethod
    def parse(cls, text: str, name: str = "chat template", yaml_text: bool = False) -> "ChatTemplate":
        """From a file's text: JSON, or YAML when ``yaml_text`` (YAML also reads JSON)."""
        try:
            data = yaml.safe_load(text) if yaml_text else json.loads(text)
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"{name} line {e.lineno}, column {e.colno}: not valid JSON "
                                    f"({e.msg})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or "cannot read it"
            raise ChatTemplateError(f"{name}{where}: not valid YAML ({problem})") from None
        return cls.from_data(data, name)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ChatTemplate":
        p = Path(path)
        text = read_user_text(p, ChatTemplateError, "chat template file", MAX_BYTES)
        return cls.parse(text, p.name, yaml_text=p.suffix.lower() != ".json")

    def check(self, name: str = "chat template") -> None:
        """Every content parses as template text."""
        for k, m in enumerate(self.messages, 1):
            m.parsed(f"{name} message {k}")

    @property
    def placeholders(self) -> list[str]:
        """Placeholder names in order of first appearance, each once."""
        seen: dict[str, None] = {}
        for m in self.messages:
            for name in m.parsed().placeholders:
                seen.setdefault(name, None)
        return list(seen)

    def data(self) -> list | dict:
        """What a file holds: the list of messages, or an object when there are tools."""
        msgs = [{"role": m.role, "content": m.content} for m in self.messages]
        return {"messages": msgs, "tools": list(self.tools)} if self.tools else msgs

    def dumps(self, yaml_text: bool = False) -> str:
        if yaml_text:
            return yaml.dump(self.data(), Dumper=_BlockDumper, sort_keys=False,
                             allow_unicode=True, width=100)
        return json.dumps(self.data(), indent=2, ensure_ascii=False) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        p = Path(path)
        text = self.dumps(yaml_text=p.suffix.lower() != ".json")
        atomic_write(p, [text.encode("utf-8")], ChatTemplateError, "chat template file")

    def filled(self, values: dict[str, str]) -> list[dict]:
        """OpenAI messages with the values in place of the placeholders (what an application
        sends); missing or unknown values are refused as for a text template."""
        names = self.placeholders
        missing = [n for n in names if n not in values]
        unknown = sorted(k for k in values if k not in set(names))
        if missing or unknown:
            raise MissingValuesError(missing, unknown)
        out = []
        for m in self.messages:
            text = "".join(str(values[p.name]) if isinstance(p, Placeholder) else p.text
                           for p in m.parsed().parts)
            out.append({"role": m.role, "content": text})
        return out


class _BlockDumper(yaml.SafeDumper):
    """Writes texts of several lines as YAML blocks (``|``), which read like the prompt."""


def _text(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _text)


def _message(m, k: int, name: str) -> ChatMessage:
    if not isinstance(m, dict):
        raise ChatTemplateError(f"{name}: message {k} is not an object; write it as "
                                "{role, content}")
    role, content = m.get("role"), m.get("content")
    extra = sorted(set(m) - {"role", "content"})
    if extra:
        raise ChatTemplateError(f"{name}: message {k} has an unknown key {extra[0]!r}; a message "
                                "has a role and a content")
    if not isinstance(role, str) or not role.strip():
        raise ChatTemplateError(f"{name}: message {k} has no role; give it one of "
                                f"{', '.join(ROLES)}")
    if role not in ROLES:
        raise ChatTemplateError(f"{name}: message {k} has the role {role!r}; use one of "
                                f"{', '.join(ROLES)}")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ChatTemplateError(f"{name}: message {k}'s content is not text; write it as one "
                                "string")
    return ChatMessage(role, content)
