"""One trial: a fresh environment, an agent driving it to the end, verification, and its record.

``run_trial`` always returns a ``TrialRecord``: infrastructure faults (the sandbox failed, the build
failed) become the record's ``error``, never an exception; only cancellation propagates, after the
sandbox has been stopped. A sandbox the agent broke is ``broken_by_agent`` (``termgym.env.fault``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from termgym.aio import gather_limited
from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions, fault
from termgym.errors import ConfigError, EnvironmentBuildError, SandboxError
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox
from termgym.tasks import Task, TaskError

Step = tuple[str, float, bool, bool, dict]


class Agent(Protocol):
    """What drives an episode: named in its trial's record."""

    @property
    def name(self) -> str: ...

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        """Drive ``env`` until the episode ends; return the final step (None if it never stepped)."""


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


AGENTS = {"oracle": OracleAgent, "null": NullAgent}


def make_agent(name: str) -> Agent:
    if name not in AGENTS:
        raise ConfigError(f"unknown agent {name!r}; choose one of: {', '.join(AGENTS)}")
    return AGENTS[name]()


async def run_trial(
    task: Task,
    agent: Agent,
    options: EnvOptions,
    *,
    sandbox_factory: Callable[[Task, EnvOptions], Sandbox] | None = None,
) -> TrialRecord:
    started = time.monotonic()
    record = TrialRecord(
        task=task.name,
        backend=options.backend,
        agent=agent.name,
        run_id=options.run_id,
        trial_id=uuid.uuid4().hex[:12],
        family=task.family,
    )
    env = AsyncTerminalEnv(task, options, sandbox_factory=sandbox_factory)
    try:
        async with env:
            instruction, info = await env.reset()
            step = await agent.run(env, instruction, info)
            record = _fill(record, env, step)
    except EnvironmentBuildError as exc:
        record.error = {"kind": "build_failed", "message": str(exc)}
        record.logs["build"] = exc.log[-20000:]
    except SandboxError as exc:
        record.error = fault(exc, agent_acted=env.turns > 0)
    except ConfigError as exc:
        record.error = {"kind": "invalid_task", "message": str(exc)}
    record.turns = record.turns or env.turns
    record.timings = {**env.timings, "total": time.monotonic() - started}
    record.warnings = record.warnings or list(env.warnings)
    record.system_changes = env.system_changes
    return record


AgentT = TypeVar("AgentT", bound=Agent)


async def run_trials(
    jobs: Sequence[tuple[Task, AgentT]],
    options: EnvOptions,
    *,
    concurrency: int,
    on_record: Callable[[TrialRecord, AgentT], None] | None = None,
) -> list[TrialRecord]:
    """Every ``(task, agent)`` trial of ``jobs``, at most ``concurrency`` at once. ``on_record`` gets
    each record (with its job's agent) as soon as its trial ends; the records come back in job
    order. Like ``run_trial``, a trial's fault is its record's error, never an exception."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")

    async def one(task: Task, agent: AgentT) -> TrialRecord:
        record = await run_trial(task, agent, options)
        if on_record is not None:
            on_record(record, agent)
        return record

    return await gather_limited([lambda t=task, a=agent: one(t, a) for task, agent in jobs], concurrency)


def _fill(record: TrialRecord, env: AsyncTerminalEnv, step: Step | None) -> TrialRecord:
    record = replace(record, turns=env.turns, error=env.error, warnings=list(env.warnings))
    verification = env.verification
    if verification is None:
        return record
    report = verification.report
    record.resolved = report.resolved
    record.reward = verification.reward
    record.passed = report.passed
    record.total = report.total
    record.assertions = [{"name": a.name, "passed": a.passed} for a in report.assertions if a.status != "skipped"]
    record.report_format = report.format
    record.logs["verifier"] = verification.output[-20000:]
    return record
