"""The agents without a model: ``null`` (submits at once), ``oracle`` (the task's reference solution)
and ``scripted`` (a fixed list of commands). Each leaves a transcript like any agent: the
environment records every step."""

from __future__ import annotations

from dataclasses import dataclass

from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.tasks import TaskError
from termgym.trial import Step


@dataclass(frozen=True)
class NullAgent:
    """Submits at once: what a verifier awards for doing nothing."""

    name: str = "null"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        return await env.step(SUBMIT)


@dataclass(frozen=True)
class OracleAgent:
    """Runs the task's reference solution as the agent, with the whole agent timeout."""

    name: str = "oracle"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        task = env.task
        if task.solution_script is None:
            raise TaskError(task.path, "the task has no reference solution")
        await env.upload(task.solution_files(), "/solution")
        step = await env.step(f"bash /solution/{task.solution_script}", timeout=env.agent_timeout)
        if env.done:
            return step
        return await env.step(SUBMIT)


@dataclass(frozen=True)
class ScriptedAgent:
    """Runs a fixed list of commands, then submits (tests and adversarial checks use it)."""

    commands: tuple[str, ...]
    name: str = "scripted"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        step = None
        for command in self.commands:
            step = await env.step(command)
            if env.done:
                return step
        return await env.step(SUBMIT)
