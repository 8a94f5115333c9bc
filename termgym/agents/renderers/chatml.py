"""ChatML as Qwen2.5 and Qwen3 write it: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` turns,
Hermes JSON tool calls, tool results grouped in one user turn, reasoning in ``<think>`` blocks.

``templates/chatml.jinja`` renders the same text. Guarantees: unlike Qwen3's own template no empty
think block is ever added, so the last reply renders the same before and after the next turn; a
call ``parse`` could not read (no name, string arguments) is written back as its raw text.
``parse`` reads structure on ids only, never raises, and keeps a span that is not a JSON object
with a string ``name`` as a call with ``name=None`` and its raw text; a literal ``<tool_call>`` in
text is content. On a tokenizer without ``<think>`` (Qwen2.5) reasoning is rendered as text and
never parsed back. The stop ids are ``<|im_end|>`` and ``<|endoftext|>``; the close id is
``<|im_end|>``.

What a conversation renders to, and the parse rules in full:
docs/guides/training.md#the-chatml-format."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from termgym.agents.actions import ToolCall
from termgym.agents.renderers.base import ParsedReply, ThinkingRetention
from termgym.agents.renderers.formats import (
    FORMATS,
    FormatRenderer,
    Part,
    message_text,
    reasoning_of,
    tool_calls_of,
)

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
THINK, THINK_END = "<think>", "</think>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"

TOOLS_INTRO = (
    "# Tools\n\nYou can call the functions below to help with the task.\n\n"
    "Their signatures are inside <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


class ChatMLRenderer(FormatRenderer):
    """The Qwen2.5 / Qwen3 chat format, token-exact (module docstring)."""

    name = "chatml"
    spec = FORMATS["chatml"]
    call_separator = "\n"  # between the content and the first call, when there is content

    def __init__(self, tokenizer: Any, *, thinking: ThinkingRetention = "cycle"):
        super().__init__(tokenizer, thinking=thinking)
        self.close_id: int = self.ids[IM_END]
        self.stop_ids: tuple[int, ...] = tuple(i for i in (self.close_id, self.ids.get(ENDOFTEXT)) if i is not None)

    # -- rendering -------------------------------------------------------------------------------

    def _head(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[Part]:
        system = messages[0] if messages and messages[0].get("role") == "system" else None
        if not tools:
            return [] if system is None else [self.ids[IM_START], "system\n" + message_text(system), *self._end_turn()]
        parts: list[Part] = [self.ids[IM_START], "system\n"]
        if system is not None:
            parts.append(message_text(system) + "\n\n")
        return [*parts, *self._tools_block(tools), *self._end_turn()]

    def _tools_block(self, tools: list[dict]) -> list[Part]:
        lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        return [*self._framing(TOOLS_INTRO), lines, *self._framing(TOOLS_OUTRO)]

    def _end_turn(self) -> list[Part]:
        return [self.ids[IM_END], "\n"]

    def _message(self, messages: list[dict[str, Any]], index: int) -> list[Part]:
        message = messages[index]
        role = message.get("role")
        if role in ("system", "user"):
            return [self.ids[IM_START], f"{role}\n" + message_text(message), *self._end_turn()]
        if role != "tool":
            raise ValueError(f"the {self.name} format has no {role!r} messages")
        parts: list[Part] = []
        if index == 0 or messages[index - 1].get("role") != "tool":
            parts += [self.ids[IM_START], "user"]
        parts += ["\n", self._token(TOOL_RESPONSE), "\n" + message_text(message) + "\n", self._token(TOOL_RESPONSE_END)]
        if index == len(messages) - 1 or messages[index + 1].get("role") != "tool":
            parts += self._end_turn()
        return parts

    def _generation_prompt(self, kept: bool) -> list[Part]:
        return [self.ids[IM_START], "assistant\n"]

    def _after_reply(self) -> list[Part]:
        return ["\n"]

    def _reply(self, message: dict[str, Any], kept: bool) -> list[Part]:
        parts = self._thought(message, kept)
        content = message_text(message)
        parts.append(content)
        for index, (name, arguments) in enumerate(tool_calls_of(message)):
            if index:
                parts.append("\n")
            elif content:
                parts.append(self.call_separator)
            parts += self._call(name, arguments)
        return [*parts, self.ids[IM_END]]

    def _thought(self, message: dict[str, Any], kept: bool) -> list[Part]:
        reasoning = reasoning_of(message)
        if not kept or reasoning is None:
            return []
        return [self._token(THINK), "\n" + reasoning + "\n", self._token(THINK_END), "\n\n"]

    def _call(self, name: str, arguments: Any) -> list[Part]:
        if not name and isinstance(arguments, str):  # a call parse could not read: its raw text
            return [self._token(TOOL_CALL), arguments, self._token(TOOL_CALL_END)]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return [
            self._token(TOOL_CALL),
            '\n{"name": "' + name + '", "arguments": ' + text + "}\n",
            self._token(TOOL_CALL_END),
        ]

    def _retention_breaks(self, message: dict[str, Any]) -> bool:
        return reasoning_of(message) is not None

    # -- parsing ---------------------------------------------------------------------------------

    def parse(self, ids: Sequence[int]) -> ParsedReply:
        body, closed = self._split_stop(ids, self.stop_ids)
        reasoning, rest = self._reasoning(body)
        if rest is None:  # the think block never closed: all of it is reasoning
            return ParsedReply("", reasoning, [], closed)
        content, calls = self._content_and_calls(rest, reasoning is not None)
        return ParsedReply(content, reasoning, calls, closed)

    def _reasoning(self, body: list[int]) -> tuple[str | None, list[int] | None]:
        """The reasoning and the ids after it; (reasoning, None) when it never closed."""
        think, end, call = self.ids.get(THINK), self.ids.get(THINK_END), self.ids.get(TOOL_CALL)
        if end is not None and end in body:
            at = body.index(end)
            head = body[:at]
            if call not in head:
                if think is not None and head[:1] == [think]:
                    head = head[1:]
                return self._decode_text(head).removeprefix("\n").removesuffix("\n"), body[at + 1 :]
        if think is not None and body[:1] == [think]:
            return self._decode_text(body[1:]).removeprefix("\n"), None
        return None, body

    def _content_and_calls(self, rest: list[int], after_thought: bool) -> tuple[str, list[ToolCall]]:
        opener, closer = self.ids[TOOL_CALL], self.ids[TOOL_CALL_END]
        texts: list[str] = []
        calls: list[ToolCall] = []
        position = 0
        while True:
            start = _find(rest, opener, position)
            texts.append(self._decode_text(rest[position:start]))
            if start == len(rest):
                break
            end = _find(rest, closer, start + 1)
            calls.append(self._read_call(len(calls), self._decode_text(rest[start + 1 : end])))
            if end == len(rest):
                break
            position = end + 1
        content = texts[0].removeprefix("\n\n") if after_thought else texts[0]
        if calls:
            content = content.removesuffix(self.call_separator)
        extra = "".join(texts[1:]).strip()
        if extra:
            content = f"{content}\n{extra}" if content else extra
        return content, calls

    def _read_call(self, index: int, text: str) -> ToolCall:
        """One Hermes call body: ``{"name": ..., "arguments": {...}}`` between newlines."""
        call_id = f"call_{index}"
        body = text.removeprefix("\n").removesuffix("\n")
        try:
            data = json.loads(body)
        except ValueError:
            return ToolCall(call_id, None, text)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return ToolCall(call_id, None, text)
        name = data["name"]
        key = "arguments" if "arguments" in data else "parameters"
        return ToolCall(call_id, name, arguments_text(body, name, key, data.get(key, {})))


def arguments_text(body: str, name: str, key: str, arguments: Any) -> str:
    """A call's arguments as JSON text: the reply's own text when it is laid out as the renderer
    writes it (so a re-render gives back the same text), else ``json.dumps``; a string as itself."""
    if isinstance(arguments, str):
        return arguments
    prefix = '{"name": "' + name + '", "' + key + '": '
    if body.startswith(prefix) and body.endswith("}"):
        raw = body[len(prefix) : -1]
        try:
            if json.loads(raw) == arguments:
                return raw
        except ValueError:
            pass
    return json.dumps(arguments, ensure_ascii=False)


def _find(ids: list[int], token: int, start: int) -> int:
    """The index of ``token`` in ``ids`` from ``start``, or ``len(ids)``."""
    try:
        return ids.index(token, start)
    except ValueError:
        return len(ids)
