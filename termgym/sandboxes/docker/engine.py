"""The Docker engine as the backend reaches it: one docker-py client per process, a thread pool
for its blocking calls (never on the event loop), the mapping of the SDK's faults to the error
tree, and what the engine's answers mean (a container's process list, its CPU count, stop events,
networks).

Faults: ``engine_errors()`` are what a call to the engine raises for a fault of the engine or of
the connection; ``mapped_error`` turns them into the error tree. Anything else is a bug of
termgym's and is never dressed up as a sandbox fault.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from termgym.errors import BackendUnavailable, SandboxBroken, SandboxError, SandboxGone

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
        _client = client
    return _client


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


def top_column(top: dict, title: str) -> list[str]:
    """One column of the engine's process list (``docker top``)."""
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


def switch_network(client: Any, container: str, enabled: bool) -> str | None:
    attached = set(client.api.inspect_container(container)["NetworkSettings"].get("Networks") or {})
    connected = attached - {"none"}
    if enabled == bool(connected):
        return None
    if not enabled:
        for name in sorted(connected):
            client.api.disconnect_container_from_network(container, name)
        return None
    if not client.api.networks(names=["bridge"]):
        return "the Docker engine has no bridge network (dockerd --bridge=none); the sandbox stays without network"
    if "none" in attached:
        client.api.disconnect_container_from_network(container, "none")
    client.api.connect_container_to_network(container, "bridge")
    return None


def network_for_task(client: Any) -> str:
    if client.api.networks(names=["bridge"]):
        return "bridge"
    raise SandboxError(
        "the task needs network, but the Docker engine has no bridge network (dockerd --bridge=none); "
        "run it without network with --network none, or give the engine a bridge"
    )
