"""Daytona providers: one per API URL and event loop, each with the SDK's async client, the creation
``Pacer`` and cap on live sandboxes, and the snapshots known to be ready or broken; the settings
(``TERMGYM_DAYTONA_*``); how an SDK error is classified and reported. The sandbox itself is in
``backend.py``, the pure policy (retries, names, scripts) in ``policy.py``.

The SDK's shared HTTP session trusts the environment (aiohttp's ``trust_env``): before every
request it looks up a proxy and netrc credentials in the environment, two thread-pool round trips
that were about a third of the driver's CPU per trial (docs/results/benchmarks.md, "Driver cost per
trial"). When the environment has no proxy and no netrc file as a provider starts (then the
lookups find nothing: ``environment_routes_requests``), its session skips them; otherwise it keeps
the SDK's behaviour. ``DaytonaProvider.env_lookups`` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import urllib.request
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from termgym.aio import wait_for
from termgym.errors import BackendUnavailable, ConfigError, EnvironmentBuildError, SandboxError, SandboxGone
from termgym.images.build import builds_dockerfile
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.daytona.policy import (
    ContextEntry,
    FailureClass,
    RetryPolicy,
    classify_failure,
    daytona_resources,
    environment_hash,
    environment_routes_requests,
    paced_windows,
    retry_after_seconds,
    retry_delay,
    snapshot_name,
)
from termgym.sandboxes.pacing import Pacer

DEFAULT_API_URL = "https://app.daytona.io/api"
CREDENTIALS_HINT = (
    "the daytona backend needs credentials: set DAYTONA_API_KEY (or DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID),"
    " and DAYTONA_API_URL for an API other than https://app.daytona.io/api (DAYTONA_TARGET picks a region)"
)
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
        if (
            min(self.create_timeout, self.request_timeout) <= 0
            or min(self.auto_stop_minutes, self.ttl_minutes) < 1
            or self.pace_guard < 0
        ):
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
        self.env_lookups = True  # the SDK's session looks up proxies and netrc before every request
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._snapshots_ready: set[str] = set()
        self._snapshots_failed: dict[str, EnvironmentBuildError] = {}

    async def close(self) -> None:
        await self.client.close()

    async def call(
        self, what: str, make: Callable[[], Any], *, timeout: float | None = None, attempts: int | None = None
    ) -> Any:
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
                state = state_of(snapshot)
                if state in READY_STATES:
                    self._snapshots_ready.add(name)
                elif state in FAILED_STATES and created and snapshot is not None:  # a state implies a snapshot
                    reason = snapshot.error_reason
                    error = EnvironmentBuildError(
                        f"building snapshot {name} for {spec.name} failed: {reason or state}", log=reason or ""
                    )
                    self._snapshots_failed[name] = error
                    raise error
                elif state in FAILED_STATES or snapshot is None:
                    if state in FAILED_STATES:  # an earlier build failed: try once more from here
                        with contextlib.suppress(SandboxError):
                            await self.call(f"delete snapshot {name}", lambda: self.client.snapshot.delete(name))
                    cpu, memory, disk = daytona_resources(spec.resources)
                    params = CreateSnapshotParams(
                        name=name, image=image_of(spec), resources=Resources(cpu=cpu, memory=memory, disk=disk)
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


def failure_of(exc: Exception) -> tuple[FailureClass, float | None]:
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


def state_of(resource: Any) -> str | None:
    state = getattr(resource, "state", None)
    return None if state is None else str(getattr(state, "value", state)).lower()


def builds_on_daytona(spec: SandboxSpec) -> bool:
    """Whether the sandbox is built from the task's Dockerfile rather than run from its
    ``docker_image`` (the named image wins unless ``--build``; ``builds_dockerfile``)."""
    return builds_dockerfile(spec.dockerfile, spec.image, spec.prefer_build)


def image_of(spec: SandboxSpec) -> Any:
    """What a snapshot or a sandbox is made from: the Dockerfile (``Image.from_dockerfile``) when
    it is built, else the task's ``docker_image`` as an image reference (a snapshot's
    ``imageName``; a sandbox made without a snapshot gets ``FROM ref``)."""
    from daytona import Image

    if builds_on_daytona(spec):
        assert spec.dockerfile is not None
        return Image.from_dockerfile(spec.dockerfile)
    if spec.image:
        return spec.image
    raise ConfigError(f"{spec.name}: a Daytona sandbox needs a Dockerfile or an image")


def image_record(spec: SandboxSpec) -> dict[str, str]:
    """What a trial's record says of its Daytona image (``Sandbox.image``): ref and source."""
    if builds_on_daytona(spec):
        return {"ref": str(spec.dockerfile), "source": "build"}
    return {"ref": spec.image or "", "source": "docker_image"}


def environment_hash_of(spec: SandboxSpec) -> str:
    """The content hash of a task's environment (reads its Dockerfile and build context)."""
    if not builds_on_daytona(spec):  # the named image: its Dockerfile and context play no part
        return environment_hash(None, [], spec.image, daytona_resources(spec.resources))
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

_providers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, DaytonaProvider]] = (
    weakref.WeakKeyDictionary()
)


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
        provider = DaytonaProvider(settings or DaytonaSettings.from_env(), client)
        provider.env_lookups = not skip_environment_lookups(client)
        per_loop[url] = provider
    return per_loop[url]


def netrc_file_exists() -> bool:
    """Whether the netrc file aiohttp would read exists (``$NETRC``, else ``~/.netrc``)."""
    return os.path.exists(os.environ.get("NETRC") or os.path.expanduser("~/.netrc"))


def skip_environment_lookups(client: Any) -> bool:
    """Turn off the per-request proxy and netrc lookups of ``client``'s shared HTTP session (made
    now, in the running loop, as its first request would make it) when the environment has neither
    (``environment_routes_requests``); True when they are off. The pinned SDK keeps that session
    in ``_shared_session`` for both of its API clients; with another layout nothing changes (the
    lookups stay, which costs CPU only)."""
    import aiohttp

    if environment_routes_requests(urllib.request.getproxies(), netrc_file_exists()):
        return False
    shared = getattr(client, "_shared_session", None)
    rest_client = getattr(getattr(client, "_api_client", None), "rest_client", None)
    ensure = getattr(shared, "_ensure_session", None)
    if ensure is None or rest_client is None:
        return False
    ensure(rest_client)
    session = getattr(shared, "_session", None)
    if not isinstance(session, aiohttp.ClientSession) or "_trust_env" not in session.ATTRS:
        return False
    session._trust_env = False
    return True


async def close_providers() -> None:
    """Close every provider of the running event loop (their HTTP sessions); idempotent."""
    per_loop = _providers.pop(asyncio.get_running_loop(), {})
    for provider in per_loop.values():
        with contextlib.suppress(Exception):
            await provider.close()
