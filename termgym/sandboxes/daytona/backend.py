"""The Daytona backend: one minimal Daytona cloud sandbox per trial, through the official async SDK.

Guarantees: each task environment is one snapshot named from its content hash, built once when
missing and reused (a failed build is an ``EnvironmentBuildError``, not retried in this process);
a sandbox gets the task's resources, ``network_block_all`` unless the task needs network, the
``termgym`` labels, ``ephemeral`` with an auto-stop interval and a hard TTL; ``stop`` always
deletes, and so does a failed or timed-out create whose sandbox existed. Every create attempt takes
a slot from the provider's ``Pacer`` inside a cap on live sandboxes; failures are retried per
``policy``, else the trial fails as a ``SandboxError``. Every SDK call has an explicit timeout.

Configuration: the SDK's ``DAYTONA_*`` variables and ``TERMGYM_DAYTONA_*``
(``DaytonaSettings.from_env``). What it covers and not, in full:
docs/guides/backends.md#cloud-rollouts-on-daytona---backend-daytona."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from termgym.aio import wait_for
from termgym.errors import SandboxError, SandboxGone
from termgym.images.dockerfile import parse_dockerfile
from termgym.images.dockerfile_syntax import DockerfileError
from termgym.sandboxes.base import (
    BackendHooks,
    Command,
    ExecResult,
    ProcessChannel,
    Sandbox,
    SandboxSpec,
    refuse_user,
)
from termgym.sandboxes.daytona.channel import SessionChannel
from termgym.sandboxes.daytona.policy import (
    KILL_SCRIPT,
    daytona_resources,
    encode_command,
    exec_script,
    parse_exec_output,
    retry_delay,
)
from termgym.sandboxes.daytona.provider import (
    DaytonaProvider,
    DaytonaSettings,
    builds_on_daytona,
    check_credentials,
    close_providers,
    environment_hash_of,
    failure_of,
    get_provider,
    image_of,
    image_record,
    sdk_error,
    state_of,
)

EXEC_GRACE_SEC = 10.0  # the daemon's own deadline, past the in-sandbox timeout


# -- the sandbox -------------------------------------------------------------------------------------


class DaytonaSandbox(Sandbox):
    backend = "daytona"
    paces_own_creation = True  # every create attempt, retries included, waits for the provider's pacer

    def __init__(self, spec: SandboxSpec, *, provider: DaytonaProvider | None = None) -> None:
        super().__init__(spec)
        self._provider = provider
        self._sandbox: Any = None
        self._holding = False
        self._channels: list[SessionChannel] = []
        self._baseline: list[str] = []
        self.sandbox_id: str | None = None

    @property
    def provider(self) -> DaytonaProvider:
        if self._provider is None:
            self._provider = get_provider()
        return self._provider

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        provider = self.provider
        await provider.gate.acquire()
        self._holding = True
        provider.holding += 1
        if self.spec.compose_file is not None:
            self.warnings.append("docker-compose services are not supported on Daytona: only the main image runs")
        snapshot, why_not = await provider.ensure_snapshot(self.spec)
        built = builds_on_daytona(self.spec)
        if why_not:
            instead = "building from the Dockerfile" if built else f"creating from image {self.spec.image}"
            self.warnings.append(f"{why_not}; {instead} instead")
        self._sandbox = await self._create(snapshot)
        self.sandbox_id = self._sandbox.id
        self.image = image_record(self.spec)
        self._apply_image_config()
        if not built:  # the named image's own working directory
            with contextlib.suppress(SandboxError):
                self.workdir = await provider.call("work dir", lambda: self._sandbox.get_work_dir()) or "/"
        probe = await self.exec(["/bin/sh", "-c", "cd /proc && echo [0-9]*"], timeout=30, cwd="/")
        self._baseline = probe.text.split()

    def _apply_image_config(self) -> None:
        if builds_on_daytona(self.spec) and self.spec.dockerfile is not None:
            try:
                plan = parse_dockerfile(self.spec.dockerfile.read_text(encoding="utf-8", errors="replace"))
            except DockerfileError as exc:
                self.warnings.append(f"could not read ENV and WORKDIR from the Dockerfile: {exc}")
            else:
                self.env.update(dict(plan.env))
                self.workdir = plan.workdir or "/"
        self.env.update(dict(self.spec.env))

    def _params(self, name: str, snapshot: str | None) -> Any:
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Resources

        settings = self.provider.settings
        common: dict[str, Any] = dict(
            name=name,
            os_user="root",
            labels={"termgym": "1", **dict(self.spec.labels), "termgym.task": self.spec.name[:63]},
            network_block_all=not self.spec.network,
            auto_stop_interval=settings.auto_stop_minutes,
            ttl_minutes=settings.ttl_minutes,
            ephemeral=True,
        )
        if snapshot is not None:
            return CreateSandboxFromSnapshotParams(snapshot=snapshot, **common)
        cpu, memory, disk = daytona_resources(self.spec.resources)
        return CreateSandboxFromImageParams(
            image=image_of(self.spec), resources=Resources(cpu=cpu, memory=memory, disk=disk), **common
        )

    async def _create(self, snapshot: str | None) -> Any:
        """Create and start the sandbox: every attempt paced; retried as the policy says."""
        from daytona import DaytonaError, DaytonaTimeoutError

        provider = self.provider
        timeout = provider.settings.create_timeout if snapshot else self.spec.build_timeout_sec
        attempt = 0
        while True:
            attempt += 1
            name = f"termgym-{uuid.uuid4().hex[:16]}"
            await provider.pacer.acquire()
            provider.create_attempts += 1
            try:
                return await wait_for(
                    provider.client.create(self._params(name, snapshot), timeout=timeout), timeout + 15
                )
            except asyncio.CancelledError:
                await asyncio.shield(self._delete_named(name))
                raise
            except (DaytonaError, TimeoutError) as exc:
                kind, after = failure_of(exc)
                if kind not in ("rate_limited", "quota"):  # the sandbox may exist: it must not leak
                    await asyncio.shield(self._delete_named(name))
                if isinstance(exc, (DaytonaTimeoutError, TimeoutError)):
                    raise SandboxError(f"creating a Daytona sandbox timed out after {timeout:g}s") from exc
                delay = retry_delay(provider.settings.retry, kind, attempt, after, random.random())
                if delay is None:
                    raise sdk_error(f"creating a Daytona sandbox failed ({kind}, attempt {attempt})", exc) from exc
                await asyncio.sleep(delay)

    async def _delete_named(self, name: str) -> None:
        """Delete the sandbox called ``name`` if it exists (a create that failed half-way)."""
        with contextlib.suppress(SandboxError):
            sandbox = await self.provider.call(
                f"look up {name}",
                lambda: self.provider.client.get(name, request_timeout=self.provider.settings.request_timeout),
                attempts=3,
            )
            await self._delete(sandbox)

    async def _delete(self, sandbox: Any) -> None:
        timeout = self.provider.settings.request_timeout
        with contextlib.suppress(SandboxGone):
            await self.provider.call(
                f"delete sandbox {sandbox.id}", lambda: sandbox.delete(timeout=timeout), attempts=4
            )

    async def stop(self) -> None:
        try:
            for channel in self._channels:
                await channel.close()
            self._channels.clear()
            if self._sandbox is not None:
                sandbox, self._sandbox = self._sandbox, None
                with contextlib.suppress(SandboxError):
                    await self._delete(sandbox)
        finally:
            if self._holding:
                self._holding = False
                self.provider.holding -= 1
                self.provider.gate.release()

    async def kill_agent_processes(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self.exec(["/bin/sh", "-c", KILL_SCRIPT, "sh", " ".join(self._baseline)], timeout=30, cwd="/")

    # -- commands and files --------------------------------------------------------------------

    def _live(self) -> Any:
        if self._sandbox is None:
            raise SandboxError("the Daytona sandbox is not running")
        return self._sandbox

    async def run(self, command: Command) -> ExecResult:
        from daytona import DaytonaError, DaytonaTimeoutError

        refuse_user(self, command.user)
        sandbox = self._live()
        stdin_path = None
        if command.stdin is not None:
            stdin_path = f"/tmp/.termgym-stdin-{uuid.uuid4().hex}"
            await self._upload_bytes(command.stdin, stdin_path)
        timeout, output_limit = command.timeout, command.output_limit
        script = exec_script(
            command.argv,
            env=self.env if command.env is None else command.env,
            cwd=command.cwd or self.workdir,
            timeout=timeout,
            output_limit=output_limit,
            stdin_path=stdin_path,
        )
        daemon_timeout = math.ceil(timeout + EXEC_GRACE_SEC)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            response = await wait_for(
                sandbox.process.exec(encode_command(script), timeout=daemon_timeout), daemon_timeout + 15
            )
        except DaytonaTimeoutError:
            return ExecResult(exit_code=None, output=b"", timed_out=True)
        except DaytonaError as exc:
            raise sdk_error("running a command in the Daytona sandbox", exc) from exc
        except TimeoutError as exc:
            raise SandboxError("the Daytona sandbox did not answer a command in time") from exc
        output, dropped = parse_exec_output(response.result or "", output_limit)
        code = response.exit_code
        timed_out = code in (124, 137) and loop.time() - started >= timeout
        return ExecResult(
            exit_code=None if timed_out else code, output=output, timed_out=timed_out, dropped_bytes=dropped
        )

    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        refuse_user(self, user)
        channel = await SessionChannel.open(
            self._live(), argv, env=env, cwd=cwd, request_timeout=self.provider.settings.request_timeout
        )
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    async def _upload_bytes(self, data: bytes, path: str, timeout: float | None = None) -> None:
        from daytona import FileUpload

        sandbox = self._live()
        seconds = max(int(timeout or 0), int(self.provider.settings.request_timeout), 1)
        await self.provider.call(
            f"upload to {path}",
            lambda: sandbox.fs.upload_files([FileUpload(source=data, destination=path)], timeout=seconds),
            timeout=seconds,
            attempts=3,
        )

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        """One bulk upload of the archive, then one ``tar -x`` in the sandbox."""
        path = f"/tmp/.termgym-upload-{uuid.uuid4().hex}.tar"
        await self._upload_bytes(archive, path, timeout)
        script = 'mkdir -p "$1" && tar -x --no-same-owner -C "$1" -f "$2"; s=$?; rm -f "$2"; exit $s'
        result = await self.exec(["/bin/sh", "-c", script, "sh", dest, path], timeout=timeout, cwd="/")
        if result.exit_code != 0:
            lines = [line for line in result.text.strip().splitlines() if line.strip()]
            raise SandboxError(f"upload to {dest} failed: {lines[-1][:300] if lines else 'no output'}")

    async def download_files(self, paths: Sequence[str], *, timeout: float = 120.0) -> dict[str, bytes | None]:
        """The bytes of each path, in one bulk request; None for a path that could not be read."""
        from daytona import FileDownloadRequest

        sandbox = self._live()
        seconds = max(int(timeout), 1)
        responses = await self.provider.call(
            "download files",
            lambda: sandbox.fs.download_files([FileDownloadRequest(source=p) for p in paths], timeout=seconds),
            timeout=seconds,
            attempts=3,
        )
        return {r.source: (r.result if r.error is None and isinstance(r.result, bytes) else None) for r in responses}


# -- garbage collection --------------------------------------------------------------------------


async def collect_garbage(labels: Mapping[str, str] | None = None, *, page_size: int = 100) -> int:
    """Delete every sandbox labelled ``termgym=1`` (and ``labels``); returns how many were deleted.

    The list can be stale (deleted sandboxes listed as running, daytona#5138), so each listed id is
    looked up on its own and only what that lookup shows alive is deleted; 404s count as gone."""
    from daytona import ListSandboxesQuery

    provider = get_provider()
    timeout = provider.settings.request_timeout
    query = ListSandboxesQuery(labels={"termgym": "1", **dict(labels or {})}, limit=page_size)

    async def listed() -> list[str]:
        return [sandbox.id async for sandbox in provider.client.list(query, request_timeout=timeout)]

    deleted = 0
    for sandbox_id in await provider.call("list sandboxes", listed):
        try:
            sandbox = await provider.call(
                f"look up {sandbox_id}", lambda i=sandbox_id: provider.client.get(i, request_timeout=timeout)
            )
        except SandboxGone:
            continue
        if state_of(sandbox) in ("destroyed", "destroying"):
            continue
        with contextlib.suppress(SandboxGone):
            await provider.call(f"delete {sandbox_id}", lambda s=sandbox: s.delete(timeout=timeout), attempts=4)
            deleted += 1
    return deleted


# -- the backend registry's hooks (termgym.sandboxes) ----------------------------------------------


def preflight() -> None:
    """``BackendUnavailable`` unless Daytona credentials are set."""
    check_credentials()


async def remove_leftovers(images: bool = False) -> str:
    """``termgym gc``: delete every labelled sandbox (Daytona keeps no task images of ours); one line."""
    check_credentials()
    return f"removed {await collect_garbage()} leftover daytona sandbox(es)"


async def close_shared() -> None:
    """Close the providers' HTTP sessions (``close_providers``)."""
    await close_providers()


HOOKS = BackendHooks(preflight=preflight, remove_leftovers=remove_leftovers, close_shared=close_shared)


__all__ = [
    "HOOKS",
    "DaytonaProvider",
    "DaytonaSandbox",
    "DaytonaSettings",
    "check_credentials",
    "close_providers",
    "collect_garbage",
    "environment_hash_of",
    "get_provider",
]
