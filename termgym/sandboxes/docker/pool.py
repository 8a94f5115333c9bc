"""A warm pool of started Docker containers, so a trial's start takes a ready one.

What it guarantees:

- **Identical or nothing.** A pooled container is made from a ``Recipe``, the one value the Docker
  backend creates every container from (image id, command, labels, working directory,
  environment, network mode, CPU, memory, per-file size and pids limits, init). The recipe is the
  pool's key, so a trial gets a pooled container only when its own recipe is equal, that is when
  it would have created the identical container; any other trial creates its own, as without a
  pool. An image rebuilt under the same tag has a new id: a new recipe.
- **Once.** ``take`` hands a container out and forgets it; nothing ever gives one back, so a
  container serves at most one trial (used, cancelled and failed trials alike remove theirs).
- **Running.** A container whose engine state is not running when taken is removed and the next
  one is taken (or None: the trial creates its own).
- **Bounded.** Per recipe, idle plus being-created containers never exceed
  ``PoolSettings.per_recipe``, and over all recipes never ``PoolSettings.total``
  (``refill_count``). A take, and a trial that found its recipe's pool empty (``want``), refill
  it in the background up to the bound, ``PoolSettings.fillers`` creations at a time.
- **Clean.** Every pooled container carries the label ``termgym.pool=<owner>`` (``owner_label``:
  host, pid and the pid's start time) besides the usual ``termgym=1`` and ``termgym.run``, so
  ``termgym gc`` removes it; ``close`` waits for creations under way and removes every idle
  container; the Docker backend's first start in a later process removes the pooled containers
  of owners that no longer run on this host (``owner_gone``), a SIGKILLed process's included.

What it does not do: evict one recipe's idle containers to make room for another's (the first
recipes to fill take the total), or share a pool between processes.

The pool talks to the engine only through ``PoolEngine`` (the Docker backend's adapter), so its
logic is tested without an engine.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from termgym.errors import ConfigError
from termgym.sandboxes.host_processes import start_time

POOL_LABEL = "termgym.pool"
DEFAULT_TOTAL = 32  # TERMGYM_DOCKER_POOL_TOTAL when only TERMGYM_DOCKER_POOL is set
DEFAULT_FILLERS = 2  # TERMGYM_DOCKER_POOL_FILLERS: creations under way at once


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
class PoolSettings:
    """``per_recipe``: containers kept ready per recipe (0: no pool); ``total``: over all recipes;
    ``fillers``: creations under way at once (more wait their turn), so that refills leave the
    engine to the trials running meanwhile."""

    per_recipe: int = 0
    total: int = 0
    fillers: int = DEFAULT_FILLERS

    @property
    def enabled(self) -> bool:
        return self.per_recipe > 0 and self.total > 0


def settings_from_env(environ: Mapping[str, str]) -> PoolSettings:
    """``TERMGYM_DOCKER_POOL`` (per recipe, default 0: off), ``TERMGYM_DOCKER_POOL_TOTAL``
    (default ``DEFAULT_TOTAL``) and ``TERMGYM_DOCKER_POOL_FILLERS`` (default ``DEFAULT_FILLERS``,
    at least 1); ``ConfigError`` in one line for a value that is not a count."""

    def count(name: str, default: int, least: int = 0) -> int:
        raw = environ.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a whole number of containers") from None
        if value < least:
            raise ConfigError(f"{name}={raw!r}: expected {least} or more containers")
        return value

    return PoolSettings(
        per_recipe=count("TERMGYM_DOCKER_POOL", 0),
        total=count("TERMGYM_DOCKER_POOL_TOTAL", DEFAULT_TOTAL),
        fillers=count("TERMGYM_DOCKER_POOL_FILLERS", DEFAULT_FILLERS, least=1),
    )


def refill_count(settings: PoolSettings, held: int, held_total: int, wanted: int | None = None) -> int:
    """How many containers to start creating for one recipe that holds ``held`` (idle plus being
    created) while all recipes hold ``held_total``: up to ``wanted`` (default the per-recipe
    bound), never past either bound."""
    target = settings.per_recipe if wanted is None else min(wanted, settings.per_recipe)
    return max(0, min(target - held, settings.total - held_total))


# -- owners: which process a pooled container belongs to -------------------------------------------


def owner_label(host: str, pid: int, started: int | None) -> str:
    """The ``termgym.pool`` label of a process's pooled containers: ``host/pid/start`` (the start
    time in clock ticks since boot, ``host_processes.start_time``)."""
    return f"{host}/{pid}/{started}"


def owner_gone(owner: str, host: str, start_of: Callable[[int], int | None]) -> bool:
    """Whether the process named by ``owner`` (``owner_label``) no longer runs, as far as this
    ``host`` can tell: only an owner on this host whose pid is gone or was reused (another start
    time) is gone; one of another host, or a label not made by ``owner_label``, is not."""
    parts = owner.split("/")
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return False
    started = start_of(int(parts[1]))
    return started is None or str(started) != parts[2]


def this_owner() -> str:
    """This process's ``owner_label``."""
    return owner_label(socket.gethostname(), os.getpid(), start_time(os.getpid()))


# -- the pool --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """A started container in the pool: its id and its keeper's host pid (as the engine lists it)."""

    container: str
    keeper: str | None


class PoolEngine(Protocol):
    """What the pool needs of the engine (the Docker backend implements it)."""

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


@dataclass
class _Bucket:
    idle: list[Ready] = field(default_factory=list)
    creating: int = 0
    fills: set[asyncio.Task[None]] = field(default_factory=set)


class WarmPool:
    """Started containers per ``Recipe``, within ``settings``' bounds (see the module's guarantees).
    Bound to the event loop it is first used on."""

    def __init__(self, engine: PoolEngine, settings: PoolSettings, *, owner: str | None = None) -> None:
        self.engine, self.settings = engine, settings
        self.owner = owner or this_owner()
        self.created = 0  # containers this pool created, for reports and tests
        self.peak = 0  # the most it ever held (idle plus being created) at once
        self._buckets: dict[Recipe, _Bucket] = {}
        self._fills: set[asyncio.Task[None]] = set()
        self._fillers = asyncio.Semaphore(max(settings.fillers, 1))
        self.closed = False

    @property
    def labels(self) -> dict[str, str]:
        """The labels every pooled container gets besides its recipe's."""
        return {POOL_LABEL: self.owner}

    def held(self, recipe: Recipe | None = None) -> int:
        """Idle plus being-created containers, of ``recipe`` or of all recipes."""
        buckets = [self._buckets.get(recipe, _Bucket())] if recipe is not None else list(self._buckets.values())
        return sum(len(b.idle) + b.creating for b in buckets)

    def idle(self, recipe: Recipe | None = None) -> list[str]:
        """The ids of the idle containers, of ``recipe`` or of all recipes (a copy)."""
        buckets = [self._buckets.get(recipe, _Bucket())] if recipe is not None else list(self._buckets.values())
        return [ready.container for bucket in buckets for ready in bucket.idle]

    async def take(self, recipe: Recipe) -> Ready | None:
        """A running container made from ``recipe``, removed from the pool for good, or None
        (none ready: the caller creates its own). Either way the recipe's pool refills."""
        bucket = self._buckets.setdefault(recipe, _Bucket())
        try:
            while bucket.idle and not self.closed:
                ready = bucket.idle.pop(0)  # taken before any await: no two callers get it
                try:
                    running = await self.engine.is_running(ready.container)
                except BaseException:  # cancelled, or the engine did not answer: it serves no one
                    self.engine.discard(ready.container)
                    raise
                if running:
                    return ready
                self.engine.discard(ready.container)  # stopped or gone: never handed out
            return None
        finally:
            self.want(recipe)

    def want(self, recipe: Recipe, count: int | None = None) -> list[asyncio.Task[None]]:
        """Start creating ``recipe``'s containers in the background, up to ``count`` held (default
        the per-recipe bound) within the bounds; the creations started."""
        if self.closed or not self.settings.enabled:
            return []
        bucket = self._buckets.setdefault(recipe, _Bucket())
        started = []
        for _ in range(refill_count(self.settings, self.held(recipe), self.held(), count)):
            bucket.creating += 1
            task = asyncio.get_running_loop().create_task(self._fill(recipe, bucket))
            for fills in (self._fills, bucket.fills):
                fills.add(task)
                task.add_done_callback(fills.discard)
            started.append(task)
        self.peak = max(self.peak, self.held())
        return started

    async def prewarm(self, recipes: Iterable[Recipe], count: int | None = None) -> int:
        """Fill the pools of ``recipes`` (up to ``count`` each, default the bound) and wait until
        their creations under way, refills included, have ended; the containers now idle for them."""
        recipes = list(dict.fromkeys(recipes))
        for recipe in recipes:
            self.want(recipe, count)
        buckets = [self._buckets[r] for r in recipes if r in self._buckets]
        while pending := [task for bucket in buckets for task in bucket.fills]:
            await asyncio.gather(*pending, return_exceptions=True)
        return sum(len(bucket.idle) for bucket in buckets)

    async def _fill(self, recipe: Recipe, bucket: _Bucket) -> None:
        try:
            async with self._fillers:
                if self.closed:  # closed while this creation waited its turn
                    return
                ready = await self.engine.create_started(recipe, self.labels)
        except Exception:
            return
        finally:
            bucket.creating -= 1
        self.created += 1
        if self.closed:
            self.engine.discard(ready.container)
        else:
            bucket.idle.append(ready)

    async def settle(self) -> None:
        """Wait until the creations under way (refills included) have ended."""
        while self._fills:
            await asyncio.gather(*list(self._fills), return_exceptions=True)

    async def close(self) -> None:
        """Wait for the creations under way, then remove every idle container and wait for the
        removals; the pool then hands out nothing. Idempotent."""
        self.closed = True
        await self.settle()
        self.abandon()
        await self.engine.drain()

    def abandon(self, *, discard: bool = True) -> list[str]:
        """Close without waiting (the pool's loop is gone or going): hand out nothing more, forget
        the idle containers and return their ids, each discarded unless ``discard`` is False
        (the caller removes them). A creation still under way removes what it makes."""
        self.closed = True
        idle = [ready.container for bucket in self._buckets.values() for ready in bucket.idle]
        self._buckets.clear()
        if discard:
            for container in idle:
                self.engine.discard(container)
        return idle
