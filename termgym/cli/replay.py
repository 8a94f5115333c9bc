"""A transcript (``termgym.transcript``) shown in the terminal: per turn the model's reply (cut),
the command, its exit code and duration, and its output cut to a few lines head and tail. All text
from the sandbox or the model goes through ``terminal_safe``: it cannot move the cursor or change
colours."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from termgym.output import plain_text as plain
from termgym.output import terminal_safe


def print_transcript(console: Console, data: dict[str, Any], *, output_lines: int = 12, reply_lines: int = 6) -> None:
    model = f" ({data['model']})" if data.get("model") else ""
    usage = data.get("usage") or {}
    tokens = (
        f" · tokens {usage.get('prompt_tokens', 0)} prompt / {usage.get('completion_tokens', 0)} completion"
        if usage.get("requests")
        else ""
    )
    header = (
        f" · agent {data.get('agent') or '?'}{model} · stop {data.get('stop_reason') or '-'}"
        f" · {len(data.get('turns', []))} turns · {data.get('parse_errors', 0)} parse errors{tokens}"
    )
    console.print(Text.assemble((terminal_safe(data.get("task", "")), "bold"), plain(header)))
    for turn in data.get("turns", []):
        _print_turn(console, turn, output_lines=output_lines, reply_lines=reply_lines)
    segments = data.get("segments") or []
    if len(segments) > 1:
        reasons = ", ".join(s.get("reason", "?") for s in segments[1:])
        console.print(plain(f"{len(segments)} segments (new ones after: {reasons})"), style="dim")
    for note in data.get("notes") or []:
        console.print(Text.assemble(("note", "yellow"), plain(f" {note}")))


def _print_turn(console: Console, turn: dict[str, Any], *, output_lines: int, reply_lines: int) -> None:
    action, reply, result = turn.get("action") or {}, turn.get("reply"), turn.get("result")
    console.print(Text(f"── turn {turn.get('index', '?')}", style="dim"))
    if reply:
        content = (reply.get("content") or "").strip()
        if content:
            console.print(Text.assemble(("model ", "cyan"), plain(_cut_lines(content, reply_lines))))
        if reply.get("reasoning"):
            console.print(plain(f"  (reasoning: {len(reply['reasoning'])} characters)"), style="dim")
    kind = action.get("kind")
    if kind == "invalid":
        console.print(Text.assemble(("invalid reply ", "red"), plain(action.get("error", ""))))
        return
    if kind == "submit":
        console.print(Text("submit", style="green"))
        return
    console.print(Text.assemble(("$ ", "bold"), plain(action.get("command", ""))))
    if result is None:
        return
    status = "timed out" if result.get("timed_out") else f"exit {result.get('exit_code')}"
    console.print(plain(f"{status} · {float(result.get('duration') or 0):.2f}s"), style="dim")
    output = (result.get("output") or "").rstrip("\n")
    if output:
        console.print(plain(_cut_lines(output, output_lines)))


def _cut_lines(text: str, limit: int) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    head, tail = limit - limit // 2, limit // 2
    return "\n".join([*lines[:head], f"[... {len(lines) - head - tail} lines ...]", *lines[len(lines) - tail :]])
