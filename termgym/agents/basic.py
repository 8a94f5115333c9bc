"""The agents without a model: ``null`` (submits at once), ``oracle`` (the task's reference solution)
and ``scripted`` (a fixed list of commands). Each leaves a transcript like any agent: the
environment records every step."""

from __future__ import annotations

from dataclasses import dataclass

from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.tasks import TaskError
from termgym.trial import StepReturn


@dataclass(frozen=True)
class NullAgent:
    """Submits at once (every step of a multi-step task): what a verifier awards for doing nothing."""

    name: str = "null"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        return await submit_every_step(env)


@dataclass(frozen=True)
class OracleAgent:
    """Runs the task's reference solution as the agent, with the whole agent timeout. A
    multi-step task's steps each run their own solution (``steps/<name>/solution``), uploaded to
    ``/solution`` when the step begins, then submit; a step without one is submitted as is."""

    name: str = "oracle"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        if not env.task.steps and env.task.solution_script is None:
            raise TaskError(env.task.path, "the task has no reference solution")
        if env.task.steps and all(step.solution_script is None for step in env.task.steps):
            raise TaskError(env.task.path, "no step of the task has a reference solution")
        while True:
            task = env.current_task
            if task.solution_script is not None:
                await env.upload(task.solution_files(), "/solution")
                step = await env.step(f"bash /solution/{task.solution_script}", timeout=env.agent_timeout)
                if env.done:
                    return step
            step = await env.step(SUBMIT)
            if env.done:
                return step


@dataclass(frozen=True)
class ScriptedAgent:
    """Runs a fixed list of commands, then submits (tests and adversarial checks use it); the
    later steps of a multi-step task are submitted as they are."""

    commands: tuple[str, ...]
    name: str = "scripted"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        step = None
        for command in self.commands:
            step = await env.step(command)
            if env.done:
                return step
        return await submit_every_step(env)


async def submit_every_step(env: AsyncTerminalEnv) -> StepReturn:
    """SUBMIT until the episode ends: once for a single-step task, once per remaining step of a
    multi-step one (each SUBMIT before the last hands over the next step)."""
    while True:
        step = await env.step(SUBMIT)
        if env.done:
            return step
