"""The Docker backend's warm pool: started containers per ``Recipe``, so a trial's start takes a
ready one, with the guarantees of ``termgym.sandboxes.warm_pool`` (identical or nothing, once,
running, bounded, clean).

A ``Recipe`` is the one value the Docker backend creates every container from (image id, command,
labels, working directory, environment, network mode, CPU, memory, per-file size and pids limits,
init): a trial gets a pooled container only when it would have created the identical one. An
image rebuilt under the same tag has a new id: a new recipe. Pooled containers carry
``termgym.pool=<owner>`` besides the usual ``termgym=1`` and ``termgym.run``; the Docker backend's
first start in a later process removes the pooled containers of owners that no longer run on this
host (``owner_gone``), a SIGKILLed process's included. The pool talks to the engine only through
``PoolEngine`` (the Docker backend's adapter), so its logic is tested without an engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from termgym.sandboxes import warm_pool
from termgym.sandboxes.warm_pool import (
    DEFAULT_FILLERS,
    DEFAULT_TOTAL,
    POOL_LABEL,
    PoolSettings,
    owner_gone,
    owner_label,
    refill_count,
    this_owner,
)


@dataclass(frozen=True)
class Recipe:
    """Everything a container is created from; equal recipes make identical containers.
    ``labels`` and ``environment`` are sorted pairs, so equality does not depend on order."""

    image: str  # the image id (sha256:...), never a tag
    command: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    working_dir: str
    environment: tuple[tuple[str, str], ...]
    network_mode: str
    nano_cpus: int
    memory_mb: int
    storage_mb: int  # the per-file size limit (ulimit fsize)
    pids_limit: int
    init: bool = True


def make_recipe(
    *,
    image_id: str,
    command: Iterable[str],
    labels: Mapping[str, str],
    working_dir: str,
    environment: Mapping[str, str],
    network_mode: str,
    cpus: float,
    memory_mb: int,
    storage_mb: int,
    pids_limit: int,
) -> Recipe:
    """A ``Recipe`` from plain values; ``ValueError`` without an image id (a tag can move)."""
    if not image_id.startswith("sha256:"):
        raise ValueError(f"a recipe needs the image's id (sha256:...), got {image_id!r}")
    return Recipe(
        image=image_id,
        command=tuple(command),
        labels=tuple(sorted(labels.items())),
        working_dir=working_dir,
        environment=tuple(sorted(environment.items())),
        network_mode=network_mode,
        nano_cpus=int(cpus * 1e9),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        pids_limit=pids_limit,
    )


@dataclass(frozen=True)
class Ready:
    """A started container in the pool: its id and its keeper's host pid (as the engine lists it)."""

    container: str
    keeper: str | None


class PoolEngine(Protocol):
    """What the pool needs of the engine (the Docker backend implements it), by container id."""

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
        """Create a container from ``recipe`` with ``labels`` added and start it; raises on failure
        after removing what it made."""
        ...

    async def is_running(self, container: str) -> bool: ...

    def discard(self, container: str) -> None:
        """Start removing the container by force, in the background; never raises."""
        ...

    async def drain(self) -> None:
        """Wait until every removal ``discard`` started has ended."""
        ...


@dataclass(frozen=True)
class _ByContainer:
    """``PoolEngine`` as the generic pool's engine of ``Ready`` items."""

    engine: PoolEngine

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
        return await self.engine.create_started(recipe, labels)

    async def is_running(self, item: Ready) -> bool:
        return await self.engine.is_running(item.container)

    def discard(self, item: Ready) -> None:
        self.engine.discard(item.container)

    async def drain(self) -> None:
        await self.engine.drain()


class WarmPool(warm_pool.WarmPool[Recipe, Ready]):
    """The Docker backend's pool: started containers per ``Recipe`` (``termgym.sandboxes.warm_pool``),
    its engine and ``abandon`` by container id."""

    def __init__(self, engine: PoolEngine, settings: PoolSettings, *, owner: str | None = None) -> None:
        super().__init__(_ByContainer(engine), settings, owner=owner, name_of=lambda ready: ready.container)

    def abandon(self, *, discard: bool = True) -> list[str]:  # type: ignore[override]
        return [ready.container for ready in super().abandon(discard=discard)]


def settings_from_env(environ: Mapping[str, str]) -> PoolSettings:
    """``TERMGYM_DOCKER_POOL`` (per recipe, default 0: off), ``TERMGYM_DOCKER_POOL_TOTAL`` (default
    ``DEFAULT_TOTAL``) and ``TERMGYM_DOCKER_POOL_FILLERS`` (``termgym.sandboxes.warm_pool.settings_from_env``)."""
    return warm_pool.settings_from_env(environ, "TERMGYM_DOCKER_POOL")


__all__ = [
    "DEFAULT_FILLERS",
    "DEFAULT_TOTAL",
    "POOL_LABEL",
    "PoolSettings",
    "Ready",
    "Recipe",
    "WarmPool",
    "make_recipe",
    "owner_gone",
    "owner_label",
    "refill_count",
    "settings_from_env",
    "this_owner",
]
