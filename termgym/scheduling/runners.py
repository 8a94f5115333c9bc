"""Running one scheduled trial: the one runner of trials that the scheduler and the trainer share.

``run_paced_trial`` is ``termgym.trial.run_trial`` with two additions a scheduler needs: every
sandbox the trial makes waits for a creation slot from the shared pacer first (``paced_factory``:
the pacer wraps the sandbox factory, so the trial gets the backend's own sandbox, with every method
it has), unless its backend paces its own creation; and ``progress`` learns when the first creation
was granted and which environment the agent drives (a cancelled trial's turns are read from it).
``TrialRunner`` is the scheduler's ``Runner`` of trial records; the trainer's runner of
trajectories (``termgym.trainer.rollout.PolicyRunner``) runs its trials through the same function.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.spec import SandboxFactory, default_sandbox_factory, prewarm_sandboxes
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import Node
from termgym.tasks import Task
from termgym.trial import Agent, StepReturn, run_trial

T = TypeVar("T")


@dataclass
class TrialProgress:
    """What a running trial has reported, read when it is cancelled or carried."""

    created_at: float | None = None  # loop time its first sandbox's creation was granted by the pacer
    env: AsyncTerminalEnv | None = None
    launch: int | None = None  # its launch index in its step, set by the scheduler (None: not scheduled)

    @property
    def turns(self) -> int:
        return self.env.turns if self.env is not None else 0


class Runner(Protocol[T]):
    """What the scheduler launches. ``run_one`` returns a result (a ``TrialRecord`` here; the
    trainer's trajectory there) and raises only ``CancelledError`` (or ``SandboxError``, taken as a
    failed trial); it must acquire the shared pacer before creating a sandbox and fill
    ``progress`` as it goes (``run_paced_trial`` does both). A runner may also have ``async
    prewarm(tasks)``: the scheduler calls it after each step with the tasks the next step will draw
    (``TaskPool.peek``), and ``work_of(result)``: the trial's work on the scheduler's ``work``
    clock (without it, its turns)."""

    backend: str
    agent_name: str
    run_id: str

    async def run_one(self, task: Task, node: Node, version: int, progress: TrialProgress) -> T: ...

    def record_of(self, result: T) -> TrialRecord: ...


def paced_factory(
    factory: SandboxFactory, pacer: Pacer, progress: TrialProgress
) -> Callable[[Task, EnvOptions], Awaitable[Sandbox]]:
    """``factory`` whose every sandbox is handed out once ``pacer`` grants a creation, unless its
    backend paces its own create attempts (``Sandbox.paces_own_creation``: a create is never paced
    twice). The sandbox is the backend's own, not a wrapper. ``progress.created_at`` is the first
    grant's loop time."""

    async def make(task: Task, options: EnvOptions) -> Sandbox:
        made = factory(task, options)
        sandbox = await made if inspect.isawaitable(made) else made
        if sandbox.paces_own_creation:
            granted = asyncio.get_running_loop().time()
        else:
            granted = await pacer.acquire()
        if progress.created_at is None:
            progress.created_at = granted
        return sandbox

    return make


async def run_paced_trial(
    task: Task,
    agent: Agent,
    options: EnvOptions,
    pacer: Pacer,
    progress: TrialProgress,
    *,
    sandbox_factory: SandboxFactory | None = None,
) -> TrialRecord:
    """``run_trial`` of ``agent`` on ``task``, its sandboxes made by ``sandbox_factory`` (None: the
    options' backend) through ``paced_factory``, and ``progress`` told which environment it runs."""
    factory = paced_factory(sandbox_factory or default_sandbox_factory, pacer, progress)
    return await run_trial(task, _Watched(agent, progress), options, sandbox_factory=factory)


@dataclass(frozen=True)
class _Watched:
    """The agent, telling ``progress`` which env it drives (so a cancelled trial's turns are known)."""

    inner: Agent
    progress: TrialProgress

    @property
    def name(self) -> str:
        return self.inner.name

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        self.progress.env = env
        return await self.inner.run(env, instruction, info)


class TrialRunner:
    """``Runner`` of trial records: ``run_paced_trial`` with ``agent``. ``sandbox_factory``: None
    for the options' backend, or e.g. a ``SimulatedBackend``. Nodes and policy versions do not
    change what it runs."""

    def __init__(
        self, agent: Agent, options: EnvOptions, pacer: Pacer, *, sandbox_factory: SandboxFactory | None = None
    ) -> None:
        self.agent, self.options, self.pacer = agent, options, pacer
        self.sandbox_factory = sandbox_factory
        self.backend, self.agent_name, self.run_id = options.backend, agent.name, options.run_id

    async def run_one(self, task: Task, node: Node, version: int, progress: TrialProgress) -> TrialRecord:
        return await run_paced_trial(
            task, self.agent, self.options, self.pacer, progress, sandbox_factory=self.sandbox_factory
        )

    def record_of(self, result: TrialRecord) -> TrialRecord:
        return result

    async def prewarm(self, tasks: Sequence[Task]) -> int:
        """Sandboxes for trials of ``tasks`` made ready ahead of them (``prewarm_sandboxes``)."""
        return await prewarm_sandboxes(tasks, self.options)
