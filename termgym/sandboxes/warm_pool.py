"""A warm pool of started sandboxes, so that a trial's start takes a ready one: the logic both the
Docker backend's pool (``termgym.sandboxes.docker.pool``: containers per ``Recipe``) and the
embedded backend's (``termgym.sandboxes.local.pool``: sandboxes per spec) run, over an engine
adapter (``PoolEngine``) that makes, checks and removes the backend's sandboxes.

Guarantees:
- **Identical or nothing.** A trial gets a pooled sandbox only when its own key (everything a
  sandbox is made from) is equal.
- **Once.** ``take`` hands an item out and forgets it; an item serves at most one trial.
- **Running.** An item the engine says is not running when taken is discarded and the next one
  taken (or None: the trial makes its own).
- **Bounded.** Idle plus being-made items never exceed ``PoolSettings.per_recipe`` per key nor
  ``PoolSettings.total`` over all (``refill_count``); refills run ``PoolSettings.fillers`` at a
  time, after a take or ``want`` unless ``refill_on_take`` is off (then ``prewarm`` alone fills).
- **Clean.** Every item carries ``termgym.pool=<owner>`` (``owner_label``), so ``termgym gc``
  removes it; ``close`` waits for makings under way and discards every idle item.

Not done: eviction of one key's idle items for another's, a pool shared between processes.
Settings and measurements: docs/guides/backends.md#warm-pool-rollouts."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from termgym.errors import ConfigError
from termgym.sandboxes.host_processes import start_time

POOL_LABEL = "termgym.pool"
DEFAULT_TOTAL = 32  # <PREFIX>_TOTAL when only <PREFIX> is set
DEFAULT_FILLERS = 2  # <PREFIX>_FILLERS: makings under way at once
REFILL_WHEN = ("take", "prewarm")  # <PREFIX>_REFILL: after every take (the default), or only by prewarm

K = TypeVar("K", bound=Hashable)
K_in = TypeVar("K_in", bound=Hashable, contravariant=True)  # an engine only takes keys
V = TypeVar("V")


@dataclass(frozen=True)
class PoolSettings:
    """``per_recipe``: containers kept ready per recipe (0: no pool); ``total``: over all recipes;
    ``fillers``: creations under way at once (more wait their turn), so that refills leave the
    engine to the trials running meanwhile; ``refill_on_take``: whether a take refills, or only
    ``prewarm`` does."""

    per_recipe: int = 0
    total: int = 0
    fillers: int = DEFAULT_FILLERS
    refill_on_take: bool = True

    @property
    def enabled(self) -> bool:
        return self.per_recipe > 0 and self.total > 0


def settings_from_env(environ: Mapping[str, str], prefix: str) -> PoolSettings:
    """``<prefix>`` (per key, default 0: off), ``<prefix>_TOTAL`` (default ``DEFAULT_TOTAL``),
    ``<prefix>_FILLERS`` (default ``DEFAULT_FILLERS``, at least 1) and ``<prefix>_REFILL`` (one of
    ``REFILL_WHEN``, default ``take``); ``ConfigError`` in one line for a value that is not one."""

    def count(name: str, default: int, least: int = 0) -> int:
        raw = environ.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a whole number of sandboxes") from None
        if value < least:
            raise ConfigError(f"{name}={raw!r}: expected {least} or more sandboxes")
        return value

    refill = environ.get(f"{prefix}_REFILL", "").strip() or REFILL_WHEN[0]
    if refill not in REFILL_WHEN:
        raise ConfigError(f"{prefix}_REFILL={refill!r}: expected one of {', '.join(REFILL_WHEN)}")
    return PoolSettings(
        per_recipe=count(prefix, 0),
        total=count(f"{prefix}_TOTAL", DEFAULT_TOTAL),
        fillers=count(f"{prefix}_FILLERS", DEFAULT_FILLERS, least=1),
        refill_on_take=refill == "take",
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


class PoolEngine(Protocol[K_in, V]):
    """What the pool needs of a backend: make a started item from a key, check and discard one."""

    async def create_started(self, recipe: K_in, labels: Mapping[str, str]) -> V:
        """Make a started sandbox from ``recipe`` with ``labels`` added; raises on failure after
        removing what it made."""
        ...

    async def is_running(self, item: V) -> bool: ...

    def discard(self, item: V) -> None:
        """Start removing the item by force, in the background; never raises."""
        ...

    async def drain(self) -> None:
        """Wait until every removal ``discard`` started has ended."""
        ...


@dataclass
class _Bucket(Generic[V]):
    idle: list[V] = field(default_factory=list)
    creating: int = 0
    fills: set[asyncio.Task[None]] = field(default_factory=set)


class WarmPool(Generic[K, V]):
    """Started sandboxes per key, within ``settings``' bounds (see the module's guarantees). Bound
    to the event loop it is first used on. ``name_of`` names an item in ``idle`` (default ``str``)."""

    def __init__(
        self,
        engine: PoolEngine[K, V],
        settings: PoolSettings,
        *,
        owner: str | None = None,
        name_of: Callable[[V], str] = str,
    ) -> None:
        self.engine, self.settings, self.name_of = engine, settings, name_of
        self.owner = owner or this_owner()
        self.created = 0  # containers this pool created, for reports and tests
        self.peak = 0  # the most it ever held (idle plus being created) at once
        self._buckets: dict[K, _Bucket[V]] = {}
        self._fills: set[asyncio.Task[None]] = set()
        self._fillers = asyncio.Semaphore(max(settings.fillers, 1))
        self.closed = False

    @property
    def labels(self) -> dict[str, str]:
        """The labels every pooled container gets besides its recipe's."""
        return {POOL_LABEL: self.owner}

    def held(self, recipe: K | None = None) -> int:
        """Idle plus being-created containers, of ``recipe`` or of all recipes."""
        buckets = [self._buckets.get(recipe, _Bucket())] if recipe is not None else list(self._buckets.values())
        return sum(len(b.idle) + b.creating for b in buckets)

    def idle(self, recipe: K | None = None) -> list[str]:
        """The ids of the idle containers, of ``recipe`` or of all recipes (a copy)."""
        buckets = [self._buckets.get(recipe, _Bucket())] if recipe is not None else list(self._buckets.values())
        return [self.name_of(ready) for bucket in buckets for ready in bucket.idle]

    async def take(self, recipe: K) -> V | None:
        """A running container made from ``recipe``, removed from the pool for good, or None
        (none ready: the caller creates its own). Either way the recipe's pool refills, unless
        ``refill_on_take`` is off."""
        bucket = self._buckets.setdefault(recipe, _Bucket())
        try:
            while bucket.idle and not self.closed:
                ready = bucket.idle.pop(0)  # taken before any await: no two callers get it
                try:
                    running = await self.engine.is_running(ready)
                except BaseException:  # cancelled, or the engine did not answer: it serves no one
                    self.engine.discard(ready)
                    raise
                if running:
                    return ready
                self.engine.discard(ready)  # stopped or gone: never handed out
            return None
        finally:
            if self.settings.refill_on_take:
                self.want(recipe)

    def want(self, recipe: K, count: int | None = None) -> list[asyncio.Task[None]]:
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

    async def prewarm(self, recipes: Iterable[K], count: int | None = None) -> int:
        """Fill the pools of ``recipes`` (up to ``count`` each, default the bound) and wait until
        their creations under way, refills included, have ended; the containers now idle for them."""
        recipes = list(dict.fromkeys(recipes))
        for recipe in recipes:
            self.want(recipe, count)
        buckets = [self._buckets[r] for r in recipes if r in self._buckets]
        while pending := [task for bucket in buckets for task in bucket.fills]:
            await asyncio.gather(*pending, return_exceptions=True)
        return sum(len(bucket.idle) for bucket in buckets)

    async def _fill(self, recipe: K, bucket: _Bucket[V]) -> None:
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
            self.engine.discard(ready)
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

    def abandon(self, *, discard: bool = True) -> list[V]:
        """Close without waiting (the pool's loop is gone or going): hand out nothing more, forget
        the idle items and return them, each discarded unless ``discard`` is False (the caller
        removes them). A making still under way removes what it makes."""
        self.closed = True
        idle = [ready for bucket in self._buckets.values() for ready in bucket.idle]
        self._buckets.clear()
        if discard:
            for item in idle:
                self.engine.discard(item)
        return idle
