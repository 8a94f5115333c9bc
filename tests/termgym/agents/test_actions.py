"""The action formats: every reply parses to one command, a submit, or a failure the model can act on."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from termgym.agents.actions import (
    Command,
    ParseFailure,
    Submit,
    ToolCall,
    action_message,
    parse_hermes,
    parse_text,
    parse_tool_calls,
)


def bash(arguments: object, name: str | None = "bash") -> ToolCall:
    return ToolCall("c0", name, arguments if isinstance(arguments, str) else json.dumps(arguments))


def test_one_bash_call_is_its_command_and_timeout():
    assert parse_tool_calls([bash({"command": "ls -la"})]) == Command("ls -la")
    assert parse_tool_calls([bash({"command": "make", "timeout": 30})]) == Command("make", 30.0)


def test_submit_takes_no_arguments_and_ignores_empty_ones():
    assert parse_tool_calls([bash({}, "submit")]) == Submit()
    assert parse_tool_calls([bash("", "submit")]) == Submit()


@pytest.mark.parametrize(
    ("calls", "says"),
    [
        ([], "called no tool"),
        ([bash({"command": "a"}), bash({"command": "b"})], "called 2 tools"),
        ([bash({"command": "ls"}, "python")], "no tool named 'python'"),
        ([bash('{"command": ')], "not valid JSON"),
        ([bash('["ls"]')], "must be a JSON object"),
        ([bash({"command": ""})], "non-empty string"),
        ([bash({"command": 3})], "non-empty string"),
        ([bash({"command": "ls", "timeout": -1})], "positive number"),
        ([bash({"command": "ls", "timeout": True})], "positive number"),
        ([ToolCall("c0", None, "<garbled>")], "could not be read"),
    ],
)
def test_a_bad_tool_reply_says_what_was_wrong(calls, says):
    result = parse_tool_calls(calls)
    assert isinstance(result, ParseFailure) and says in result.message


def test_text_format_takes_exactly_one_fenced_shell_block():
    assert parse_text("I will list.\n```bash\nls -la /app\n```\n") == Command("ls -la /app")
    assert parse_text("```\necho hi\n```") == Command("echo hi")
    assert parse_text("```sh\nfor f in *; do\n  echo $f\ndone\n```") == Command("for f in *; do\n  echo $f\ndone")
    assert parse_text("Done.\n```bash\n:submit\n```") == Submit()


def test_text_format_ignores_other_languages_and_reasoning():
    reply = "<think>maybe ```bash\nrm -rf /\n``` no</think>Here:\n```python\nprint(1)\n```\n```bash\npwd\n```"
    assert parse_text(reply) == Command("pwd")


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ("just talk", "no fenced shell block"),
        ("```bash\nls\n```\n```bash\npwd\n```", "2 fenced shell blocks"),
        ("```bash\n\n```", "empty"),
    ],
)
def test_a_bad_text_reply_says_what_was_wrong(reply, says):
    result = parse_text(reply)
    assert isinstance(result, ParseFailure) and says in result.message


def test_hermes_calls_are_read_from_raw_text():
    text = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    content, calls = parse_hermes(text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("bash", {"command": "ls"})]


def test_hermes_keeps_broken_and_unterminated_calls_so_the_model_hears_of_them():
    content, calls = parse_hermes('<tool_call>{"name": "bash", "arguments": {"command": "ls"}')
    assert content == "" and calls[0].name is None
    assert isinstance(parse_tool_calls(calls), ParseFailure)
    _, two = parse_hermes('<tool_call>{"name": "submit"}</tool_call><tool_call>{"name": "submit"}</tool_call>')
    assert len(two) == 2 and parse_tool_calls(two[:1]) == Submit()


def test_text_without_calls_is_unchanged():
    assert parse_hermes("no calls here") == ("no calls here", [])


@given(st.text())
def test_parsing_never_raises(reply):
    parse_text(reply)
    _, calls = parse_hermes(reply)
    parse_tool_calls(calls)
    parse_tool_calls([ToolCall("x", "bash", reply)])


@pytest.mark.parametrize("action", [Command("ls -la /app"), Command("sleep 2", timeout=30.0), Submit()])
def test_the_message_of_an_action_parses_back_to_it_in_either_format(action):
    text = action_message("text", Command(action.command) if isinstance(action, Command) else action)
    assert parse_text(text["content"]) == (Command(action.command) if isinstance(action, Command) else action)
    tool = action_message("tool", action)
    (call,) = tool["tool_calls"]
    arguments = json.dumps(call["function"]["arguments"])
    assert parse_tool_calls([ToolCall(call["id"], call["function"]["name"], arguments)]) == action
