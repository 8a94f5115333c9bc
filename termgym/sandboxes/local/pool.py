"""The embedded backend's warm pool: started sandboxes per recipe, so that a trial's ``start`` takes
one whose keeper already runs, with the guarantees of ``termgym.sandboxes.warm_pool`` (identical or
nothing, once, running, bounded, clean).

On with ``TERMGYM_LOCAL_POOL=N`` (N ready per recipe; ``TERMGYM_LOCAL_POOL_TOTAL``, default 32, over
all; ``TERMGYM_LOCAL_POOL_FILLERS``, default 2, started at once; ``TERMGYM_LOCAL_POOL_REFILL``,
``take`` or ``prewarm``, when it refills). A recipe (``recipe_of``) is everything of a spec a
started sandbox depends on, names and labels aside: the environment's files by content (the
Dockerfile's bytes and every name, mode, byte and symlink target of the build context,
``termgym.images.context``; never sizes or times, which two different contexts can share), the
image, the resources, the network, the environment, the build timeout and the image aliases. A
pooled sandbox is started in full, the prepared-environment cache used as for any trial, the tamper
check's baseline taken, the agent's shell started (``LocalSandbox._start_agent_shell``: an episode
gets it only if it asks for exactly that launch); the trial adopts it (its directory's labels
rewritten to the trial's) and it never goes back. The pool is filled in the background after each take (unless
``REFILL=prewarm``), and ahead of a step by the scheduler's prewarm (``HOOKS.prewarm``). Pooled
sandboxes end with the process (their keepers run with ``--die-with-parent``), so ``termgym gc``
removes what a killed run's pool left like any other leftover; ``close_shared`` (a run's end)
stops the idle ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from termgym.errors import SandboxError
from termgym.images.context import context_digest
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.warm_pool import PoolSettings, WarmPool, settings_from_env

ENV_PREFIX = "TERMGYM_LOCAL_POOL"
Recipe = tuple[object, ...]
Maker = Callable[[SandboxSpec], Sandbox]  # a pooled sandbox of a spec (the backend's, never taking from the pool)


def recipe_of(spec: SandboxSpec) -> Recipe:
    """What a started sandbox of ``spec`` depends on, as a hashable value (the module docstring).
    Reads every byte of the build context: call it off the event loop (``take`` and ``prewarm`` do)."""
    return (
        files_digest(spec.context_dir, spec.dockerfile),
        spec.image,
        spec.resources,
        spec.network,
        tuple(sorted(spec.env.items())),
        spec.build_timeout_sec,
        tuple(sorted(spec.image_aliases.items())),
        spec.pull,
        spec.prefer_build,
    )


def files_digest(context: Path | None, dockerfile: Path | None) -> str:
    """The environment's files by content: the Dockerfile's bytes (or that there is none) and the
    build context's (``termgym.images.context.context_digest``, what ``COPY`` may read)."""
    digest = hashlib.sha256(b"termgym-local-recipe-1\0")
    dockerfile_bytes = dockerfile.read_bytes() if dockerfile is not None and dockerfile.is_file() else None
    for field in (
        b"none" if dockerfile_bytes is None else b"dockerfile:" + hashlib.sha256(dockerfile_bytes).digest(),
        context_digest(context if context is not None and context.is_dir() else None).encode(),
    ):
        digest.update(len(field).to_bytes(8, "little") + field)
    return digest.hexdigest()


class _Engine:
    """``termgym.sandboxes.warm_pool.PoolEngine`` over embedded sandboxes: the spec a recipe was
    first seen with is the one its pooled sandboxes are made from, by ``make``."""

    def __init__(self, make: Maker) -> None:
        self.make = make
        self.specs: dict[Recipe, SandboxSpec] = {}
        self._removals: set[asyncio.Task[None]] = set()

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Sandbox:
        spec = self.specs[recipe]
        sandbox = self.make(replace(spec, labels={**spec.labels, **labels}))
        try:
            await sandbox.start()
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    async def is_running(self, item: Sandbox) -> bool:
        try:
            await item.check_alive()
        except SandboxError:
            return False
        return True

    def discard(self, item: Sandbox) -> None:
        task = asyncio.get_running_loop().create_task(item.stop())
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def drain(self) -> None:
        while self._removals:
            await asyncio.gather(*list(self._removals), return_exceptions=True)


_pool: tuple[asyncio.AbstractEventLoop, WarmPool[Recipe, Sandbox], _Engine] | None = None


def settings() -> PoolSettings:
    return settings_from_env(os.environ, ENV_PREFIX)


def warm_pool_on() -> bool:
    """Whether ``TERMGYM_LOCAL_POOL`` turns the pool on."""
    return settings().enabled


def _current(make: Maker | None = None) -> tuple[WarmPool[Recipe, Sandbox], _Engine] | None:
    """The process's pool on this event loop, made on first use (by a caller that says how pooled
    sandboxes are made); None while it is off, or not made yet. A pool an earlier loop left is
    abandoned (its idle sandboxes end with their keepers' process)."""
    global _pool
    loop = asyncio.get_running_loop()
    if _pool is not None and _pool[0] is not loop:
        _pool[1].abandon(discard=False)
        _pool = None
    if _pool is None:
        chosen = settings()
        if not chosen.enabled or make is None:
            return None
        engine = _Engine(make)
        _pool = (loop, WarmPool(engine, chosen, name_of=_name), engine)
    return _pool[1], _pool[2]


async def take(spec: SandboxSpec, make: Maker) -> Sandbox | None:
    """A started sandbox for ``spec`` from the pool (None: off, or none ready); the pool refills,
    its sandboxes made by ``make``."""
    current = _current(make)
    if current is None:
        return None
    pool, engine = current
    recipe = await asyncio.to_thread(recipe_of, spec)  # reads the build context: off the loop
    engine.specs.setdefault(recipe, spec)
    return await pool.take(recipe)


async def prewarm(specs: Sequence[SandboxSpec], make: Maker, count: int | None = None) -> int:
    """Fill the pool for ``specs`` (up to ``count`` each), its sandboxes made by ``make``, and wait
    until it is; how many are ready."""
    current = _current(make)
    if current is None:
        return 0
    pool, engine = current
    recipes = await asyncio.to_thread(lambda: [recipe_of(spec) for spec in specs])  # off the loop
    for spec, recipe in zip(specs, recipes, strict=True):
        engine.specs.setdefault(recipe, spec)
    return await pool.prewarm(recipes, count)


async def close() -> None:
    """Stop the idle pooled sandboxes and those being made (a run's end); the next use makes a new pool."""
    global _pool
    if _pool is None or _pool[0] is not asyncio.get_running_loop():
        return
    _, pool, _ = _pool
    _pool = None
    await pool.close()


def held() -> int:
    """Pooled sandboxes idle or being made, for reports and tests."""
    return _pool[1].held() if _pool is not None else 0


def _name(sandbox: Sandbox) -> str:
    """A pooled sandbox's name in ``WarmPool.idle``: its host directory (the embedded backend's;
    not the path its files are reached by, which names a descriptor number that a later sandbox
    may reuse)."""
    host_dir = getattr(sandbox, "host_dir", None)
    return str(host_dir) if isinstance(host_dir, Path) else repr(sandbox)
