"""The Docker engine as the backend reaches it: one docker-py client per process, a thread pool
for its blocking calls (never on the event loop), the mapping of the SDK's faults to the error
tree, and what the engine's answers mean (a container's process list, its CPU count, stop events,
networks).

The engine may be Podman behind its Docker-compatible API (``DOCKER_HOST`` pointed at ``podman
system service``). Where Podman answers otherwise, ``Dialect`` says how, told from the engine's
own version report (``dialect_of``), never from the environment; everything else is asked of both
engines alike.

Faults: ``engine_errors()`` are what a call to the engine raises for a fault of the engine or of
the connection; ``mapped_error`` turns them into the error tree. Anything else is a bug of
termgym's and is never dressed up as a sandbox fault.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from termgym.errors import BackendUnavailable, SandboxBroken, SandboxError, SandboxGone
from termgym.sandboxes.limits import CONTROLLERS, WHAT

START_HINT = "start it with scripts/docker-engine.sh, or as root: dockerd --iptables=false --bridge=none &"

# What the container runs under its init: by absolute path, never looked up on the container's PATH
# (an agent could plant a `sleep` there, which every restart would run again). /bin/sleep is the
# image's own as long as the tamper check finds no change under /bin or /usr.
KEEPER = ("/bin/sleep", "infinity")
KEEPER_COMMAND = " ".join(KEEPER)  # as the engine lists it (docker top's CMD)

_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="termgym-docker")
_client: Any = None


async def in_thread(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))


def submit(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Run the blocking ``fn`` in the backend's thread pool and return its future at once;
    ``RuntimeError`` once the interpreter is shutting down."""
    return _pool.submit(fn)


def client_if_made() -> Any:
    """The process's client if one was made (None: nothing to clean up through it)."""
    return _client


def docker_client() -> Any:
    """The process's one docker-py client (``DOCKER_HOST`` or the local socket), API version
    negotiated; ``BackendUnavailable`` with a one-line hint when the daemon does not answer."""
    global _client
    if _client is None:
        try:
            import docker
            import docker.errors
        except ImportError as exc:
            raise BackendUnavailable("the Docker backend needs the docker package: pip install docker") from exc
        try:
            client = docker.from_env(version="auto", timeout=120)
            client.ping()
        except docker.errors.DockerException as exc:
            where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            raise BackendUnavailable(f"the Docker daemon is not answering at {where}; {START_HINT}") from exc
        if dialect_of(client).podman:
            client.api.__class__ = _podman_api(type(client.api))
        _client = client
    return _client


def podman_build_params(params: dict[str, Any]) -> dict[str, Any]:
    """A build's query as Podman reads it: its ``networkmode`` is a network policy, not a network,
    and its RUN steps share the host's network namespace unless ``nsoptions`` gives them their
    own. Their own it is, with network only where Docker's mode would be ``bridge``."""
    enabled = params.get("networkmode") == "bridge"
    return {
        **params,
        "networkmode": "NetworkEnabled" if enabled else "NetworkDisabled",
        "nsoptions": json.dumps([{"Name": "network", "Host": False}]),
    }


@functools.cache
def _podman_api(base: type) -> type:
    """docker-py's API client ``base`` with ``podman_build_params`` on every build it posts."""

    class PodmanAPIClient(base):
        def _post(self, url: str, **kwargs: Any) -> Any:
            if url.rstrip("/").endswith("/build"):
                kwargs["params"] = podman_build_params(dict(kwargs.get("params") or {}))
            return super()._post(url, **kwargs)

    return PodmanAPIClient


def engine_errors() -> tuple[type[Exception], ...]:
    """What a call to the engine raises for a fault of the engine or of the connection to it
    (the SDK's errors, the HTTP library's, the OS's); anything else is a bug of termgym's and is
    not dressed up as a sandbox fault."""
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.RequestException, OSError)


class Stopped(Exception):
    """The engine says the container is not running (as a 409 would)."""


def mapped_error(exc: BaseException, what: str) -> SandboxError:
    """SDK errors to the termgym tree: a removed container is SandboxGone; one that stopped (its
    init ended: every process in it was killed from inside, or its memory ran out) SandboxBroken;
    so is an engine that fails on what the container holds (a server error: a path longer than
    ``PATH_MAX`` breaks its diff, an archive whose entries conflict its upload), since what a
    container holds once the agent has acted is the agent's doing."""
    import docker.errors

    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, Stopped):
        return SandboxBroken(what)
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, docker.errors.NotFound):
        return SandboxGone(f"{what}: the container is gone")
    if isinstance(exc, docker.errors.APIError) and exc.status_code == 409:
        return SandboxBroken(f"{what}: the container has stopped (its processes were all killed from inside)")
    if isinstance(exc, docker.errors.APIError) and exc.is_server_error():
        return SandboxBroken(f"{what}: the engine failed on what the container holds: {message}")
    return SandboxError(f"{what}: {message}")


@dataclass(frozen=True)
class Dialect:
    """The engine behind the API, where its answers differ from Docker's: ``podman`` when the
    engine's version report names Podman (``dialect_of``), else Docker's own."""

    podman: bool = False
    version: str = ""
    unenforced: tuple[str, ...] = ()  # the limits it ignores (``unenforced_limits``)

    def limit_warnings(self) -> list[str]:
        """A warning for each limit a container is created with that the engine will not enforce."""
        return [
            f"{what} limit not enforced: {UNENFORCED[limit]}"
            for limit, what in LIMITS.items()
            if limit in self.unenforced
        ]

    @property
    def top_args(self) -> str | None:
        """The process list's ``ps_args``. Docker runs the host's ``ps -ef`` and lists host pids;
        Podman runs ``ps`` inside the container for anything but its own descriptors (a program
        the agent could replace, absent from a minimal image: the list comes back empty), so it
        is asked for its own: pids as the container sees them, which is all the backend compares."""
        return "pid,ppid,args" if self.podman else None

    @property
    def unsets_env(self) -> bool:
        """Whether an exec's environment entry without ``=`` unsets the container's variable
        (Docker's); Podman refuses the exec instead (and adds ``TERM``, ``container`` and ``HOME``
        of its own to every container's variables)."""
        return not self.podman

    @property
    def follows_links(self) -> bool:
        """Whether the engine's archive of a path that is a link is what the link leads to (Podman's)
        rather than the link (Docker's); both say in the archive's stat that the path is a link,
        and where it finally leads."""
        return self.podman

    def archive_path(self, path: str) -> str:
        """``path`` as the archive API reads it literally: Podman matches it as a glob pattern (a
        file named ``[a]`` would be read as ``a``), so there its ``*?[`` and backslashes are escaped."""
        return re.sub(r"([\\*?\[])", r"\\\1", path) if self.podman else path

    @property
    def hides_own_files(self) -> bool:
        """Whether the engine's diff leaves out the files it puts into every container but still
        lists the directories they are in: Podman's (its init, ``/run/.containerenv``,
        ``/etc/hosts``, ``/etc/mtab``; ``/etc`` and ``/run`` listed as changed, or added where the
        image has none). Its diff of a fresh container is then the engine's own doing."""
        return self.podman

    def ulimits(self, fsize: int) -> list[tuple[str, int, int]]:
        """The ulimits a container is created with (name, soft, hard): the per-file size limit.
        Podman sets open files and user processes to 1048576 as soon as any ulimit is given, which
        an engine without ``CAP_SYS_RESOURCE`` cannot grant (the container does not start; Podman
        4.3, as Debian 12 ships it, does not lower them); there they are given too, at
        ``OPEN_FILES`` and ``USER_PROCESSES``."""
        limits = [("fsize", fsize, fsize)]
        if self.podman:
            limits += [("nofile", *OPEN_FILES), ("nproc", USER_PROCESSES, USER_PROCESSES)]
        return limits


DOCKER = Dialect()
LIMITS = {**WHAT, "storage": "storage"}  # what a container is created with: its cgroup limits, the per-file size
UNENFORCED = {
    **dict.fromkeys(CONTROLLERS, "rootless Podman here has no such cgroup controller to set"),
    "storage": "rootless Podman's Docker-compatible API drops a container's ulimits (the per-file size)",
}
OPEN_FILES = (1024, 16384)  # soft, hard: Docker's soft default; a hard limit an unprivileged engine can give
USER_PROCESSES = 32768  # the kernel's default pid_max; the pids limit bounds a container far below it


@functools.cache
def dialect_of(client: Any) -> Dialect:
    """The engine's ``Dialect``, asked once per client; Docker's where the engine does not say.
    For Podman, its own host report (``/libpod/info``) tells which limits it enforces."""
    try:
        report = client.version()
    except Exception:  # an engine that does not report itself is taken for Docker
        report = {}
    names = [str(c.get("Name") or "") for c in report.get("Components") or [] if isinstance(c, dict)]
    if not any(name.startswith("Podman") for name in names):
        return DOCKER
    try:
        answer = client.api.get(f"{client.api.base_url}/v{client.api.api_version}/libpod/info", timeout=30)
        host = answer.json().get("host") or {} if answer.ok else {}
    except Exception:  # a Podman that does not report its host: taken to enforce what it is given
        host = {}
    return Dialect(podman=True, version=str(report.get("Version") or ""), unenforced=unenforced_limits(host))


def unenforced_limits(host: dict) -> tuple[str, ...]:
    """The limits of ``LIMITS`` that Podman, by its host report, ignores: as root, none. Rootless:
    the per-file size (its Docker-compatible API drops a rootless container's ``Ulimits``, as 4.3
    does: the container's inspection lists none), and the cgroup limits: on cgroup v1 all ("Resource
    limits are not supported and ignored on cgroups V1 rootless systems", Podman says per
    container), on v2 those whose controller is not delegated to the user (not in
    ``cgroupControllers``)."""
    if not (host.get("security") or {}).get("rootless"):
        return ()
    delegated = set(host.get("cgroupControllers") or ()) if host.get("cgroupVersion") == "v2" else set()
    return (*(controller for controller in CONTROLLERS if controller not in delegated), "storage")


def processes(client: Any, container: str) -> dict:
    """The engine's process list of ``container`` (``docker top``) in Docker's shape: ``Titles``
    with ``PID``, ``PPID`` and ``CMD`` (Podman's ``COMMAND`` renamed)."""
    args = dialect_of(client).top_args
    top = client.api.top(container, ps_args=args) if args else client.api.top(container)
    titles = ["CMD" if title == "COMMAND" else title for title in top.get("Titles") or []]
    return {**top, "Titles": titles}


def top_column(top: dict, title: str) -> list[str]:
    """One column of the engine's process list (``processes``)."""
    titles = top.get("Titles") or []
    index = titles.index(title) if title in titles else None
    return [row[index] for row in top.get("Processes") or []] if index is not None else []


def keeper_of(top: dict) -> str | None:
    """The keeper's pid in a fresh container's process list: the one process running ``KEEPER``
    (the image's entrypoint may run services beside it, and execs or runs the keeper as the
    command). Recorded before the agent runs anything, so no process of the agent's is among them."""
    keepers = [pid for pid, command in zip(top_column(top, "PID"), top_column(top, "CMD")) if command == KEEPER_COMMAND]
    return keepers[0] if len(keepers) == 1 else None


def keeper_among(top: dict) -> str | None:
    """The keeper's pid in a running container's process list, orphans the agent left included:
    the oldest ``KEEPER_COMMAND`` whose parent is the container's init."""
    pids, parents, commands = top_column(top, "PID"), top_column(top, "PPID"), top_column(top, "CMD")
    inits = {pid for pid, parent in zip(pids, parents) if parent not in pids}
    keepers = [pid for pid, parent, cmd in zip(pids, parents, commands) if parent in inits and cmd == KEEPER_COMMAND]
    return min(keepers, key=int) if keepers else None


def stop_requests(client: Any, container: str, since: float) -> list[str]:
    """The engine's kill and stop events for ``container`` since ``since`` (requests made through its API)."""
    until = time.time() + 1
    events = client.api.events(
        since=since, until=until, decode=True, filters={"container": container, "event": ["kill", "stop"]}
    )
    return [f"docker {e.get('Action') or e.get('status')}" for e in events]


@functools.cache
def engine_cpus(client: Any) -> int | None:
    """The engine's CPU count (asked once per client), or None when it does not say."""
    try:
        return int(client.info().get("NCPU") or 0) or None
    except Exception:
        return None


def has_bridge(client: Any) -> bool:
    """Whether the engine has a network named ``bridge``: Docker's, unless dockerd runs with
    ``--bridge=none``; Podman lists its default network under that name (its name filter knows it
    only by its own, ``podman``), and creates a container in it when asked for ``bridge``."""
    return any(network.get("Name") == "bridge" for network in client.api.networks() or [])


def switch_network(client: Any, container: str, enabled: bool) -> str | None:
    attached = set(client.api.inspect_container(container)["NetworkSettings"].get("Networks") or {})
    connected = attached - {"none"}
    if enabled == bool(connected):
        return None
    if not enabled:
        for name in sorted(connected):
            client.api.disconnect_container_from_network(container, name)
        return None
    if not has_bridge(client):
        return "the Docker engine has no bridge network (dockerd --bridge=none); the sandbox stays without network"
    if dialect_of(client).podman and not attached:
        return "Podman cannot connect a running container that has no network; the sandbox stays without network"
    if "none" in attached:
        client.api.disconnect_container_from_network(container, "none")
    client.api.connect_container_to_network(container, "bridge")
    return None


def network_for_task(client: Any) -> str:
    if has_bridge(client):
        return "bridge"
    raise SandboxError(
        "the task needs network, but the Docker engine has no bridge network (dockerd --bridge=none); "
        "run it without network with --network none, or give the engine a bridge"
    )
