"""Action formats: how a model's reply becomes one shell command or a submit (pure functions).

``tool``: native tool calls. The model has two tools, ``bash`` (``command``, and an optional
``timeout`` in seconds for that command) and ``submit`` (no arguments); a reply must call exactly
one of them. ``text``: the reply holds exactly one fenced code block (```` ```bash ````, ```` ```sh ````
or a bare fence); its contents are the command, and a block holding only ``:submit`` submits.

A reply that does not parse gives a ``ParseFailure`` whose ``message`` says what was wrong in
words the model can act on; the agent shows it to the model as the next observation. Guaranteed:
parsing never raises, whatever the reply holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

ActionFormat = Literal["tool", "text"]
ACTION_FORMATS: tuple[ActionFormat, ...] = ("tool", "text")
SUBMIT_TEXT = ":submit"

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run one shell command in the task's terminal: a persistent bash session, so the working "
            "directory and exported variables carry over between calls. Returns the exit code and the "
            "output (stdout and stderr together, long output cut in the middle)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line to run (non-interactive)."},
                "timeout": {
                    "type": "number",
                    "description": "Seconds before the command is stopped (optional; the default suits most commands).",
                },
            },
            "required": ["command"],
        },
    },
}
SUBMIT_TOOL = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "End the episode when the task is done: your work is then checked by tests you cannot see.",
        "parameters": {"type": "object", "properties": {}},
    },
}
TOOLS = [BASH_TOOL, SUBMIT_TOOL]


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the model wrote it: ``arguments`` is the raw JSON text; ``name`` is None
    when the call itself could not be read (its JSON was broken)."""

    id: str
    name: str | None
    arguments: str


@dataclass(frozen=True)
class Command:
    command: str
    timeout: float | None = None


@dataclass(frozen=True)
class Submit:
    pass


@dataclass(frozen=True)
class ParseFailure:
    message: str


Action = Command | Submit


def parse_tool_calls(calls: list[ToolCall]) -> Action | ParseFailure:
    """The one action a tool-format reply asks for."""
    if not calls:
        return ParseFailure("Your reply called no tool. Call `bash` with a command, or `submit` when the task is done.")
    if len(calls) > 1:
        return ParseFailure(f"Your reply called {len(calls)} tools. Call exactly one tool per reply.")
    call = calls[0]
    if call.name is None:
        return ParseFailure(f"Your tool call could not be read as JSON: {_excerpt(call.arguments)}")
    if call.name not in ("bash", "submit"):
        return ParseFailure(f"There is no tool named {call.name!r}. The tools are `bash` and `submit`.")
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ParseFailure(
            f"The arguments of `{call.name}` are not valid JSON ({exc.msg}): {_excerpt(call.arguments)}"
        )
    if not isinstance(arguments, dict):
        return ParseFailure(f"The arguments of `{call.name}` must be a JSON object.")
    if call.name == "submit":
        return Submit()
    return _command(arguments)


def _command(arguments: dict[str, Any]) -> Command | ParseFailure:
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return ParseFailure('`bash` needs a non-empty string argument "command".')
    timeout = arguments.get("timeout")
    if timeout is None:
        return Command(command)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        return ParseFailure('The "timeout" of `bash` must be a positive number of seconds.')
    return Command(command, float(timeout))


_FENCE = re.compile(r"^```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_SHELL_TAGS = ("", "bash", "sh", "shell", "console", "zsh")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def parse_text(content: str) -> Action | ParseFailure:
    """The one action a text-format reply asks for: its single fenced shell block (reasoning in
    ``<think>`` tags is ignored)."""
    visible = _THINK.sub("", content)
    blocks = [body for tag, body in _FENCE.findall(visible) if tag.lower() in _SHELL_TAGS]
    if not blocks:
        return ParseFailure(
            "Your reply has no fenced shell block. Reply with exactly one command in a ```bash block, "
            f"or a block holding only {SUBMIT_TEXT} when the task is done."
        )
    if len(blocks) > 1:
        return ParseFailure(f"Your reply has {len(blocks)} fenced shell blocks. Reply with exactly one per turn.")
    command = blocks[0].strip("\n")
    if command.strip() == SUBMIT_TEXT:
        return Submit()
    if not command.strip():
        return ParseFailure("Your shell block is empty. Put one command in it.")
    return Command(command)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """Hermes-style tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as
    Qwen2.5 and Qwen3 write them) out of raw completion text: the text without the calls, and the
    calls. An unterminated last call is read to the end; a call whose JSON is broken is kept with
    ``name=None`` so that the parse error reaches the model."""
    calls = []
    for index, body in enumerate(_HERMES.findall(text)):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            calls.append(ToolCall(f"call_{index}", None, body.strip()))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(f"call_{index}", None, body.strip()))
            continue
        arguments = data.get("arguments", {})
        text_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(f"call_{index}", data["name"], text_arguments))
    content = _HERMES.sub("", text).strip() if calls else text
    return content, calls


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def action_message(action_format: ActionFormat, action: Action) -> dict[str, Any]:
    """The assistant message that asks for ``action`` in ``action_format``: what a model that
    follows the format replies (a demonstration's reply; ``parse_*`` reads it back as ``action``)."""
    if action_format == "text":
        body = SUBMIT_TEXT if isinstance(action, Submit) else action.command
        return {"role": "assistant", "content": f"```bash\n{body}\n```"}
    arguments: dict[str, Any] = {}
    if isinstance(action, Submit):
        name = "submit"
    else:
        name, arguments = "bash", {"command": action.command}
        if action.timeout is not None:
            arguments["timeout"] = action.timeout
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}
