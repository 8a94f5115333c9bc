"""Harbor's phases around one episode: the network and the user each phase runs with, the
healthcheck before the agent's shell opens, where the verifier runs (the agent's sandbox, or a
fresh one in the separate mode), and the artifacts kept after it.

The sandbox starts in the agent phase's network and is switched to the verifier phase's before
verification (``capabilities.set_network``; less than asked is a warning); the healthcheck
(``termgym.episode.healthcheck``) passes before the agent's shell opens, else ``SandboxError``; the
shell runs as ``[agent].user`` and the test script as ``[verifier].user`` where the backend
``supports_users`` (else a warning; a user the image lacks is ``ConfigError``, the trial's
``invalid_task``). In the separate mode the declared artifacts (and ``/logs/artifacts``) are copied
from the agent's sandbox into a fresh one of the task's environment (``termgym.episode.artifacts``),
where the verifier runs; the agent's system changes are recorded, never carried over. Every warning
goes to the episode through ``warn``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from termgym.aio import run_to_end
from termgym.episode.artifacts import DROPPED, MAX_ARTIFACT_BYTES, artifact_paths, export_artifacts, safe_artifacts
from termgym.episode.guard import agent_paths, outside_work
from termgym.episode.healthcheck import wait_healthy
from termgym.episode.options import EnvOptions
from termgym.episode.overrides import network_asked
from termgym.episode.verification import Verification, verify
from termgym.errors import ConfigError, SandboxBroken
from termgym.sandboxes.base import DEFAULT_PATH, Sandbox
from termgym.sandboxes.capabilities import agent_changes, set_network
from termgym.tasks import Task

ROOT_USERS = ("root", "0", "0:0")  # the users every backend runs as without switching


class Phases:
    """The phases of one episode of ``task`` (as the run's overrides changed it) under ``options``;
    ``new_sandbox`` makes a sandbox of the task's environment (the separate mode's), ``warn`` takes
    a warning line (None: nothing to say). Reset with every episode (``reset``)."""

    def __init__(
        self,
        task: Task,
        options: EnvOptions,
        new_sandbox: Callable[[], Awaitable[Sandbox]],
        warn: Callable[[str | None], None],
    ) -> None:
        self.task, self.options = task, options
        self._new_sandbox, self._warn = new_sandbox, warn
        self.network: dict[str, bool] = {}  # per phase: what the task asked and what the sandbox got
        self.agent_user: str | None = None  # who the agent's shell runs as (the backend permitting)
        self._network_now: bool | None = None  # the sandbox's network now (None: as created)

    def reset(self) -> None:
        self.network, self.agent_user, self._network_now = {}, None, None

    async def prepare_agent_phase(self, sandbox: Sandbox) -> float | None:
        """Before the agent gets the sandbox: its network as the agent phase asks, the agent's
        user, then the healthcheck (``SandboxError`` when it does not pass): the seconds the
        healthcheck took (None without one)."""
        asked = network_asked(self.task)
        self._network_now = None
        self._warn(await self.switch_network(sandbox, "agent"))
        self.network = {
            "agent": bool(self._network_now),
            "verifier": False,
            "agent_asked": asked["agent"],
            "verifier_asked": asked["verifier"],
        }
        self.agent_user, line = self.phase_user(sandbox, "agent")
        self._warn(line)
        for phase in ("agent", "verifier"):
            user, _ = self.phase_user(sandbox, phase)
            if user is not None:
                await _check_user(sandbox, user, phase)
        if self.task.healthcheck is None:
            return None
        started = time.monotonic()
        await wait_healthy(sandbox, self.task.healthcheck)
        return time.monotonic() - started

    async def switch_network(self, sandbox: Sandbox, phase: str) -> str | None:
        """Give ``sandbox`` the network ``phase`` asks for (``capabilities.set_network``) unless it has
        it already; a warning line when the backend cannot."""
        asked = network_asked(self.task)[phase]
        now = self._network_now
        if now == asked or (now is None and not asked):
            self._network_now = asked
            return None
        reason = await set_network(sandbox, asked)
        if reason is None:
            self._network_now = asked
            return None
        self._network_now = bool(now)
        if reason in sandbox.warnings:  # said already at start (the embedded backend has no network)
            return reason
        return f"the {phase} phase asks for {'network' if asked else 'no network'}: {reason}"

    def phase_user(self, sandbox: Sandbox, phase: str) -> tuple[str | None, str | None]:
        """Who ``phase`` runs as where the backend can switch users, and a warning where it cannot."""
        user = self.task.agent_user if phase == "agent" else self.task.verifier_user
        if user is None or sandbox.supports_users:
            return user, None
        if user in ROOT_USERS:
            return None, None
        return None, f"the {sandbox.backend} backend runs every command as root: [{phase}].user = {user} is not applied"

    async def verify(self, sandbox: Sandbox, task: Task) -> Verification:
        """``task``'s verification (a multi-step task's current step's) of ``sandbox``, in the
        verifier phase's network, as the verifier's user, in the sandbox or a fresh one as the
        task's mode says; its warnings go to the episode."""
        self._warn(await self.switch_network(sandbox, "verifier"))
        self.network["verifier"] = bool(self._network_now)
        user, line = self.phase_user(sandbox, "verifier")
        self._warn(line)
        if task.verifier_mode == "separate":
            verification = await self._verify_separately(sandbox, task, user)
        else:
            verification = await verify(
                task, sandbox, reward_scale=self.options.reward_scale, tamper=self.options.tamper, user=user
            )
        for line in verification.warnings:
            self._warn(line)
        return verification

    async def _verify_separately(self, agent_sandbox: Sandbox, task: Task, user: str | None) -> Verification:
        await agent_sandbox.check_alive()
        await agent_sandbox.kill_agent_processes()
        listed = await agent_changes(agent_sandbox)  # for the record: they do not reach the verifier
        changes = None if listed is None else sorted(outside_work(listed, agent_paths(task, agent_sandbox.workdir)))
        paths = artifact_paths(self.task.artifacts)
        try:
            archive, dropped = safe_artifacts(await agent_sandbox.download_tar(paths, limit=MAX_ARTIFACT_BYTES), paths)
        except ValueError as exc:
            raise SandboxBroken(f"the artifacts could not be carried over: {exc}") from exc
        if dropped:
            self._warn(f"{len(dropped)} artifact entries were not carried over ({DROPPED})")
        fresh = await self._new_sandbox()
        try:
            await fresh.start()
            for line in fresh.warnings:
                self._warn(line)
            if network_asked(self.task)["verifier"] != fresh.spec.network:
                reason = await set_network(fresh, network_asked(self.task)["verifier"])
                self._warn(f"the separate verifier's network: {reason}" if reason else None)
            if archive:
                await fresh.upload_tar(archive, "/")
            # the agent's changes never reach this sandbox: what changed in it is the harness's upload of
            # the declared artifacts, which the verifier is there to read
            trusting = replace(task, allow_system_changes=True)
            verification = await verify(trusting, fresh, reward_scale=self.options.reward_scale, user=user)
            return replace(verification, system_changes=tuple(changes) if changes is not None else None)
        finally:
            for line in await fresh.limit_warnings():
                self._warn(line)
            await run_to_end(fresh.stop())

    async def export_artifacts(self, sandbox: Sandbox, trial_dir: Path | None) -> list[str]:
        """The task's artifacts (and ``/logs/artifacts``) copied into ``trial_dir/artifacts``: the
        files kept, relative to ``trial_dir``. Without a trial directory nothing is kept (a warning
        when the task declares artifacts)."""
        if trial_dir is None:
            if self.task.artifacts:
                self._warn("the task's artifacts were not kept: this run keeps no trial directory")
            return []
        files, warnings = await export_artifacts(sandbox, self.task.artifacts, trial_dir)
        for line in warnings:
            self._warn(line)
        return files


async def _check_user(sandbox: Sandbox, user: str, phase: str) -> None:
    """``ConfigError`` in one line (the trial's ``invalid_task``, never retried: the task names a
    user its image lacks) when the sandbox cannot run a command as ``user``."""
    result = await sandbox.exec(["/bin/sh", "-c", "id -u"], timeout=30, cwd="/", env={"PATH": DEFAULT_PATH}, user=user)
    if result.exit_code != 0:
        lines = [line for line in result.text.strip().splitlines() if line.strip()]
        why = lines[-1][:200] if lines else f"exit {result.exit_code}"
        raise ConfigError(f"[{phase}].user = {user}: cannot run a command as that user ({why})")
