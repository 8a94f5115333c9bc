"""Sandbox backends behind one small contract (``base.Sandbox``), chosen by name from one registry.

Each entry names the backend, the module that implements it, its ``Sandbox`` class and the
package extra its SDK comes from. Modules are imported only when their backend is used, so an SDK
is needed only then. Besides its class, a backend's module offers ``preflight()`` (raise
``BackendUnavailable`` in one line when this machine cannot run it), ``remove_leftovers(images)``
(``termgym gc``: one line saying what was removed) and ``close_shared()`` (close what its sandboxes
share, such as HTTP clients or a warm pool); a backend that keeps sandboxes ready ahead of demand
also offers ``prewarm(specs, count)`` (Docker's warm pool).

Adding a backend is one ``Backend`` line here and a module with those names (CONTRIBUTING.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from termgym.errors import BackendUnavailable, ConfigError
from termgym.sandboxes.base import ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec


@dataclass(frozen=True)
class Backend:
    """One registered backend: ``module`` holds the class ``sandbox`` and the hooks above;
    ``extra`` is the ``pip install -e '.[extra]'`` its SDK needs (None: none beyond the core)."""

    name: str
    module: str
    sandbox: str
    extra: str | None = None


REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("local", "termgym.sandboxes.local", "LocalSandbox"),
        Backend("docker", "termgym.sandboxes.docker", "DockerSandbox"),
        Backend("daytona", "termgym.sandboxes.daytona.backend", "DaytonaSandbox", extra="daytona"),
    )
}
BACKENDS = tuple(REGISTRY)


def backend_module(name: str) -> ModuleType:
    """The module of backend ``name``, imported now if it was not; ``ConfigError`` for a name not
    registered, ``BackendUnavailable`` when its SDK is not installed."""
    backend = REGISTRY.get(name)
    if backend is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    try:
        return importlib.import_module(backend.module)
    except ImportError as exc:
        hint = f" (pip install -e '.[{backend.extra}]')" if backend.extra else ""
        raise BackendUnavailable(f"the {name} backend cannot be loaded{hint}: {exc}") from exc


def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    """A new (not yet started) sandbox of ``backend`` for ``spec``."""
    return getattr(backend_module(backend), REGISTRY[backend].sandbox)(spec)


def preflight(backend: str) -> None:
    """Raise ``BackendUnavailable`` (one line, saying what to do) when ``backend`` cannot work here:
    a missing binary, a daemon that does not answer, missing credentials."""
    backend_module(backend).preflight()


async def attach_sandbox(backend: str, sandbox_id: str) -> Sandbox:
    """A started sandbox of ``backend`` that an earlier ``--keep`` left running (its module's
    ``attach(id)``); ``ConfigError`` in one line when there is no such sandbox."""
    module = backend_module(backend)
    attach = getattr(module, "attach", None)
    if attach is None:
        raise ConfigError(f"the {backend} backend cannot attach to a kept sandbox")
    return await attach(sandbox_id)


async def remove_leftovers(backend: str, *, images: bool = False) -> str:
    """``termgym gc`` on ``backend``: remove what killed runs left; one line saying what went."""
    return await backend_module(backend).remove_leftovers(images)


def keeps_warm_pool(backend: str) -> bool:
    """Whether ``backend`` keeps a warm pool that ``prewarm`` can fill, and it is on."""
    pool_on = getattr(backend_module(backend), "warm_pool_on", None)
    return pool_on is not None and pool_on()


async def prewarm(backend: str, specs: Sequence[SandboxSpec], count: int | None = None) -> int:
    """Make sandboxes for ``specs`` ready ahead of their trials (up to ``count`` each) where
    ``backend`` keeps a warm pool (Docker: ``TERMGYM_DOCKER_POOL``), waiting until they are; how
    many are ready. 0 for a backend without one, or with its pool off."""
    hook = getattr(backend_module(backend), "prewarm", None)
    return await hook(specs, count) if hook is not None else 0


async def close_backends() -> None:
    """Close what loaded backends share across sandboxes (Daytona's HTTP sessions, Docker's warm
    pool and its pending removals)."""
    for backend in REGISTRY.values():
        module = sys.modules.get(backend.module)
        if module is not None:
            await module.close_shared()


__all__ = [
    "BACKENDS",
    "REGISTRY",
    "Backend",
    "ExecResult",
    "ProcessChannel",
    "Resources",
    "Sandbox",
    "SandboxSpec",
    "attach_sandbox",
    "backend_module",
    "close_backends",
    "create_sandbox",
    "keeps_warm_pool",
    "preflight",
    "prewarm",
    "remove_leftovers",
]
