"""The Daytona backend: one minimal Daytona cloud sandbox per trial, through the official async SDK.

What it covers:
- **Images.** Each task environment becomes a Daytona snapshot named from its content hash
  (``termgym-<hash12>``: Dockerfile, build context, base image, resources), looked up first and
  built once when missing (one build at a time per name in this process; a build another process
  started is waited for), reused across trials and runs. When the organization cannot create
  snapshots, the sandbox is built from the Dockerfile instead (slow: every create builds). A build
  that fails is an ``EnvironmentBuildError``; this process remembers it and does not rebuild.
- **Sandboxes.** Resources from the task (whole vCPUs and GiB, rounded up); ``network_block_all``
  unless the task needs network; labels ``termgym=1``, ``termgym.run``, ``termgym.task``;
  ``ephemeral`` (deleted when stopped), an auto-stop interval and a hard TTL, so nothing outlives
  a crashed run by long; run as root. ``stop`` always deletes, and a create that failed or timed
  out after the sandbox existed (looked up by the unique name each attempt gets) is deleted too.
- **Pacing and quotas.** Every create attempt, retries included, first takes a slot from the
  provider's ``Pacer`` (6/s and 600/min by default, both at once), inside a per-provider cap on
  live sandboxes. 429: wait at least the retry-after headers, with exponential backoff and jitter;
  quota 400s: wait and retry; 5xx and connection errors: a bounded number of retries; anything
  else, or a create timeout, fails the trial as a ``SandboxError``.
- **Commands.** ``exec`` runs through ``process.exec`` under ``timeout -k 1`` inside the sandbox
  (its output capped in the sandbox, head and tail); ``open_process`` is a session command
  (``daytona_channel``); ``kill_agent_processes`` kills every process that was not there when the
  sandbox started. Files travel in bulk: one tar archive per upload (``fs.upload_files``), and
  ``download_files`` (``fs.download_files``). Every SDK call has an explicit timeout.

Not covered: build contexts reach Daytona through its object storage (S3 over HTTPS), which the
local test server does not provide; images need ``sh`` and coreutils (``timeout``, ``mktemp``,
``head``, ``tail``, ``tar``); output is text as the daemon sends it (invalid UTF-8 becomes U+FFFD).
Configuration: the SDK's ``DAYTONA_*`` variables for credentials, URL and region, and
``TERMGYM_DAYTONA_*`` for pacing and limits (``DaytonaSettings.from_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from termgym.aio import wait_for
from termgym.images.dockerfile import DockerfileError, parse_dockerfile
from termgym.errors import BackendUnavailable, ConfigError, EnvironmentBuildError, SandboxError, SandboxGone
from termgym.output import DEFAULT_OUTPUT_LIMIT
from termgym.sandboxes.pacing import Pacer
from termgym.sandboxes.base import ExecResult, ProcessChannel, Sandbox, SandboxSpec
from termgym.sandboxes.daytona.channel import SessionChannel
from termgym.sandboxes.daytona.policy import (
    KILL_SCRIPT,
    ContextEntry,
    RetryPolicy,
    classify_failure,
    daytona_resources,
    encode_command,
    environment_hash,
    exec_script,
    paced_windows,
    parse_exec_output,
    retry_after_seconds,
    retry_delay,
    snapshot_name,
)

DEFAULT_API_URL = "https://app.daytona.io/api"
CREDENTIALS_HINT = (
    "the daytona backend needs credentials: set DAYTONA_API_KEY (or DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID),"
    " and DAYTONA_API_URL for an API other than https://app.daytona.io/api (DAYTONA_TARGET picks a region)"
)
EXEC_GRACE_SEC = 10.0  # the daemon's own deadline, past the in-sandbox timeout
READY_STATES = ("active",)
FAILED_STATES = ("error", "build_failed")


@dataclass(frozen=True)
class DaytonaSettings:
    """Pacing, limits and timeouts; ``from_env`` reads ``TERMGYM_DAYTONA_<FIELD>`` (upper case)."""

    per_second: int = 6
    """Sandbox creates granted in any 1-second window (every attempt counts)."""
    per_minute: int = 600
    """Sandbox creates granted in any 60-second window."""
    pace_guard: float = 0.03
    """Seconds added to each pacing window, against jitter between a grant and its request."""
    max_sandboxes: int = 94
    """Live sandboxes at once in this process, per API URL."""
    create_timeout: float = 180.0
    """Seconds for one create from a snapshot, until the sandbox runs."""
    request_timeout: float = 60.0
    """Seconds for every other API call (files: at least this, more for big archives)."""
    auto_stop_minutes: int = 60
    """Daytona stops (and, being ephemeral, deletes) a sandbox idle for this long."""
    ttl_minutes: int = 240
    """Daytona deletes a sandbox this long after its creation, whatever it is doing."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if min(self.per_second, self.per_minute, self.max_sandboxes) < 1:
            raise ConfigError("daytona pacing and limits must be at least 1")
        if min(self.create_timeout, self.request_timeout) <= 0 or min(self.auto_stop_minutes, self.ttl_minutes) < 1 or self.pace_guard < 0:
            raise ConfigError("daytona timeouts must be positive")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DaytonaSettings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = environ.get(f"TERMGYM_DAYTONA_{item.name.upper()}")
            if raw is None or item.name == "retry":
                continue
            kind = float if item.type in ("float", float) else int
            try:
                values[item.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"TERMGYM_DAYTONA_{item.name.upper()} must be a number, got {raw!r}") from None
        return cls(**values)


class DaytonaProvider:
    """What every sandbox of one API (and event loop) shares: one ``AsyncDaytona`` client, one
    creation ``Pacer``, one cap on live sandboxes, and the snapshots known to be ready or broken."""

    def __init__(self, settings: DaytonaSettings, client: Any) -> None:
        self.settings = settings
        self.client = client
        self.pacer = Pacer(paced_windows(settings.per_second, settings.per_minute, settings.pace_guard))
        self.gate = asyncio.Semaphore(settings.max_sandboxes)
        self.create_attempts = 0
        self.holding = 0  # sandboxes holding a slot of the gate
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._snapshots_ready: set[str] = set()
        self._snapshots_failed: dict[str, EnvironmentBuildError] = {}

    async def close(self) -> None:
        await self.client.close()

    async def call(self, what: str, make: Callable[[], Any], *, timeout: float | None = None, attempts: int | None = None) -> Any:
        """``await make()`` under a timeout, retrying rate limits and transient faults (never
        paced: for creates use ``DaytonaSandbox._create``); SDK errors become ``SandboxError``."""
        from daytona import DaytonaError

        attempt = 0
        while True:
            attempt += 1
            try:
                return await wait_for(make(), (timeout or self.settings.request_timeout) + 5)
            except DaytonaError as exc:
                kind, after = failure_of(exc)
                delay = retry_delay(self.settings.retry, kind, attempt, after, random.random())
                if delay is None or (attempts is not None and attempt >= attempts):
                    raise sdk_error(what, exc) from exc
                await asyncio.sleep(delay)
            except TimeoutError as exc:
                raise SandboxError(f"{what}: no answer from Daytona in time") from exc

    async def ensure_snapshot(self, spec: SandboxSpec) -> tuple[str | None, str | None]:
        """``(snapshot name, None)`` when the environment's snapshot is ready, or ``(None, why)``
        when sandboxes must be built from the Dockerfile instead."""
        from daytona import CreateSnapshotParams, DaytonaConflictError, DaytonaError, Resources

        name = snapshot_name(await asyncio.to_thread(environment_hash_of, spec))
        if name in self._snapshots_failed:
            raise self._snapshots_failed[name]
        lock = self._snapshot_locks.setdefault(name, asyncio.Lock())
        async with lock:
            deadline = asyncio.get_running_loop().time() + spec.build_timeout_sec
            created = False
            builds = 0
            while name not in self._snapshots_ready:
                if name in self._snapshots_failed:
                    raise self._snapshots_failed[name]
                try:
                    snapshot = await self.call(f"snapshot {name}", lambda: self.client.snapshot.get(name))
                except SandboxGone:
                    snapshot = None
                state = _state(snapshot)
                if state in READY_STATES:
                    self._snapshots_ready.add(name)
                elif state in FAILED_STATES and created:
                    error = EnvironmentBuildError(
                        f"building snapshot {name} for {spec.name} failed: {snapshot.error_reason or state}",
                        log=snapshot.error_reason or "",
                    )
                    self._snapshots_failed[name] = error
                    raise error
                elif state in FAILED_STATES or snapshot is None:
                    if state in FAILED_STATES:  # an earlier build failed: try once more from here
                        with contextlib.suppress(SandboxError):
                            await self.call(f"delete snapshot {name}", lambda: self.client.snapshot.delete(name))
                    cpu, memory, disk = daytona_resources(spec.resources)
                    params = CreateSnapshotParams(
                        name=name, image=_image(spec), resources=Resources(cpu=cpu, memory=memory, disk=disk)
                    )
                    created, builds = True, builds + 1
                    if builds > self.settings.retry.transient_attempts:
                        raise SandboxError(f"snapshot {name} could not be created after {builds - 1} attempts")
                    try:
                        await wait_for(
                            self.client.snapshot.create(params, timeout=spec.build_timeout_sec),
                            spec.build_timeout_sec + 10,
                        )
                    except DaytonaConflictError:
                        pass  # another process is building it: wait for that build below
                    except (DaytonaError, TimeoutError) as exc:
                        kind, _ = failure_of(exc) if isinstance(exc, DaytonaError) else ("fatal", None)
                        try:
                            after = await self.call(f"snapshot {name}", lambda: self.client.snapshot.get(name))
                        except SandboxGone:
                            after = None
                        if after is None and kind == "fatal" and not isinstance(exc, TimeoutError):
                            # The organization cannot create snapshots (forbidden, a snapshot
                            # quota...): build each sandbox from the Dockerfile instead.
                            return None, f"snapshot {name} could not be created ({_message(exc)})"
                else:  # pending, building, pulling: another build is under way
                    if asyncio.get_running_loop().time() > deadline:
                        raise EnvironmentBuildError(f"snapshot {name} was not ready after {spec.build_timeout_sec:g}s")
                    await asyncio.sleep(2.0)
        return name, None


def failure_of(exc: Exception) -> tuple[str, float | None]:
    """The failure class of an SDK error, and the server's retry-after if any (by class and status)."""
    from daytona import DaytonaConnectionError, DaytonaError, DaytonaTimeoutError

    if not isinstance(exc, DaytonaError):
        return "fatal", None
    transport = isinstance(exc, DaytonaConnectionError) and not isinstance(exc, DaytonaTimeoutError)
    return classify_failure(exc.status_code, exc.message, transport=transport), retry_after_seconds(exc.headers)


def sdk_error(what: str, exc: Exception) -> SandboxError:
    """The termgym error for an SDK error (callers raise it ``from exc``)."""
    from daytona import DaytonaAuthenticationError, DaytonaForbiddenError, DaytonaNotFoundError

    status = getattr(exc, "status_code", None)
    message = f"{what}: {_message(exc)}" + (f" (HTTP {status})" if status else "")
    if isinstance(exc, DaytonaAuthenticationError):
        return BackendUnavailable(f"Daytona rejected the credentials ({_message(exc)}); {CREDENTIALS_HINT}")
    if isinstance(exc, DaytonaForbiddenError):
        return SandboxError(f"{message} (forbidden for this organization)")
    if isinstance(exc, DaytonaNotFoundError):
        return SandboxGone(message)
    return SandboxError(message)


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:400]


def _state(resource: Any) -> str | None:
    state = getattr(resource, "state", None)
    return None if state is None else str(getattr(state, "value", state)).lower()


def _image(spec: SandboxSpec) -> Any:
    from daytona import Image

    if spec.dockerfile is not None:
        return Image.from_dockerfile(spec.dockerfile)
    if spec.image:
        return spec.image
    raise ConfigError(f"{spec.name}: a Daytona sandbox needs a Dockerfile or an image")


def environment_hash_of(spec: SandboxSpec) -> str:
    """The content hash of a task's environment (reads its Dockerfile and build context)."""
    entries: list[ContextEntry] = []
    context = spec.context_dir
    if spec.dockerfile is not None and context is not None and context.is_dir():
        for path in sorted(context.rglob("*")):
            if path.is_file() and path != spec.dockerfile:
                entries.append(
                    ContextEntry(path.relative_to(context).as_posix(), path.read_bytes(), os.access(path, os.X_OK))
                )
    dockerfile = spec.dockerfile.read_bytes() if spec.dockerfile is not None else None
    return environment_hash(dockerfile, entries, spec.image, daytona_resources(spec.resources))


# -- providers: one per API URL and event loop -----------------------------------------------------

_providers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, DaytonaProvider]] = weakref.WeakKeyDictionary()


def api_url() -> str:
    return os.environ.get("DAYTONA_API_URL") or os.environ.get("DAYTONA_SERVER_URL") or DEFAULT_API_URL


def check_credentials() -> None:
    """Raise ``BackendUnavailable`` (one line naming the variables) when no credentials are set,
    looking where the SDK looks: the environment, then ``.env.local`` and ``.env``."""
    from daytona._utils.env import DaytonaEnvReader  # the pinned SDK's own lookup

    reader = DaytonaEnvReader()
    if reader.get("DAYTONA_API_KEY") or (reader.get("DAYTONA_JWT_TOKEN") and reader.get("DAYTONA_ORGANIZATION_ID")):
        return
    raise BackendUnavailable(CREDENTIALS_HINT)


def get_provider(settings: DaytonaSettings | None = None) -> DaytonaProvider:
    """The provider for ``DAYTONA_API_URL`` in the running event loop, created on first use (with
    ``settings``, else ``DaytonaSettings.from_env()``; later calls get the existing one)."""
    from daytona import AsyncDaytona, DaytonaAuthenticationError, DaytonaConfig, DaytonaError

    loop = asyncio.get_running_loop()
    url = api_url()
    per_loop = _providers.setdefault(loop, {})
    if url not in per_loop:
        check_credentials()
        try:
            client = AsyncDaytona(DaytonaConfig(api_url=url, connection_pool_maxsize=None))
        except DaytonaAuthenticationError as exc:
            raise BackendUnavailable(CREDENTIALS_HINT) from exc
        except DaytonaError as exc:
            raise BackendUnavailable(f"the Daytona client could not start: {_message(exc)}") from exc
        per_loop[url] = DaytonaProvider(settings or DaytonaSettings.from_env(), client)
    return per_loop[url]


async def close_providers() -> None:
    """Close every provider of the running event loop (their HTTP sessions); idempotent."""
    per_loop = _providers.pop(asyncio.get_running_loop(), {})
    for provider in per_loop.values():
        with contextlib.suppress(Exception):
            await provider.close()


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
        if why_not:
            self.warnings.append(f"{why_not}; building from the Dockerfile instead")
        self._sandbox = await self._create(snapshot)
        self.sandbox_id = self._sandbox.id
        self._apply_image_config()
        if self.spec.dockerfile is None:
            with contextlib.suppress(SandboxError):
                self.workdir = await provider.call("work dir", lambda: self._sandbox.get_work_dir()) or "/"
        probe = await self.exec(["/bin/sh", "-c", "cd /proc && echo [0-9]*"], timeout=30, cwd="/")
        self._baseline = probe.text.split()

    def _apply_image_config(self) -> None:
        if self.spec.dockerfile is not None:
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
        return CreateSandboxFromImageParams(image=_image(self.spec), resources=Resources(cpu=cpu, memory=memory, disk=disk), **common)

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
                return await wait_for(provider.client.create(self._params(name, snapshot), timeout=timeout), timeout + 15)
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
            sandbox = await self.provider.call(f"look up {name}", lambda: self.provider.client.get(name, request_timeout=self.provider.settings.request_timeout), attempts=3)
            await self._delete(sandbox)

    async def _delete(self, sandbox: Any) -> None:
        timeout = self.provider.settings.request_timeout
        with contextlib.suppress(SandboxGone):
            await self.provider.call(f"delete sandbox {sandbox.id}", lambda: sandbox.delete(timeout=timeout), attempts=4)

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

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        from daytona import DaytonaError, DaytonaTimeoutError

        sandbox = self._live()
        stdin_path = None
        if stdin is not None:
            stdin_path = f"/tmp/.termgym-stdin-{uuid.uuid4().hex}"
            await self._upload_bytes(stdin, stdin_path)
        script = exec_script(
            argv, env=self.env if env is None else env, cwd=cwd or self.workdir, timeout=timeout,
            output_limit=output_limit, stdin_path=stdin_path,
        )  # fmt: skip
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
        return ExecResult(exit_code=None if timed_out else code, output=output, timed_out=timed_out, dropped_bytes=dropped)

    async def open_process(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> ProcessChannel:
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
            f"upload to {path}", lambda: sandbox.fs.upload_files([FileUpload(source=data, destination=path)], timeout=seconds),
            timeout=seconds, attempts=3,
        )  # fmt: skip

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
            "download files", lambda: sandbox.fs.download_files([FileDownloadRequest(source=p) for p in paths], timeout=seconds),
            timeout=seconds, attempts=3,
        )  # fmt: skip
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
            sandbox = await provider.call(f"look up {sandbox_id}", lambda i=sandbox_id: provider.client.get(i, request_timeout=timeout))
        except SandboxGone:
            continue
        if _state(sandbox) in ("destroyed", "destroying"):
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


__all__ = [
    "DaytonaProvider",
    "DaytonaSandbox",
    "DaytonaSettings",
    "check_credentials",
    "close_providers",
    "collect_garbage",
    "environment_hash_of",
    "get_provider",
]
