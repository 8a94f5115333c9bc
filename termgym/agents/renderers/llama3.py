"""Llama 3 (3.1 and later; 3.0 without ``<|eom_id|>``): header-framed turns, tool results in the
``ipython`` role, tool calls as the reply's whole text.

``templates/llama3.jinja`` renders the same text. A reply is its content, or one tool call and
nothing else (Llama 3.1's documented JSON ``{"name": ..., "parameters": {...}}``); a message with
two calls, or a call and content, is a ``ValueError``. Reasoning is never rendered and never parsed
(``reasoning`` is None), so no retention ever breaks a bridge. ``parse`` reads the whole reply's
text (Llama has no tool-call token): one JSON object with a string ``name`` is a call; a reply
starting with ``<|python_tag|>`` or ``{"name"`` that is not such an object is an unreadable call
(``name=None``, the raw text); anything else is content. The stop ids are ``<|eot_id|>``,
``<|eom_id|>`` and ``<|end_of_text|>`` (those the tokenizer has); the close id is ``<|eot_id|>``.

What a conversation renders to: docs/guides/training.md#the-llama3-format."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from termgym.agents.actions import ToolCall
from termgym.agents.renderers.base import ParsedReply, ThinkingRetention
from termgym.agents.renderers.chatml import arguments_text
from termgym.agents.renderers.formats import FORMATS, FormatRenderer, Part, message_text, tool_calls_of

BEGIN, END_OF_TEXT = "<|begin_of_text|>", "<|end_of_text|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
EOT, EOM, PYTHON_TAG = "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"

TOOLS_INTRO = (
    "Environment: ipython\n\nYou can call the functions below. To call one, reply with nothing but a JSON object "
    'of the form {"name": function name, "parameters": dictionary of argument names and values}. '
    "Do not use variables.\n\n"
)


class Llama3Renderer(FormatRenderer):
    """The Llama 3 chat format, token-exact (module docstring)."""

    name = "llama3"
    spec = FORMATS["llama3"]

    def __init__(self, tokenizer: Any, *, thinking: ThinkingRetention = "cycle"):
        super().__init__(tokenizer, thinking=thinking)
        self.close_id: int = self.ids[EOT]
        self.stop_ids: tuple[int, ...] = tuple(self.ids[t] for t in (EOT, EOM, END_OF_TEXT) if t in self.ids)

    def _head(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[Part]:
        parts: list[Part] = [self.ids[BEGIN]]
        system = messages[0] if messages and messages[0].get("role") == "system" else None
        if system is None and not tools:
            return parts
        text = "\n\n"
        if tools:
            text += TOOLS_INTRO + "".join(json.dumps(tool, ensure_ascii=False, indent=4) + "\n\n" for tool in tools)
        if system is not None:
            text += message_text(system)
        return [*parts, *self._header("system"), text, self.ids[EOT]]

    def _header(self, role: str) -> list[Part]:
        return [self.ids[START_HEADER], role, self.ids[END_HEADER]]

    def _message(self, messages: list[dict[str, Any]], index: int) -> list[Part]:
        message = messages[index]
        role = message.get("role")
        if role not in ("system", "user", "tool"):
            raise ValueError(f"the {self.name} format has no {role!r} messages")
        return [*self._header("ipython" if role == "tool" else role), "\n\n" + message_text(message), self.ids[EOT]]

    def _generation_prompt(self, kept: bool) -> list[Part]:
        return [*self._header("assistant"), "\n\n"]

    def _after_reply(self) -> list[Part]:
        return []

    def _reply(self, message: dict[str, Any], kept: bool) -> list[Part]:
        calls = tool_calls_of(message)
        content = message_text(message)
        if not calls:
            return [content, self.ids[EOT]]
        if len(calls) > 1:
            raise ValueError(f"a Llama 3 reply holds one tool call, not {len(calls)}")
        if content:
            raise ValueError("a Llama 3 tool call is the whole reply: the message must have no content")
        name, arguments = calls[0]
        if not name and isinstance(arguments, str):  # a call parse could not read: its raw text
            return [arguments, self.ids[EOT]]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return ['{"name": "' + name + '", "parameters": ' + text + "}", self.ids[EOT]]

    def _retention_breaks(self, message: dict[str, Any]) -> bool:
        return False  # reasoning is never rendered

    def parse(self, ids: Sequence[int]) -> ParsedReply:
        body, closed = self._split_stop(ids, self.stop_ids)
        tagged = PYTHON_TAG in self.ids and body[:1] == [self.ids[PYTHON_TAG]]
        text = self._decode_text(body[1:] if tagged else body)
        call = read_call(text, tagged)
        if call is None:
            return ParsedReply(text, None, [], closed)
        return ParsedReply("", None, [call], closed)


def read_call(text: str, tagged: bool) -> ToolCall | None:
    """The reply's text as its one tool call, or None when it is content (module docstring)."""
    body = text.strip()
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("name"), str):
        key = "parameters" if "parameters" in data else "arguments"
        return ToolCall("call_0", data["name"], arguments_text(body, data["name"], key, data.get(key, {})))
    if tagged or body.startswith('{"name"'):
        return ToolCall("call_0", None, text)
    return None
