"""termgym as an inspect-ai sandbox provider (``sandbox=("termgym", TASK)``) and scorer
(``termgym_scorer``).

inspect finds the provider through the package's ``inspect_ai`` entry point. A sample's sandbox
is one termgym episode (``AsyncTerminalEnv``) of the task the sandbox config names (a task, or a
``TermgymSandboxConfig``), started as termgym starts it; the agent's commands reach it through
``exec`` as the task's agent user. ``termgym_scorer()`` ends the episode and grades it with the
task's own verifier, by the very path ``termgym run`` takes, into a ``Score`` whose value is
``{"resolved": 1 or 0, "reward": passed / S}`` and whose metadata holds the assertions.

Faults are inspect's exceptions (a command's own timeout is ``TimeoutError``, never retried: a retry
would run it twice); a task that cannot run fails the eval at its start in one line
(``PrerequisiteError``); ``inspect sandbox cleanup termgym [ID]`` removes what a killed eval left.
Each exception, and the settings: docs/guides/frameworks.md#inspect-ai."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Literal, overload

from inspect_ai._util.error import PrerequisiteError
from inspect_ai.dataset import Sample
from inspect_ai.scorer import Score, Scorer, Target, accuracy, mean, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import ExecResult as InspectExecResult
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxEnvironmentSpec,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandbox,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict

from termgym.agents.prompts import task_prompt
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.errors import BackendUnavailable, ConfigError, SandboxError, TermgymError
from termgym.integrations import sandbox_io
from termgym.integrations.outcome import outcome
from termgym.sandboxes import BACKENDS, attach_sandbox, close_backends, preflight, remove_leftovers
from termgym.tasks import Task
from termgym.tasks.bundled import resolve_task

PROVIDER = "termgym"
ROOT_USERS = ("root", "0")


class TermgymSandboxConfig(BaseModel):
    """A termgym sandbox: the task (a directory or a bundled name), the backend, and the run's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    backend: str = "local"
    agent_timeout: float | None = None  # the cap of a command without a timeout; None: the task's agent timeout
    reward_scale: int | None = None  # S in passed / S; None: termgym's default
    tamper: Literal["fail", "warn"] = "fail"

    def env_options(self) -> EnvOptions:
        options = EnvOptions(backend=self.backend, agent_timeout=self.agent_timeout, tamper=self.tamper)
        return options if self.reward_scale is None else replace(options, reward_scale=self.reward_scale)


def read_config(config: SandboxEnvironmentConfigType | None) -> TermgymSandboxConfig:
    """The config inspect hands over: a task (str), a ``TermgymSandboxConfig``, or its fields as a
    model of another class; ``ConfigError`` for none."""
    if isinstance(config, TermgymSandboxConfig):
        return config
    if isinstance(config, str) and config.strip():
        return TermgymSandboxConfig(task=config)
    if isinstance(config, BaseModel):
        return TermgymSandboxConfig(**config.model_dump())
    raise ConfigError('the termgym sandbox needs a task: sandbox=("termgym", "TASK_DIR_OR_NAME")')


def check_config(config: SandboxEnvironmentConfigType | None) -> tuple[TermgymSandboxConfig, Task, EnvOptions]:
    """The config, its task and options, checked as far as can be before a sandbox starts:
    ``ConfigError`` (an unknown task, a multi-step one, a bad setting) or ``BackendUnavailable``."""
    settings = read_config(config)
    task = resolve_task(settings.task)
    if task.steps:
        raise ConfigError(f"{task.name}: a multi-step task cannot run in inspect (its scorer sees one submission)")
    options = settings.env_options()
    preflight(options.backend)
    return settings, task, options


@sandboxenv(name=PROVIDER)
class TermgymSandboxEnvironment(SandboxEnvironment):
    """One sample's termgym sandbox: ``env`` is its episode, from ``sample_init`` to ``sample_cleanup``."""

    def __init__(self, env: AsyncTerminalEnv) -> None:
        super().__init__()
        self.env = env
        self.verdict: dict[str, Any] | None = None  # set by verify(): what the scorer reports

    # -- lifecycle (class methods inspect calls) -------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return TermgymSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        try:
            check_config(config)
        except (TermgymError, ValueError) as exc:
            raise PrerequisiteError(f"termgym sandbox: {_one_line(exc)}") from None

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        try:
            _, task, options = check_config(config)
        except (TermgymError, ValueError) as exc:
            raise PrerequisiteError(f"termgym sandbox: {_one_line(exc)}") from None
        env = AsyncTerminalEnv(task, options)
        try:
            await env.reset()
        except SandboxError as exc:
            raise SandboxUnavailableError(f"termgym could not start a sandbox for {task.name}: {exc}") from None
        return {"default": cls(env)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            await environment.as_type(cls).env.close()

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        await close_backends()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        for line in await clean_up(id):
            print(line)

    # -- the sandbox API ---------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> InspectExecResult[str]:
        box = self._sandbox()
        limit = float(timeout) if timeout is not None else self.env.agent_timeout
        cap = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        run_as = self._user(user)
        self.env.count_outside_command()
        try:
            output = await sandbox_io.run(
                box,
                run_as,
                cmd,
                timeout=limit,
                cwd=sandbox_io.resolve(cwd or ".", box.workdir),
                env={**self.env.agent_env(), **(env or {})},
                cap=cap,
                stdin=input.encode() if isinstance(input, str) else input,
            )
        except (SandboxError, sandbox_io.WrapperFailed) as exc:
            raise SandboxUnavailableError(f"termgym sandbox: {exc}") from None
        if output.timed_out:
            raise TimeoutError(f"Command timed out after {limit:g} seconds")
        stdout, stderr = _text(output.stdout), _text(output.stderr)
        if output.over_limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stdout + stderr)
        assert output.returncode is not None
        return InspectExecResult(output.returncode == 0, output.returncode, stdout, stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        box = self._sandbox()
        path = sandbox_io.resolve(file, box.workdir)
        data = contents.encode() if isinstance(contents, str) else contents
        try:
            failure = await sandbox_io.write_file(box, self._user(None), path, data, env=self.env.agent_env())
        except SandboxError as exc:
            raise SandboxUnavailableError(f"termgym sandbox: {exc}") from None
        if not failure:
            return
        lowered = failure.casefold()
        if "is a directory" in lowered:
            raise IsADirectoryError(f"{file} is a directory")
        if "permission denied" in lowered or "read-only" in lowered:
            raise PermissionError(f"cannot write {file}: {failure}")
        raise RuntimeError(f"cannot write {file}: {failure}")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        box = self._sandbox()
        path = sandbox_io.resolve(file, box.workdir)
        cap = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data, status, failure = await sandbox_io.read_file(
                box, self._user(None), path, cap=cap, env=self.env.agent_env()
            )
        except SandboxError as exc:
            raise SandboxUnavailableError(f"termgym sandbox: {exc}") from None
        if data is None:
            errors = {2: FileNotFoundError, 21: IsADirectoryError, 13: PermissionError}
            raise errors.get(status, RuntimeError)(f"cannot read {file}: {failure}")
        if len(data) > cap:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode("utf-8") if text else data

    # -- grading -----------------------------------------------------------------------------------

    async def verify(self) -> dict[str, Any]:
        """End the episode and verify it (once: later calls return the same verdict): ``resolved``
        (1 or 0), ``reward``, and the assertions, stop reason, error and verifier output."""
        if self.verdict is not None:
            return self.verdict
        if self.env.done:
            raise SandboxUnavailableError("termgym sandbox: the episode has already ended")
        _, reward, _, _, info = await self.env.step(SUBMIT)
        self.verdict = outcome(reward, info, self.env.transcript.stop_reason)
        return self.verdict

    # -- helpers -----------------------------------------------------------------------------------

    def _sandbox(self) -> Any:
        box = self.env.sandbox
        if box is None or self.env.done:
            raise SandboxUnavailableError("termgym sandbox: the episode has ended; its sandbox is gone")
        return box

    def _user(self, user: str | None) -> str | None:
        """Who a command runs as: the task's agent user by default; another user where the backend
        can run as one, or root where root is already the default."""
        default = self.env.agent_user
        if user is None or user == default:
            return default
        box = self._sandbox()
        if box.supports_users:
            return user
        if default is None and user in ROOT_USERS:
            return None
        raise SandboxUserUnsupportedError(f"the termgym {box.backend} backend cannot run a command as {user!r}")


@scorer(metrics={"resolved": [accuracy(), stderr()], "reward": [mean(), stderr()]})
def termgym_scorer() -> Scorer:
    """Grade a sample with its termgym task's own verifier (``TermgymSandboxEnvironment.verify``)."""

    async def score(state: TaskState, target: Target) -> Score:
        verdict = await sandbox().as_type(TermgymSandboxEnvironment).verify()
        error = verdict["error"]
        explanation = (
            f"{verdict['passed']}/{verdict['total']} assertions passed; stop reason {verdict['stop_reason']}"
            + (f"; error {error['kind']}: {error['message']}" if error else "")
        )
        metadata = {key: value for key, value in verdict.items() if key not in ("resolved", "reward")}
        return Score(
            value={"resolved": verdict["resolved"], "reward": verdict["reward"]},
            explanation=explanation,
            metadata=metadata,
        )

    return score


def termgym_samples(tasks: Iterable[str], *, backend: str = "local", **settings: Any) -> list[Sample]:
    """One inspect ``Sample`` per termgym task (a directory or a bundled name): the instruction as
    its input, its own termgym sandbox (``settings``: the other ``TermgymSandboxConfig`` fields).
    ``ConfigError`` for an unknown task."""
    samples = []
    for name in tasks:
        task = resolve_task(name)
        config = TermgymSandboxConfig(task=str(task.path), backend=backend, **settings)
        samples.append(
            Sample(
                id=task.name,
                input=task_prompt(task.instruction, None),
                sandbox=SandboxEnvironmentSpec(PROVIDER, config),
                metadata={"task": task.name, "family": task.family},
            )
        )
    return samples


async def clean_up(sandbox_id: str | None) -> list[str]:
    """``inspect sandbox cleanup termgym [ID]``: without an id, ``termgym gc`` on every backend this
    machine can reach; with one, that kept sandbox stopped on whichever backend has it. One line each."""
    lines = []
    try:
        for backend in BACKENDS:
            try:
                preflight(backend)
            except BackendUnavailable:
                continue
            if sandbox_id is None:
                lines.append(f"{backend}: {await remove_leftovers(backend)}")
                continue
            try:
                kept = await attach_sandbox(backend, sandbox_id)
            except ConfigError:
                continue
            await kept.stop()
            return [f"removed kept {backend} sandbox {sandbox_id}"]
    finally:
        await close_backends()
    if sandbox_id is not None:
        return [f"no kept termgym sandbox {sandbox_id!r} on any backend here"]
    return lines or ["no termgym backend can run on this machine: nothing to clean up"]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
