"""Qwen3.5 and Qwen3-Coder: ChatML turns with XML tool calls.

What changes from ``chatml`` (``templates/qwen_xml.jinja`` renders the same text): a call is
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>``;
the tools are listed in the system turn first; with ``open_think`` (Qwen3.5, the default when the
tokenizer's chat template writes ``<think>``) the generation prompt opens ``<think>\\n`` and every
kept reply renders with a think block, so bridges stay exact but every turn depends on the
retention. ``open_think=False`` (Qwen3-Coder) writes reasoning as ``chatml`` does.

Argument values: a string is written as it is, anything else as JSON. Parsing reads a value back
as a number when it is a JSON number, as an object or array when it is valid JSON of that kind,
and as a string otherwise (``true``, ``false`` and ``null`` stay strings), so ``bash.command`` is a
string unless it is a bare number. A call with no ``<function=NAME>`` header keeps ``name=None``
and its raw text.

The format in full: docs/guides/training.md#the-qwen-xml-format."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from termgym.agents.actions import ToolCall
from termgym.agents.renderers.base import ThinkingRetention
from termgym.agents.renderers.chatml import IM_START, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, ChatMLRenderer
from termgym.agents.renderers.formats import FORMATS, Part, chat_template_text, message_text, reasoning_of

TOOLS_INTRO = "# Tools\n\nYou have access to the functions below:\n\n<tools>"
TOOLS_OUTRO = (
    "\n</tools>\n\nTo call a function, reply in exactly this format, with nothing after it:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nA value can span\nseveral lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- The <function=...></function> block must sit inside <tool_call></tool_call> tags\n"
    "- Give every required parameter\n"
    "- Any reasoning about the call goes BEFORE it, in plain language, never after\n"
    "- When no function fits, answer normally without mentioning functions\n"
    "</IMPORTANT>"
)

_FUNCTION = re.compile(r"\n?<function=([^>\n]*)>\n?")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>\n?")
_CLOSE_PARAMETER = "</parameter>"
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class QwenXMLRenderer(ChatMLRenderer):
    """The Qwen3.5 / Qwen3-Coder chat format, token-exact (module docstring)."""

    name = "qwen-xml"
    spec = FORMATS["qwen-xml"]
    call_separator = "\n\n"

    def __init__(self, tokenizer: Any, *, thinking: ThinkingRetention = "cycle", open_think: bool | None = None):
        super().__init__(tokenizer, thinking=thinking)
        if open_think is None:
            template = chat_template_text(tokenizer)
            open_think = not template or THINK in template
        self.open_think = open_think

    def _head(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[Part]:
        if not tools:
            return super()._head(messages, tools)
        lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        parts: list[Part] = [self.ids[IM_START], "system\n", *self._framing(TOOLS_INTRO), lines]
        parts += self._framing(TOOLS_OUTRO)
        if messages and messages[0].get("role") == "system":
            parts.append("\n\n" + message_text(messages[0]))
        return [*parts, *self._end_turn()]

    def _generation_prompt(self, kept: bool) -> list[Part]:
        if self.open_think and kept:
            return [self.ids[IM_START], "assistant\n", self.ids[THINK], "\n"]
        return [self.ids[IM_START], "assistant\n"]

    def _thought(self, message: dict[str, Any], kept: bool) -> list[Part]:
        if self.open_think and kept:  # the generation prompt opened the block
            return [(reasoning_of(message) or "") + "\n", self.ids[THINK_END], "\n\n"]
        return super()._thought(message, kept)

    def _call(self, name: str, arguments: Any) -> list[Part]:
        if not name and isinstance(arguments, str):  # a call parse could not read: its raw text
            return [self.ids[TOOL_CALL], arguments, self.ids[TOOL_CALL_END]]
        parameters = "".join(
            f"<parameter={key}>\n{xml_value(value)}\n</parameter>\n" for key, value in _mapping(arguments).items()
        )
        return [self.ids[TOOL_CALL], f"\n<function={name}>\n{parameters}</function>\n", self.ids[TOOL_CALL_END]]

    def _retention_breaks(self, message: dict[str, Any]) -> bool:
        return self.open_think or reasoning_of(message) is not None

    def _reasoning(self, body: list[int]) -> tuple[str | None, list[int] | None]:
        if not self.open_think:
            return super()._reasoning(body)
        think, end = self.ids[THINK], self.ids[THINK_END]
        if body[:1] == [think]:
            body = body[1:]
        if end not in body:  # still thinking when it stopped
            return self._decode_text(body), None
        at = body.index(end)
        return self._decode_text(body[:at]).removesuffix("\n"), body[at + 1 :]

    def _read_call(self, index: int, text: str) -> ToolCall:
        call_id = f"call_{index}"
        header = _FUNCTION.match(text)
        if header is None or not header.group(1).strip():
            return ToolCall(call_id, None, text)
        body = text[header.end() :]
        closing = body.rfind("</function>")
        if closing >= 0:
            body = body[:closing]
        parameters: dict[str, Any] = {}
        position = 0
        while (found := _PARAMETER.match(body, position)) is not None:
            start = found.end()
            end, position = _value_end(body, start)
            parameters[found.group(1)] = typed_value(body[start:end])
        return ToolCall(call_id, header.group(1), json.dumps(parameters, ensure_ascii=False))


def xml_value(value: Any) -> str:
    """A parameter value as the renderer writes it: a string as itself, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def typed_value(text: str) -> Any:
    """A parameter value read back (module docstring): a JSON number, object or array as that
    value, anything else as the string."""
    if _JSON_NUMBER.fullmatch(text):
        number = json.loads(text)
        return number if not isinstance(number, float) or math.isfinite(number) else text
    if text[:1] in ("{", "["):
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, (dict, list)):
            return value
    return text


def _value_end(body: str, start: int) -> tuple[int, int]:
    """Where the value starting at ``start`` ends, and where the next parameter may start: the
    first ``</parameter>`` followed by another parameter or by the end of the function."""
    search = start
    while (close := body.find(_CLOSE_PARAMETER, search)) >= 0:
        after = close + len(_CLOSE_PARAMETER)
        rest = body[after:]
        if not rest.strip() or rest.lstrip().startswith("<parameter="):
            end = close - 1 if close > start and body[close - 1] == "\n" else close
            return end, after
        search = after
    return len(body) - (1 if body.endswith("\n") and len(body) > start else 0), len(body)


def _mapping(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ValueError(f"XML tool-call arguments must be a JSON object, not {arguments[:80]!r}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"XML tool-call arguments must be a mapping, not {type(arguments).__name__}")
    return arguments
