"""The async terminal environment: an agent's shell commands in, observations and the reward out.

Gymnasium semantics: ``reset(*, seed, options) -> (obs, info)`` starts a fresh sandbox and shell
(obs is the task's instruction); ``step(action) -> (obs, reward, terminated, truncated, info)``.
An action is one shell command, or ``SUBMIT`` to end the episode. ``terminated`` means the agent
submitted; ``truncated`` means the turn budget or the agent timeout ran out, or the agent gave up
on a budget of its own (``truncate(reason)``: its context window, its parse errors). Every step
goes into ``env.transcript`` (``termgym.transcript``), with the episode's stop reason. The reward comes on the
final step, after verification; every other step gives 0.0. ``async with`` stops the sandbox on
every path out, exceptions and cancellation included.

Outcomes the agent cannot erase: once the agent has run a command, a sandbox that stops working
from inside (``SandboxBroken``: its processes all killed, its shell off the protocol, a tool the
harness needs broken) ends the episode with reward 0 and error kind ``broken_by_agent``, which no
scheduler retries; ``sandbox_error`` is left for faults of the infrastructure.

Harbor's task features (docs/guides/tasks.md, "Healthchecks, users, network phases, artifacts and
steps"): the sandbox starts in the agent phase's network and is switched to the verifier phase's
before verification (``Sandbox.set_network``; less than asked is a warning); the healthcheck
(``termgym.healthcheck``) passes before the agent's shell opens, else ``reset`` raises
``SandboxError``; the shell runs as ``[agent].user`` and the test script as ``[verifier].user``
where the backend ``supports_users`` (else a warning); after verification the artifacts go to
``trial_dir/artifacts`` (``termgym.artifact_export``; ``trial_dir`` is set by ``run_trial``). A
multi-step task (``[[steps]]``) is one episode: ``SUBMIT`` before the last step verifies that step
and returns the next step's instruction (reward 0, not terminated, ``info["step"]``); the final
reward is the steps' grade (``termgym.steps.combine``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from termgym.artifact_export import DROPPED, export_artifacts
from termgym.artifacts import MAX_ARTIFACT_BYTES, artifact_paths, safe_artifacts
from termgym.errors import ConfigError, EpisodeError, SandboxBroken, SandboxError
from termgym.healthcheck import wait_healthy
from termgym.images.build import load_aliases
from termgym.images.pull import PULL_POLICIES
from termgym.output import DEFAULT_OUTPUT_LIMIT
from termgym.overrides import RunOverrides, apply_overrides, network_asked
from termgym.records import TrialError
from termgym.sandboxes import create_sandbox, keeps_warm_pool, prewarm
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.changes import watched_paths
from termgym.shell import CommandResult, PersistentShell
from termgym.steps import Grade, StepResult, combine, step_task
from termgym.tamper import TAMPER_POLICIES, tamper_warning
from termgym.tasks import Task, load_task
from termgym.transcript import StopReason, Transcript
from termgym.verification import Verification, verify
from termgym.verifiers import DEFAULT_SCALE

SUBMIT = ":submit"
DEFAULT_MAX_TURNS = 50
DEFAULT_COMMAND_TIMEOUT = 180.0


@dataclass(frozen=True)
class EnvOptions:
    backend: str = "local"
    max_turns: int = DEFAULT_MAX_TURNS
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT  # per command; also capped by the agent timeout
    agent_timeout: float | None = None  # None: the task's own
    reward_scale: int = DEFAULT_SCALE
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    run_id: str = ""
    image_aliases: Mapping[str, str] | None = None  # None: built-in and config-file aliases
    tamper: str = "fail"  # changed system paths: "fail" scores the trial 0, "warn" records them (termgym.tamper)
    trials_dir: str | None = None  # where each trial's directory (its transcript) goes; None: not kept
    overrides: RunOverrides = field(default_factory=RunOverrides)  # Harbor's run overrides (termgym.overrides)
    pull: str = "missing"  # registry images (docker): missing, never, always
    build: bool = False  # build the Dockerfile even when the task names a docker_image
    keep: bool = False  # leave the sandbox running after the episode (record.kept says how to enter it)

    def __post_init__(self) -> None:
        if self.pull not in PULL_POLICIES:
            raise ConfigError(f"--pull must be one of {', '.join(PULL_POLICIES)}, got {self.pull!r}")
        if isinstance(self.reward_scale, bool) or not isinstance(self.reward_scale, int) or self.reward_scale < 1:
            raise ConfigError(f"--reward-scale must be a whole number of at least 1, got {self.reward_scale!r}")
        if self.tamper not in TAMPER_POLICIES:
            raise ConfigError(f"tamper must be one of {', '.join(TAMPER_POLICIES)}, got {self.tamper!r}")
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.command_timeout <= 0:
            raise ConfigError(f"command_timeout must be positive, got {self.command_timeout}")
        if self.agent_timeout is not None and self.agent_timeout <= 0:
            raise ConfigError(f"agent_timeout must be positive, got {self.agent_timeout}")


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
        sandbox_factory: Callable[[Task, EnvOptions], Sandbox] | None = None,
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
        self.kept: dict[str, str] | None = None  # --keep: the sandbox left running (Sandbox.keep)
        # Harbor's task features (the episode runtime section of the module docstring)
        self.trial_dir: Path | None = None  # set by run_trial before reset(): where artifacts are copied to
        self.artifacts: list[str] = []  # the files copied out, relative to trial_dir
        self.network: dict[str, bool] = {}  # per phase: what the task asked and what the sandbox got
        self.step_index = 0  # the multi-step task's current step
        self.step_results: list[StepResult] = []  # the multi-step task's verified steps, in order
        self.grade: Grade | None = None  # the multi-step task's grade (multi_step_reward_strategy)
        self._network_now: bool | None = None  # the sandbox's network now (None: as created)
        self._agent_user: str | None = None  # who the agent's shell runs as (the backend permitting)
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
        """The task as the current step sees it (``termgym.steps.step_task``); the task itself
        when it has no ``[[steps]]``."""
        if not self.task.steps:
            return self.task
        return step_task(self.task, self.task.steps[min(self.step_index, len(self.task.steps) - 1)])

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
        self.step_index, self.step_results, self.grade, self.artifacts, self.network = 0, [], None, [], {}
        instruction = self.current_task.instruction
        self.transcript = Transcript(task=self.task.name, instruction=instruction)
        started = time.monotonic()
        attached, self._attached = self._attached, None
        self.sandbox = attached or self._factory(self.task, self.options)
        runtime_warnings: list[str] = []
        try:
            if attached is None:
                await self.sandbox.start()
            runtime_warnings = await self._prepare_agent_phase(self.sandbox)
            self._shell = self._new_shell()
            await self._shell.start()
        except BaseException:
            await asyncio.shield(self.close())
            raise
        self.timings["setup"] = time.monotonic() - started
        self.warnings = [*self._override_warnings, *self.task.warnings, *self.sandbox.warnings]
        self.warnings += [w for w in runtime_warnings if w not in self.warnings]
        self.image = dict(self.sandbox.image)
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
            self.transcript.stop("sandbox_error")
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
        await self.sandbox.upload_files(files, dest)

    async def close(self) -> None:
        """End the episode and stop its sandbox; with ``EnvOptions.keep`` the sandbox is left
        running instead and ``self.kept`` says how to enter and remove it (a backend that cannot
        keep one stops it and says so in the warnings)."""
        await self._end_without_verification()
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            if self.options.keep and self.kept is None:
                try:
                    self.kept = await asyncio.shield(sandbox.keep())
                except SandboxError as exc:
                    self.warnings.append(f"--keep: {exc}")
            await asyncio.shield(sandbox.stop())

    async def __aenter__(self) -> AsyncTerminalEnv:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self.close())

    async def _finish(
        self, obs: str, *, terminated: bool, truncated: bool, info: dict
    ) -> tuple[str, float, bool, bool, dict]:
        assert self.sandbox is not None
        await self._end_without_verification()
        started = time.monotonic()
        try:
            self.verification = await self._verify_current()
        except SandboxError as exc:
            self.error = fault(exc, agent_acted=self.turns > 0)
        finally:
            self.timings["verify"] = self.timings.get("verify", 0.0) + time.monotonic() - started
        if self.task.steps and self.verification is not None:
            self._add_step_result(self.verification)
        await self._collect_warnings()
        await self._export_artifacts()
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

    # -- Harbor's task features: phases, users, healthcheck, steps, artifacts -------------------

    async def _prepare_agent_phase(self, sandbox: Sandbox) -> list[str]:
        """Before the agent gets the sandbox: its network as the agent phase asks, the agent's
        user, then the healthcheck (``SandboxError`` when it does not pass). The warnings."""
        warnings: list[str] = []
        asked = network_asked(self.task)
        self._network_now = None
        line = await self._switch_network(sandbox, "agent")
        warnings += [line] if line else []
        self.network = {
            "agent": bool(self._network_now),
            "verifier": False,
            "agent_asked": asked["agent"],
            "verifier_asked": asked["verifier"],
        }
        self._agent_user, line = self._phase_user(sandbox, "agent")
        warnings += [line] if line else []
        for phase in ("agent", "verifier"):
            user, _ = self._phase_user(sandbox, phase)
            if user is not None:
                await _check_user(sandbox, user, phase)
        if self.task.healthcheck is not None:
            started = time.monotonic()
            await wait_healthy(sandbox, self.task.healthcheck)
            self.timings["healthcheck"] = time.monotonic() - started
        return warnings

    async def _switch_network(self, sandbox: Sandbox, phase: str) -> str | None:
        """Give ``sandbox`` the network ``phase`` asks for (``Sandbox.set_network``) unless it has
        it already; a warning line when the backend cannot. ``_network_now`` None: just created."""
        asked = network_asked(self.task)[phase]
        now = self._network_now
        if now == asked or (now is None and not asked):
            self._network_now = asked
            return None
        reason = await sandbox.set_network(asked)
        if reason is None:
            self._network_now = asked
            return None
        self._network_now = bool(now)
        if reason in sandbox.warnings:  # said already at start (the embedded backend has no network)
            return reason
        return f"the {phase} phase asks for {'network' if asked else 'no network'}: {reason}"

    def _phase_user(self, sandbox: Sandbox, phase: str) -> tuple[str | None, str | None]:
        """Who ``phase`` runs as where the backend can switch users, and a warning where it cannot."""
        user = self.task.agent_user if phase == "agent" else self.task.verifier_user
        if user is None or sandbox.supports_users:
            return user, None
        if user in ROOT_USERS:
            return None, None
        return None, f"the {sandbox.backend} backend runs every command as root: [{phase}].user = {user} is not applied"

    def _warn(self, line: str | None) -> None:
        if line and line not in self.warnings:
            self.warnings.append(line)

    def _new_shell(self) -> PersistentShell:
        assert self.sandbox is not None
        return PersistentShell(
            self.sandbox,
            env=self._agent_env(),
            cwd=self.sandbox.workdir,
            output_limit=self.options.output_limit,
            user=self._agent_user,
        )

    async def _verify_current(self) -> Verification:
        """The current step's verification (the task's own without ``[[steps]]``), in the
        verifier phase's network, as the verifier's user."""
        assert self.sandbox is not None
        task = self.current_task
        self._warn(await self._switch_network(self.sandbox, "verifier"))
        self.network["verifier"] = bool(self._network_now)
        user, line = self._phase_user(self.sandbox, "verifier")
        self._warn(line)
        if task.verifier_mode == "separate":
            verification = await self._verify_separately(self.sandbox, task, user)
        else:
            verification = await verify(
                task, self.sandbox, reward_scale=self.options.reward_scale, tamper=self.options.tamper, user=user
            )
        for line in verification.warnings:
            self._warn(line)
        return verification

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
        await asyncio.shield(shell.close())
        started = time.monotonic()
        try:
            try:
                verification = await self._verify_current()
            finally:
                self.timings["verify"] = self.timings.get("verify", 0.0) + time.monotonic() - started
            self._add_step_result(verification)
            self.step_index += 1
            self._warn(await self._switch_network(self.sandbox, "agent"))
            self._shell = self._new_shell()
            await self._shell.start()
        except SandboxError as exc:
            self.error = fault(exc, agent_acted=self.turns > 0)
            self.transcript.stop("sandbox_error")
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

    async def _export_artifacts(self) -> None:
        """The task's artifacts (and ``/logs/artifacts``) copied into ``trial_dir/artifacts``;
        without a trial directory nothing is kept (a warning when the task declares artifacts)."""
        assert self.sandbox is not None
        if self.error is not None and self.error["kind"] in ("sandbox_error", "broken_by_agent"):
            return  # the sandbox no longer answers: nothing can be copied out of it
        if self.verification is not None and self.verification.tampered:
            return  # what the agent left is not worth keeping, and may be crafted against the export
        if self.trial_dir is None:
            if self.task.artifacts:
                self._warn("the task's artifacts were not kept: this run keeps no trial directory")
            return
        self.artifacts, warnings = await export_artifacts(self.sandbox, self.task.artifacts, self.trial_dir)
        for line in warnings:
            self._warn(line)

    async def _verify_separately(self, agent_sandbox: Sandbox, task: Task, user: str | None = None) -> Verification:
        """Harbor's separate mode: the declared artifacts (and ``/logs/artifacts``) copied from the
        agent's sandbox into a fresh one of the task's environment, where the verifier runs."""
        await agent_sandbox.check_alive()
        await agent_sandbox.kill_agent_processes()
        changes = await agent_sandbox.changed_system_paths()  # for the record: they do not reach the verifier
        paths = artifact_paths(self.task.artifacts)
        try:
            archive, dropped = safe_artifacts(await agent_sandbox.download_tar(paths, limit=MAX_ARTIFACT_BYTES), paths)
        except ValueError as exc:
            raise SandboxBroken(f"the artifacts could not be carried over: {exc}") from exc
        if dropped:
            self.warnings.append(f"{len(dropped)} artifact entries were not carried over ({DROPPED})")
        fresh = self._factory(self.task, self.options)
        try:
            await fresh.start()
            self.warnings += [w for w in fresh.warnings if w not in self.warnings]
            if network_asked(self.task)["verifier"] != fresh.spec.network:
                reason = await fresh.set_network(network_asked(self.task)["verifier"])
                self._warn(f"the separate verifier's network: {reason}" if reason else None)
            if archive:
                await fresh.upload_tar(archive, "/")
            # the agent's system changes never reach this sandbox: what changed in it is the harness's upload
            verification = await verify(task, fresh, reward_scale=self.options.reward_scale, tamper="warn", user=user)
            return replace(verification, system_changes=tuple(changes) if changes is not None else None)
        finally:
            self.warnings += [w for w in await fresh.limit_warnings() if w not in self.warnings]
            await asyncio.shield(fresh.stop())

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
            await asyncio.shield(shell.close())

    def _agent_env(self) -> dict[str, str]:
        assert self.sandbox is not None
        return {"HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **self.sandbox.env}


ROOT_USERS = ("root", "0", "0:0")  # the users every backend runs as without switching


async def _check_user(sandbox: Sandbox, user: str, phase: str) -> None:
    """``ConfigError`` in one line (the trial's ``invalid_task``, never retried: the task names a
    user its image lacks) when the sandbox cannot run a command as ``user``."""
    result = await sandbox.exec_as(user, ["/bin/sh", "-c", "id -u"], timeout=30, cwd="/")
    if result.exit_code != 0:
        lines = [line for line in result.text.strip().splitlines() if line.strip()]
        why = lines[-1][:200] if lines else f"exit {result.exit_code}"
        raise ConfigError(f"[{phase}].user = {user}: cannot run a command as that user ({why})")


def verification_error(verification: Verification, task: Task) -> TrialError | None:
    """The trial's error a verification gives, first match wins: ``tampered``, the verifier's
    timeout, its report's error, a test script that could not run (exit 126 and above)."""
    report = verification.report
    if verification.tampered:
        changed = tamper_warning(list(verification.system_changes or ()))
        hint = "not verified; a task whose work is to change them declares [verifier].allow_system_changes"
        return {"kind": "tampered", "message": f"{changed} ({hint})"}
    if verification.timed_out:
        return {"kind": "verifier_timeout", "message": f"verifier exceeded {task.verifier_timeout_sec:g}s"}
    if report.error:
        return {"kind": "verifier_error", "message": report.error}
    if verification.exit_code is not None and verification.exit_code >= 126:
        return {"kind": "verifier_error", "message": f"test script exited {verification.exit_code}"}
    return None


def fault(exc: SandboxError, *, agent_acted: bool) -> TrialError:
    """The trial's error for a sandbox fault: ``broken_by_agent`` when the sandbox stopped working
    from inside after the agent had run a command, else ``sandbox_error`` (the infrastructure's)."""
    if isinstance(exc, SandboxBroken) and agent_acted:
        return {"kind": "broken_by_agent", "message": f"{exc} (after the agent's commands)"}
    return {"kind": "sandbox_error", "message": str(exc)}


def sandbox_spec(
    task: Task,
    *,
    run_id: str,
    image_aliases: Mapping[str, str] | None = None,
    pull: str = "missing",
    prefer_build: bool = False,
) -> SandboxSpec:
    """The sandbox a task's environment needs, labelled as DESIGN.md says. ``image_aliases``
    defaults to the built-in ones plus the config file's (``termgym.images.build.load_aliases``)."""
    return SandboxSpec(
        name=task.name,
        context_dir=task.environment_dir,
        dockerfile=task.dockerfile,
        image=task.docker_image,
        resources=task.resources,
        network=network_asked(task)["agent"],  # the sandbox starts in the agent phase's network
        env=dict(task.environment_env),
        labels={"termgym": "1", "termgym.run": run_id or "adhoc"},
        build_timeout_sec=task.build_timeout_sec,
        compose_file=task.compose_file,
        image_aliases=dict(image_aliases) if image_aliases is not None else load_aliases(),
        pull=pull,
        prefer_build=prefer_build,
        watched=watched_paths(task.verifier_env),
    )


def options_sandbox_spec(task: Task, options: EnvOptions) -> SandboxSpec:
    """``sandbox_spec`` of ``task`` as a trial run with ``options`` asks for it."""
    return sandbox_spec(
        task, run_id=options.run_id, image_aliases=options.image_aliases, pull=options.pull, prefer_build=options.build
    )


def default_sandbox_factory(task: Task, options: EnvOptions) -> Sandbox:
    """The sandbox ``options.backend`` makes for ``task``, labelled with the run id, with image aliases."""
    return create_sandbox(options.backend, options_sandbox_spec(task, options))


async def prewarm_sandboxes(tasks: Sequence[Task], options: EnvOptions) -> int:
    """Make the sandboxes of trials of ``tasks`` (one each; the run's overrides applied) under
    ``options`` ready ahead of them where the backend keeps a warm pool
    (``termgym.sandboxes.prewarm``: Docker with ``TERMGYM_DOCKER_POOL``); how many are ready. 0 for
    a backend without one. A sandbox made ready for a spec no trial asks for again is only removed
    when the pool closes: a pooled sandbox serves only a trial whose own spec is identical."""
    if not keeps_warm_pool(options.backend):
        return 0
    specs: dict[str, SandboxSpec] = {}
    counts: Counter[str] = Counter()
    for task in tasks:
        counts[task.name] += 1
        specs[task.name] = options_sandbox_spec(apply_overrides(task, options.overrides)[0], options)
    by_count: dict[int, list[SandboxSpec]] = {}
    for name, spec in specs.items():
        by_count.setdefault(counts[name], []).append(spec)
    return sum([await prewarm(options.backend, group, count) for count, group in by_count.items()])


def make(task: Task | str, backend: str = "local", **options: Any) -> AsyncTerminalEnv:
    """``termgym.make("path/to/task", backend="local", max_turns=20)``: an AsyncTerminalEnv.
    ``task`` is a Task, a task directory, or a bundled task's name (``file-ops/organize-by-ext``)."""
    resolved = task if isinstance(task, Task) else resolve_task(task)
    try:
        env_options = EnvOptions(backend=backend, **options)
    except TypeError as exc:  # an unknown option name
        raise ConfigError(f"termgym.make: {exc}") from exc
    return AsyncTerminalEnv(resolved, env_options)


def resolve_task(name_or_path: str) -> Task:
    """A task directory path, or the name of a bundled task."""
    path = Path(name_or_path)
    if not path.exists():
        from termgym.bundled import bundled_task_path

        bundled = bundled_task_path(name_or_path)
        if bundled is not None:
            path = bundled
    return load_task(path)
