"""What the model agent says to the model (pure functions): the system prompt of each action format,
the first user turn, observations, and the summary request.

Observations carry the exit code (or that the command timed out), then the output cut head and tail:
first in characters (``max_chars``), then in tokens where the client has a tokenizer
(``cut_tokens``). The cut keeps the first and the last halves and says how much was elided, so the
model knows the output is incomplete.
"""

from __future__ import annotations

from collections.abc import Callable

from termgym.agents.actions import SUBMIT_TEXT, ActionFormat

TOOL_SYSTEM = """You operate a Linux terminal to complete the user's task.
Run commands with the `bash` tool, one per reply: it runs in a persistent bash session (the working directory and \
exported variables carry over) and returns the exit code and the output. Commands must be non-interactive: no \
editors, pagers or prompts waiting for input. Work step by step and check your results.
When the task is done, call the `submit` tool. Your work is then checked by tests you cannot see."""

TEXT_SYSTEM = f"""You operate a Linux terminal to complete the user's task.
In every reply, think briefly, then give exactly one shell command in a fenced block:
```bash
<command>
```
It runs in a persistent bash session (the working directory and exported variables carry over); the next message \
shows its exit code and output. Commands must be non-interactive: no editors, pagers or prompts waiting for input.
When the task is done, reply with a block holding only {SUBMIT_TEXT}:
```bash
{SUBMIT_TEXT}
```
Your work is then checked by tests you cannot see."""

SUMMARY_REQUEST = """Your context is nearly full. Write a summary of your work on this task so far, for yourself \
to continue from: what you have found out, what you have changed (files, paths, commands that worked), what \
remains to be done, and anything that failed. Do not call a tool; reply with the summary only."""

ELIDED = "[output elided to fit the context window]"


def system_prompt(action_format: ActionFormat) -> str:
    return TOOL_SYSTEM if action_format == "tool" else TEXT_SYSTEM


def task_prompt(instruction: str, workdir: str | None) -> str:
    where = f"\n\nYour working directory is {workdir}." if workdir else ""
    return instruction.strip() + where


def resume_prompt(instruction: str, workdir: str | None, summary: str) -> str:
    """The first user turn of a segment that continues from a summary."""
    return (
        task_prompt(instruction, workdir)
        + "\n\nYou have already worked on this task; your context was reset. Your summary of that work:\n\n"
        + summary.strip()
    )


def observation(
    output: str,
    exit_code: int | None,
    timed_out: bool,
    *,
    max_chars: int,
    cut_tokens: Callable[[str], str] | None = None,
) -> str:
    """The text the model sees after a command."""
    if timed_out:
        status = "The command timed out and was stopped."
    else:
        status = f"Exit code: {exit_code if exit_code is not None else 'unknown'}"
    body = cut_chars(output, max_chars)
    if cut_tokens is not None:
        body = cut_tokens(body)
    return f"{status}\n{body}" if body else f"{status}\n(no output)"


def cut_chars(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first and last halves around a
    line saying how many characters were elided."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]}\n[... {len(text) - head - tail} characters elided ...]\n{text[len(text) - tail :]}"


def cut_token_ids(ids: list[int], limit: int, decode: Callable[[list[int]], str]) -> str | None:
    """The head-and-tail cut of a text's token ids to ``limit`` tokens, decoded; None when it fits."""
    if len(ids) <= limit:
        return None
    head, tail = limit // 2, limit - limit // 2
    return f"{decode(ids[:head])}\n[... {len(ids) - head - tail} tokens elided ...]\n{decode(ids[len(ids) - tail :])}"
