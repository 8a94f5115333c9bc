"""The async terminal environment: an agent's shell commands in, observations and the reward out.

Gymnasium semantics: ``reset(*, seed, options) -> (obs, info)`` starts a fresh sandbox and shell
(obs is the task's instruction); ``step(action) -> (obs, reward, terminated, truncated, info)``.
An action is one shell command, or ``SUBMIT`` to end the episode. ``terminated`` means the agent
submitted; ``truncated`` means the turn budget or the agent timeout ran out, or the agent gave up
on a budget of its own (``truncate(reason)``). Every step goes into ``env.transcript``
(``termgym.transcript``), with the episode's stop reason. The reward comes on the final step, after
verification; every other step gives 0.0. ``async with`` stops the sandbox on every path out,
exceptions and cancellation included.

Outcomes the agent cannot erase: once the agent has run a command, a sandbox that stops working
from inside (``SandboxBroken``) ends the episode with reward 0 and error kind ``broken_by_agent``,
which no scheduler retries; ``sandbox_error`` is left for faults of the infrastructure.

Harbor's task features (network per phase, the healthcheck, users, artifacts, multi-step tasks:
a ``SUBMIT`` before the last step returns the next step's instruction, ``info["step"]``):
docs/guides/tasks.md#healthchecks-users-network-phases-artifacts-and-steps."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from termgym.aio import run_to_end
from termgym.episode.options import EnvOptions
from termgym.episode.outcomes import fault, fault_stop_reason, verification_error
from termgym.episode.overrides import apply_overrides
from termgym.episode.persistent_shell import CommandResult, PersistentShell
from termgym.episode.phases import Phases
from termgym.episode.spec import SandboxFactory, default_sandbox_factory
from termgym.episode.spec import prewarm_sandboxes as prewarm_sandboxes  # held for trainer/rollout.py
from termgym.episode.steps import Grade, StepResult, combine, step_task
from termgym.episode.verification import Verification
from termgym.errors import ConfigError, EpisodeError, SandboxError
from termgym.records import TrialError
from termgym.sandboxes.base import Sandbox, agent_env
from termgym.sandboxes.capabilities import keep
from termgym.sandboxes.files import upload_files
from termgym.tasks import Task
from termgym.tasks.bundled import resolve_task
from termgym.transcript import StopReason, Transcript

# Defined here; what the environment is made with lives where it is defined (termgym.episode.options,
# termgym.episode.spec, termgym.episode.outcomes, termgym.tasks.bundled): one import path per name.
__all__ = ["SUBMIT", "AsyncTerminalEnv", "format_observation", "make"]

SUBMIT = ":submit"


def format_observation(result: CommandResult) -> str:
    """What the agent sees of a command: its output, then its status when that is not plain success."""
    notes = []
    if result.timed_out:
        notes.append("[command timed out]")
    elif result.interrupted:
        notes.append("[interrupted]")
    elif result.exit_code not in (0, None):
        notes.append(f"[exit code {result.exit_code}]")
    return (
        result.output
        + ("\n" if result.output and not result.output.endswith("\n") and notes else "")
        + "\n".join(notes)
    )


class AsyncTerminalEnv:
    """One task, one sandbox per episode. Not safe for concurrent steps on one instance."""

    def __init__(
        self,
        task: Task,
        options: EnvOptions | None = None,
        *,
        sandbox_factory: SandboxFactory | None = None,
        attached: Sandbox | None = None,
    ) -> None:
        self.options = options or EnvOptions()
        self.original_task = task
        # the task as the run's overrides change it; what applied goes in the record
        self.task, self.overrides, self._override_warnings = apply_overrides(task, self.options.overrides)
        self.run_id = self.options.run_id or uuid.uuid4().hex[:12]
        self._factory = sandbox_factory or default_sandbox_factory
        # a sandbox already started (termgym.sandboxes.attach_sandbox): the first reset() enters it
        # instead of starting one; close() then ends (or with keep, keeps) it like any other
        self._attached = attached
        self.sandbox: Sandbox | None = None
        self._shell: PersistentShell | None = None
        self.turns = 0
        self.done = True
        self._deadline = 0.0
        self.timings: dict[str, float] = {}
        self.verification: Verification | None = None
        self.error: TrialError | None = None
        self.warnings: list[str] = []
        self.system_changes: list[str] | None = None
        self.image: dict[str, str] = {}  # the image the episode's sandbox ran (Sandbox.image)
        self.node = ""  # the cluster node the episode's sandbox ran on (Sandbox.node_name; '' here)
        self.kept: dict[str, str] | None = None  # --keep: the sandbox left running (capabilities.keep)
        # Harbor's task features (the episode runtime section of the module docstring)
        self.trial_dir: Path | None = None  # set by run_trial before reset(): where artifacts are copied to
        self.artifacts: list[str] = []  # the files copied out, relative to trial_dir
        self.step_index = 0  # the multi-step task's current step
        self.step_results: list[StepResult] = []  # the multi-step task's verified steps, in order
        self.grade: Grade | None = None  # the multi-step task's grade (multi_step_reward_strategy)
        self._phases = Phases(self.task, self.options, self._new_sandbox, self._warn)
        self.transcript = Transcript(task=task.name, instruction=task.instruction)
        self._interrupt = asyncio.Event()

    def interrupt(self) -> None:
        """Stop the command the current step runs, as a timeout would (the shell and its state
        stay); the step returns its output so far, noted ``[interrupted]``, and counts as a turn.
        No effect between steps. For ``termgym shell``'s Ctrl-C; call it on the env's loop."""
        self._interrupt.set()

    @property
    def agent_timeout(self) -> float:
        """The agent timeout of this episode, or of the current step of a multi-step task."""
        return self.options.agent_timeout or self.current_task.agent_timeout_sec

    @property
    def current_task(self) -> Task:
        """The task as the current step sees it (``termgym.episode.steps.step_task``); the task itself
        when it has no ``[[steps]]``."""
        if not self.task.steps:
            return self.task
        return step_task(self.task, self.task.steps[min(self.step_index, len(self.task.steps) - 1)])

    @property
    def agent_user(self) -> str | None:
        """Who the agent's commands run as in this episode (the task's ``[agent].user`` where the
        backend supports users); None: the sandbox's default user."""
        return self._phases.agent_user

    @property
    def remaining_time(self) -> float:
        """Seconds of the agent timeout left in this episode (0 once it has run out)."""
        return max(0.0, self._deadline - time.monotonic()) if not self.done else 0.0

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start a fresh episode in a fresh sandbox. ``seed`` is accepted for Gymnasium; the episode
        itself is deterministic given the task."""
        await self.close()
        self.turns, self.done, self.verification, self.error = 0, False, None, None
        self.timings, self.warnings, self.system_changes = {}, [], None
        self.step_index, self.step_results, self.grade, self.artifacts = 0, [], None, []
        self._phases.reset()
        instruction = self.current_task.instruction
        self.transcript = Transcript(task=self.task.name, instruction=instruction)
        started = time.monotonic()
        attached, self._attached = self._attached, None
        self.sandbox = attached or await self._new_sandbox()
        try:
            if attached is None:
                await self.sandbox.start()
            healthcheck = await self._phases.prepare_agent_phase(self.sandbox)
            if healthcheck is not None:
                self.timings["healthcheck"] = healthcheck
            self._shell = self._new_shell()
            await self._shell.start()
        except BaseException:
            await self.close()
            raise
        self.timings["setup"] = time.monotonic() - started
        phase_warnings = self.warnings
        self.warnings = [*self._override_warnings, *self.task.warnings, *self.sandbox.warnings]
        self.warnings += [w for w in phase_warnings if w not in self.warnings]
        self.image = dict(self.sandbox.image)
        self.node = self.sandbox.node_name
        self._deadline = time.monotonic() + self.agent_timeout
        info = {
            "task": self.task.name,
            "backend": self.sandbox.backend,
            "workdir": self.sandbox.workdir,
            "max_turns": self.options.max_turns,
            "agent_timeout": self.agent_timeout,
            "warnings": list(self.warnings),
        }
        if self.task.steps:
            info.update(step=0, steps=len(self.task.steps))
        return instruction, info

    async def step(self, action: str, *, timeout: float | None = None) -> tuple[str, float, bool, bool, dict]:
        """Run one command (``timeout``: this command's limit, default the env's command timeout;
        the agent timeout caps it either way), or verify on ``SUBMIT``."""
        if self.done or self._shell is None:
            raise EpisodeError("step() called without an active episode: call reset() first")
        if action == SUBMIT:
            self.transcript.submit()
            if self.step_index + 1 < len(self.task.steps):
                return await self._next_step()
            self.transcript.stop("submitted")
            return await self._finish("", terminated=True, truncated=False, info={"submitted": True})
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return await self._time_out("", {})
        started = time.monotonic()
        self._interrupt.clear()
        try:
            limit = min(timeout or self.options.command_timeout, remaining)
            result = await self._shell.run(action, timeout=limit, interrupt=self._interrupt)
        except SandboxError as exc:
            self.error = fault(exc, agent_acted=True)  # the command was issued: what broke is the agent's doing
            self.transcript.stop(fault_stop_reason(self.error))
            await self._end_without_verification()
            await self._collect_warnings()
            return f"[sandbox error: {exc}]", 0.0, False, True, {"error": self.error, "warnings": list(self.warnings)}
        duration = time.monotonic() - started
        self.timings["agent"] = self.timings.get("agent", 0.0) + duration
        self.turns += 1
        obs = format_observation(result)
        info = {
            "output": result.output,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "dropped_bytes": result.dropped_bytes,
            "cwd": result.cwd,
            "shell_restarted": result.shell_restarted,
            "turn": self.turns,
        }
        self.transcript.step(
            action,
            timeout,
            {
                **{key: info[key] for key in ("output", "exit_code", "timed_out", "cwd", "dropped_bytes")},
                "duration": duration,  # in the transcript, not in info: a step's info is deterministic
            },
            obs,
        )
        if result.timed_out and time.monotonic() >= self._deadline:
            return await self._time_out(obs, info)
        if self.turns >= self.options.max_turns:
            self.transcript.stop("max_turns")
            return await self._finish(obs, terminated=False, truncated=True, info=info)
        return obs, 0.0, False, False, info

    def count_outside_command(self) -> None:
        """Count a command the agent runs through an outside framework's own exec (inspect's sandbox
        API) instead of ``step``, before it runs: a turn, so that a sandbox it breaks is the agent's
        doing (``broken_by_agent``), as after ``step``. No effect between episodes."""
        if not self.done:
            self.turns += 1

    async def truncate(self, reason: StopReason) -> tuple[str, float, bool, bool, dict]:
        """End the episode as truncated (the agent ran out of a budget of its own: turns, context,
        well-formed replies) and verify, like a turn budget running out. ``reason`` is the stop
        reason the transcript and the record carry."""
        if self.done or self._shell is None:
            raise EpisodeError("truncate() called without an active episode: call reset() first")
        if reason == "agent_timeout":
            return await self._time_out("", {})
        self.transcript.stop(reason)
        return await self._finish("", terminated=False, truncated=True, info={"stop_reason": reason})

    async def _time_out(self, obs: str, info: dict) -> tuple[str, float, bool, bool, dict]:
        self.error = {"kind": "agent_timeout", "message": f"agent timeout of {self.agent_timeout:g}s reached"}
        self.transcript.stop("agent_timeout")
        return await self._finish(obs, terminated=False, truncated=True, info=info)

    async def upload(self, files: Sequence[tuple[Path, str]], dest: str) -> None:
        """Copy host files into the sandbox during an episode (used by the oracle agent)."""
        if self.sandbox is None:
            raise EpisodeError("upload() called without an active episode")
        await upload_files(self.sandbox, files, dest)

    async def close(self) -> None:
        """End the episode and stop its sandbox; with ``EnvOptions.keep`` the sandbox is left
        running instead and ``self.kept`` says how to enter and remove it (a backend that cannot
        keep one stops it and says so in the warnings). A cancellation meanwhile never cuts it short:
        it propagates once the sandbox is stopped (``run_to_end``), so a cancelled trial leaves
        nothing running or on disk when it returns."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        await self._end_without_verification()
        if self.sandbox is None:
            return
        sandbox, self.sandbox = self.sandbox, None
        try:
            if self.options.keep and self.kept is None:
                try:
                    self.kept = await keep(sandbox)
                except SandboxError as exc:
                    self.warnings.append(f"--keep: {exc}")
        finally:
            await sandbox.stop()

    async def __aenter__(self) -> AsyncTerminalEnv:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _finish(
        self, obs: str, *, terminated: bool, truncated: bool, info: dict
    ) -> tuple[str, float, bool, bool, dict]:
        assert self.sandbox is not None
        await self._end_without_verification()
        started = time.monotonic()
        try:
            self.verification = await self._phases.verify(self.sandbox, self.current_task)
        except SandboxError as exc:
            self.error = fault(exc, agent_acted=self.turns > 0)
            if self.error["kind"] == "broken_by_agent":
                # what stopped the episode is the broken sandbox, whether its shell answered the
                # breaking command first (a race with the sandbox's end) and the agent submitted, or not
                self.transcript.stop_reason = fault_stop_reason(self.error)
        finally:
            self.timings["verify"] = self.timings.get("verify", 0.0) + time.monotonic() - started
        if self.task.steps and self.verification is not None:
            self._add_step_result(self.verification)
        await self._collect_warnings()
        if self._exportable():
            self.artifacts = await self._phases.export_artifacts(self.sandbox, self.trial_dir)
        verification = self.verification
        if verification is None:
            info = {
                **info,
                "stop_reason": self.transcript.stop_reason,
                "error": self.error,
                "warnings": list(self.warnings),
            }
            return obs, 0.0, terminated, truncated, info
        report = verification.report
        error = verification_error(verification, self.current_task)
        if verification.tampered or (error is not None and self.error is None):
            self.error = error
        if not report.binary and report.error is None and self.current_task.expected_assertions is None:
            self.warnings.append(
                "the report's assertion count is unchecked: the task declares no [verifier].assertions"
            )
        info = {
            **info,
            "resolved": report.resolved,
            "passed": report.passed,
            "total": report.total,
            "assertions": [{"name": a.name, "passed": a.passed, "status": a.status} for a in report.assertions],
            "report_format": report.format,
            "verifier_output": verification.output[-4000:],
            "stop_reason": self.transcript.stop_reason,
            "error": self.error,
            "warnings": list(self.warnings),
        }
        if self.grade is not None:  # a multi-step task: graded by its strategy over the steps
            grade = self.grade
            info.update(resolved=grade.resolved, passed=grade.passed, total=grade.total)
            info.update(assertions=list(grade.assertions), step=self.step_index)
            info["steps"] = [result.as_dict() for result in self.step_results]
            return obs, grade.reward, terminated, truncated, info
        return obs, verification.reward, terminated, truncated, info

    def _warn(self, line: str | None) -> None:
        if line and line not in self.warnings:
            self.warnings.append(line)

    def _new_shell(self) -> PersistentShell:
        assert self.sandbox is not None
        return PersistentShell(
            self.sandbox,
            env=self.agent_env(),
            cwd=self.sandbox.workdir,
            output_limit=self.options.output_limit,
            user=self._phases.agent_user,
        )

    def _add_step_result(self, verification: Verification) -> None:
        step, report = self.task.steps[self.step_index], verification.report
        error = verification_error(verification, self.current_task)
        assertions = tuple({"name": a.name, "passed": a.passed} for a in report.assertions if a.status != "skipped")
        result = StepResult(
            name=step.name,
            reward=verification.reward,
            resolved=report.resolved,
            passed=report.passed,
            total=report.total,
            assertions=assertions,
            error=error["message"] if error else None,
        )
        self.step_results.append(result)
        self.grade = combine(self.step_results, self.task.multi_step_reward_strategy)

    async def _next_step(self) -> tuple[str, float, bool, bool, dict]:
        """SUBMIT before a multi-step task's last step: verify this step, then hand the agent the
        next one (a fresh shell, the agent phase's network, the step's own agent timeout)."""
        assert self.sandbox is not None and self._shell is not None
        shell, self._shell = self._shell, None
        await run_to_end(shell.close())
        started = time.monotonic()
        try:
            try:
                verification = await self._phases.verify(self.sandbox, self.current_task)
            finally:
                self.timings["verify"] = self.timings.get("verify", 0.0) + time.monotonic() - started
            self._add_step_result(verification)
            self.step_index += 1
            self._warn(await self._phases.switch_network(self.sandbox, "agent"))
            self._shell = self._new_shell()
            await self._shell.start()
        except SandboxError as exc:
            self.error = fault(exc, agent_acted=self.turns > 0)
            self.transcript.stop(fault_stop_reason(self.error))
            await self._end_without_verification()
            await self._collect_warnings()
            info = {"error": self.error, "warnings": list(self.warnings)}
            return f"[sandbox error: {exc}]", 0.0, False, True, info
        self._deadline = time.monotonic() + self.agent_timeout
        instruction = self.current_task.instruction
        self.transcript.observed(instruction)
        info = {
            "submitted": True,
            "step": self.step_index,
            "steps": len(self.task.steps),
            "step_result": self.step_results[-1].as_dict(),
            "agent_timeout": self.agent_timeout,
            "warnings": list(self.warnings),
        }
        return instruction, 0.0, False, False, info

    def _exportable(self) -> bool:
        """Whether the artifacts may be copied out: not from a sandbox that no longer answers, and
        not from one whose agent tampered (what it left may be crafted against the export)."""
        if self.error is not None and self.error["kind"] in ("sandbox_error", "broken_by_agent"):
            return False
        return self.verification is None or not self.verification.tampered

    @property
    def network(self) -> dict[str, bool]:
        """Per phase: the network the task asked for and the sandbox got (``Phases.network``)."""
        return self._phases.network

    async def _new_sandbox(self) -> Sandbox:
        """A sandbox (not started) from the factory, which may wait before it makes one (a pacer)."""
        made = self._factory(self.task, self.options)
        return await made if inspect.isawaitable(made) else made

    async def _collect_warnings(self) -> None:
        """The record's view of the episode's end: what the agent changed under system paths and
        the resource limits its sandbox reached, added to the warnings."""
        assert self.sandbox is not None
        verification = self.verification
        if verification is not None and verification.system_changes is not None:
            self.system_changes = list(verification.system_changes)
        try:
            self.warnings += [w for w in await self.sandbox.limit_warnings() if w not in self.warnings]
        except SandboxError:
            pass  # the sandbox is gone; its limits cannot be read any more

    async def _end_without_verification(self) -> None:
        self.done = True
        if self._shell is not None:
            shell, self._shell = self._shell, None
            await run_to_end(shell.close())

    def agent_env(self) -> dict[str, str]:
        """The environment the agent's commands run with: the sandbox's own, and a home, a locale
        and a dumb terminal. Only during an episode."""
        assert self.sandbox is not None
        return agent_env(self.sandbox.env)


def make(task: Task | str, backend: str = "local", **options: Any) -> AsyncTerminalEnv:
    """``termgym.make("path/to/task", backend="local", max_turns=20)``: an AsyncTerminalEnv.
    ``task`` is a Task, a task directory, or a bundled task's name (``file-ops/organize-by-ext``)."""
    resolved = task if isinstance(task, Task) else resolve_task(task)
    try:
        env_options = EnvOptions(backend=backend, **options)
    except TypeError as exc:  # an unknown option name
        raise ConfigError(f"termgym.make: {exc}") from exc
    return AsyncTerminalEnv(resolved, env_options)
