"""Creating and removing the backend's containers, and the warm pool.

Every container is created from one ``Recipe`` (``termgym.sandboxes.docker.pool``) in one blocking
call (create, start, find the keeper). ``remove_later`` removes one in the background;
``wait_for_removals`` (and ``close_shared``, and the interpreter's exit) wait for what it started.
With ``TERMGYM_DOCKER_POOL`` set, ``warm_pool()`` keeps identical, started containers ready;
``remove_orphans`` removes the pooled containers a killed run left, once per process before its
first container; ``collect_garbage`` is ``termgym gc``'s removal of every labelled container.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from termgym.aio import uninterrupted
from termgym.sandboxes.docker.engine import (
    client_if_made,
    dialect_of,
    docker_client,
    in_thread,
    keeper_of,
    processes,
    submit,
)
from termgym.sandboxes.docker.pool import POOL_LABEL, Ready, Recipe, WarmPool, owner_gone, settings_from_env
from termgym.sandboxes.host_processes import start_time

KEPT_PREFIX = "termgym-kept-"  # the name keep() gives a container


def create_started(client: Any, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
    """Create a container from ``recipe`` (``labels`` added to its own), start it and find its
    keeper, in one blocking call (no loop hop between the engine's answers); the container is
    removed again when starting it fails."""
    import docker.types

    fsize = recipe.storage_mb << 20
    host_config = client.api.create_host_config(
        network_mode=recipe.network_mode,
        nano_cpus=recipe.nano_cpus,
        mem_limit=f"{recipe.memory_mb}m",
        memswap_limit=f"{recipe.memory_mb}m",
        pids_limit=recipe.pids_limit,
        ulimits=[
            docker.types.Ulimit(name=name, soft=soft, hard=hard)
            for name, soft, hard in dialect_of(client).ulimits(fsize)
        ],
        init=recipe.init,
    )
    created = client.api.create_container(
        recipe.image,
        command=list(recipe.command),
        labels={**dict(recipe.labels), **labels},
        host_config=host_config,
        working_dir=recipe.working_dir,
        environment=dict(recipe.environment),
    )
    try:
        client.api.start(created["Id"])
        return Ready(created["Id"], keeper_of(processes(client, created["Id"])))
    except BaseException:
        with contextlib.suppress(Exception):
            client.api.remove_container(created["Id"], force=True)
        raise


async def discard_ready(ready: Ready) -> None:  # made while its caller was cancelled
    remove_later(ready.container)


_removals: set[concurrent.futures.Future[None]] = set()
_removals_lock = threading.Lock()


def remove_later(container: str) -> None:
    """Start removing ``container`` by force in the backend's thread pool and return at once (a
    trial need not wait for the engine to tear its container down); ``wait_for_removals`` waits
    for it, and so do ``close_shared`` and the interpreter's exit. Never raises."""

    def remove() -> None:
        with contextlib.suppress(Exception):
            docker_client().api.remove_container(container, force=True)

    try:
        future = submit(remove)
    except RuntimeError:  # the interpreter is shutting down: no new threads, remove it here
        remove()
        return
    with _removals_lock:
        _removals.add(future)
    future.add_done_callback(_removed)


def _removed(future: concurrent.futures.Future[None]) -> None:
    with _removals_lock:
        _removals.discard(future)


def wait_for_removals(timeout: float | None = None) -> None:
    """Block until every removal ``remove_later`` started has ended (or ``timeout`` seconds)."""
    with _removals_lock:
        pending = list(_removals)
    concurrent.futures.wait(pending, timeout=timeout)


class _PoolEngine:
    """``termgym.sandboxes.docker.pool.PoolEngine`` on this backend."""

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
        client = await in_thread(docker_client)
        return await uninterrupted(in_thread(create_started, client, recipe, labels), discard_ready)

    async def is_running(self, container: str) -> bool:
        import docker.errors

        try:
            state = (await in_thread(docker_client().api.inspect_container, container)).get("State") or {}
        except docker.errors.NotFound:
            return False
        return state.get("Status") == "running" and bool(state.get("Running"))

    def discard(self, container: str) -> None:
        remove_later(container)

    async def drain(self) -> None:
        await asyncio.to_thread(wait_for_removals)


_warm: tuple[asyncio.AbstractEventLoop, WarmPool] | None = None


def warm_pool_on() -> bool:
    """Whether ``TERMGYM_DOCKER_POOL`` and ``TERMGYM_DOCKER_POOL_TOTAL`` turn the warm pool on."""
    return settings_from_env(os.environ).enabled


def warm_pool() -> WarmPool | None:
    """The process's warm pool (``termgym.sandboxes.docker.pool``), sized by
    ``TERMGYM_DOCKER_POOL`` and ``TERMGYM_DOCKER_POOL_TOTAL``, or None while they turn it off.
    One per event loop: a pool an earlier loop left open has its idle containers removed."""
    global _warm
    loop = asyncio.get_running_loop()
    if _warm is not None and _warm[0] is not loop:
        _warm[1].abandon()
        _warm = None
    if _warm is None:
        settings = settings_from_env(os.environ)
        if not settings.enabled:
            return None
        _warm = (loop, WarmPool(_PoolEngine(), settings))
    return _warm[1]


async def close_warm_pool() -> None:
    """Close the process's warm pool (its idle containers removed, ``WarmPool.close``); one an
    earlier event loop left is abandoned."""
    global _warm
    if _warm is not None:
        (loop, pool), _warm = _warm, None
        if loop is asyncio.get_running_loop():
            await pool.close()
        else:
            pool.abandon()


def remove_orphans(client: Any) -> int:
    """Remove the pooled containers (label ``termgym.pool``) whose owning process no longer runs
    on this host (a killed run's), kept ones (``--keep``) aside; how many were removed."""
    import docker.errors

    host, removed = socket.gethostname(), 0
    for container in client.api.containers(all=True, filters={"label": POOL_LABEL}):
        owner = (container.get("Labels") or {}).get(POOL_LABEL, "")
        kept = any(str(name).lstrip("/").startswith(KEPT_PREFIX) for name in container.get("Names") or [])
        if not kept and owner_gone(owner, host, start_time):
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container["Id"], force=True)
                removed += 1
    return removed


_swept = False


async def sweep_orphans_once(client: Any) -> None:
    """``remove_orphans``, once per process, before its first container."""
    global _swept
    if not _swept:
        _swept = True
        with contextlib.suppress(Exception):
            await in_thread(remove_orphans, client)


@atexit.register
def _remove_pool_at_exit() -> None:  # a process that never called close_shared leaves nothing idle
    client = client_if_made()
    if _warm is not None and client is not None:
        for container in _warm[1].abandon(discard=False):
            with contextlib.suppress(Exception):
                client.api.remove_container(container, force=True)


def collect_garbage(remove_images: bool = False, *, label: str | None = None) -> tuple[int, int]:
    """Remove every container labelled ``termgym=1`` (and ``label`` too where given: one Ray node's,
    ``termgym.node=<id>``) and, if asked, every cached task image; returns (containers, images) removed."""
    import docker.errors

    client = docker_client()
    labels = ["termgym=1", *([label] if label else [])]
    containers = client.api.containers(all=True, filters={"label": labels})
    for container in containers:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(container["Id"], force=True)
    images = 0
    if remove_images:
        for image in client.api.images(filters={"label": "termgym=1"}):
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_image(image["Id"], force=True)
                images += 1
    return len(containers), images


def node_labels() -> list[str]:
    """The Ray nodes (``termgym.node`` labels) this engine's termgym containers belong to."""
    containers = docker_client().api.containers(all=True, filters={"label": ["termgym=1", "termgym.node"]})
    return sorted({str((c.get("Labels") or {}).get("termgym.node")) for c in containers} - {"None"})


def kept_names() -> list[str]:
    """The names of the containers ``keep`` left running."""
    containers = docker_client().api.containers(all=True, filters={"label": "termgym=1", "name": KEPT_PREFIX})
    names = [str(name).lstrip("/") for c in containers for name in c.get("Names") or []]
    return sorted(name for name in names if name.startswith(KEPT_PREFIX))
