"""``termgym shell``: step a task's environment by hand."""

from __future__ import annotations

import argparse
import asyncio
import uuid

from rich.text import Text

from termgym.cli import common
from termgym.cli.common import UsageError
from termgym.cli.episodes import print_record
from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions, resolve_task
from termgym.images.build import load_aliases
from termgym.output import plain_text as plain
from termgym.output import terminal_safe
from termgym.overrides import override_fields
from termgym.records import TrialRecord
from termgym.sandboxes import preflight
from termgym.tasks import Task


async def cmd_shell(args: argparse.Namespace) -> int:
    if args.task is None:
        raise UsageError("shell needs a task (or --attach ID)")
    task = resolve_task(args.task)
    await asyncio.to_thread(preflight, args.backend)
    options = EnvOptions(
        backend=args.backend,
        max_turns=args.max_turns,
        run_id=f"shell-{uuid.uuid4().hex[:8]}",
        image_aliases=load_aliases(args.image_alias),
        **override_fields(args),
    )
    async with AsyncTerminalEnv(task, options) as env:
        instruction, info = await env.reset()
        header = plain(f" ({info['backend']}) · {SUBMIT} verifies · :quit leaves\n")
        common.out.print(Text.assemble((terminal_safe(task.name), "bold"), header))
        common.out.print(plain(instruction))
        for warning in info["warnings"]:
            common.err.print(plain(f"warning: {warning}"))
        cwd = info["workdir"]
        while True:
            try:
                line = await asyncio.to_thread(_read_command, terminal_safe(f"{cwd}$ "))
            except EOFError:
                line = ":quit"
            if line is None or not line.strip():
                continue
            if line.strip() == ":quit":
                return 0
            action = SUBMIT if line.strip() == SUBMIT else line
            obs, reward, terminated, truncated, step_info = await env.step(action)
            if obs:
                shown = terminal_safe(obs)
                common.out.print(Text(shown), end="" if shown.endswith("\n") else "\n")
            cwd = step_info.get("cwd") or cwd
            if terminated or truncated:
                _print_final(task, step_info, reward)
                return 0


def _read_command(prompt: str) -> str | None:
    lines = [input(prompt)]
    while lines[-1].endswith("\\"):
        lines.append(input("> "))
    return "\n".join(lines)


def _print_final(task: Task, info: dict, reward: float) -> None:
    record = TrialRecord(task=task.name, backend="", agent="human", reward=reward)
    record.assertions = info.get("assertions", [])
    record.resolved, record.passed, record.total = (
        info.get("resolved", False),
        info.get("passed", 0),
        info.get("total", 0),
    )
    record.report_format, record.error = info.get("report_format"), info.get("error")
    record.warnings = list(info.get("warnings", []))
    record.agent = "you"
    print_record(record)
