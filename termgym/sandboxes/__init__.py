"""Sandbox backends behind one small contract (``base.Sandbox``), chosen by name from one registry.

Each entry names the backend, the module that implements it, its ``Sandbox`` class and the
package extra its SDK comes from. Modules are imported only when their backend is used, so an SDK
is needed only then. Besides its class, a backend's module may offer ``HOOKS``, a
``base.BackendHooks`` whose every entry is optional: ``preflight`` (raise ``BackendUnavailable``
in one line when this machine cannot run it), ``remove_leftovers`` (``termgym gc``),
``close_shared`` (close what its sandboxes share, such as HTTP clients or a warm pool), ``attach``
(enter a sandbox ``--keep`` left running), ``prewarm`` and ``warm_pool_on`` (a warm pool). What a
backend does not offer is a no-op here, or one line saying the backend cannot.

A Ray cluster (``--cluster``) is the ``ray`` entry: a layer over the embedded or Docker backend that
runs their sandboxes on the cluster's nodes, chosen by ``create_sandbox(backend, spec, cluster=...)``
rather than by name, and closed at a run's end like every other backend (its ``HOOKS``).

Adding a backend is one ``Backend`` line here and a module with a ``Sandbox`` class (CONTRIBUTING.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from termgym.errors import BackendUnavailable, ConfigError, UnknownName
from termgym.sandboxes.base import BackendHooks, ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec


@dataclass(frozen=True)
class Backend:
    """One registered backend: ``module`` holds the class ``sandbox`` and the hooks above;
    ``extra`` is the ``pip install -e '.[extra]'`` its SDK needs (None: none beyond the core);
    ``layer``: it runs another backend's sandboxes elsewhere (Ray), so it is not a ``--backend``."""

    name: str
    module: str
    sandbox: str
    extra: str | None = None
    layer: bool = False


REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("local", "termgym.sandboxes.local", "LocalSandbox"),
        Backend("docker", "termgym.sandboxes.docker", "DockerSandbox"),
        Backend("daytona", "termgym.sandboxes.daytona.backend", "DaytonaSandbox", extra="daytona"),
        Backend("ray", "termgym.sandboxes.ray.cluster", "ClusterSandbox", extra="ray", layer=True),
    )
}
BACKENDS = tuple(name for name, backend in REGISTRY.items() if not backend.layer)


def backend_module(name: str) -> ModuleType:
    """The module of backend ``name``, imported now if it was not; ``ConfigError`` for a name not
    registered, ``BackendUnavailable`` when its SDK is not installed."""
    backend = REGISTRY.get(name)
    if backend is None:
        raise UnknownName("unknown backend", name, BACKENDS)
    try:
        return importlib.import_module(backend.module)
    except ImportError as exc:
        hint = f" (pip install -e '.[{backend.extra}]')" if backend.extra else ""
        raise BackendUnavailable(f"the {name} backend cannot be loaded{hint}: {exc}") from exc


def create_sandbox(backend: str, spec: SandboxSpec, *, cluster: str | None = None) -> Sandbox:
    """A new (not yet started) sandbox of ``backend`` for ``spec``; with ``cluster`` (a Ray cluster's
    address, ``--cluster``), one of ``backend`` on a node of that cluster (the ``ray`` layer)."""
    if cluster is not None:
        return getattr(backend_module("ray"), REGISTRY["ray"].sandbox)(spec, backend=backend, address=cluster)
    return getattr(backend_module(backend), REGISTRY[backend].sandbox)(spec)


def hooks(backend: str) -> BackendHooks:
    """The ``HOOKS`` of ``backend``'s module; every entry None for a module that defines none."""
    found = getattr(backend_module(backend), "HOOKS", None)
    return found if isinstance(found, BackendHooks) else BackendHooks()


def preflight(backend: str) -> None:
    """Raise ``BackendUnavailable`` (one line, saying what to do) when ``backend`` cannot work here:
    a missing binary, a daemon that does not answer, missing credentials. A backend with no
    ``preflight`` hook is taken to work."""
    check = hooks(backend).preflight
    if check is not None:
        check()


async def attach_sandbox(backend: str, sandbox_id: str) -> Sandbox:
    """A started sandbox of ``backend`` that an earlier ``--keep`` left running (its ``attach``
    hook); ``ConfigError`` in one line when there is no such sandbox, or the backend cannot."""
    attach = hooks(backend).attach
    if attach is None:
        raise ConfigError(f"the {backend} backend cannot attach to a kept sandbox")
    return await attach(sandbox_id)


async def remove_leftovers(backend: str, *, images: bool = False) -> str:
    """``termgym gc`` on ``backend``: remove what killed runs left; one line saying what went."""
    remove = hooks(backend).remove_leftovers
    if remove is None:
        return f"the {backend} backend leaves nothing to collect"
    return await remove(images)


def keeps_warm_pool(backend: str) -> bool:
    """Whether ``backend`` keeps a warm pool that ``prewarm`` can fill, and it is on."""
    pool_on = hooks(backend).warm_pool_on
    return pool_on is not None and pool_on()


async def prewarm(backend: str, specs: Sequence[SandboxSpec], count: int | None = None) -> int:
    """Make sandboxes for ``specs`` ready ahead of their trials (up to ``count`` each) where
    ``backend`` keeps a warm pool (Docker: ``TERMGYM_DOCKER_POOL``), waiting until they are; how
    many are ready. 0 for a backend without one, or with its pool off."""
    fill = hooks(backend).prewarm
    return await fill(specs, count) if fill is not None else 0


async def close_backends() -> None:
    """Close what loaded backends share across sandboxes (Daytona's HTTP sessions, Docker's warm
    pool and its pending removals, the Ray cluster's connection)."""
    for name, backend in REGISTRY.items():
        if backend.module in sys.modules:
            close = hooks(name).close_shared
            if close is not None:
                await close()


__all__ = [
    "BACKENDS",
    "REGISTRY",
    "Backend",
    "BackendHooks",
    "ExecResult",
    "ProcessChannel",
    "Resources",
    "Sandbox",
    "SandboxSpec",
    "attach_sandbox",
    "backend_module",
    "close_backends",
    "create_sandbox",
    "hooks",
    "keeps_warm_pool",
    "preflight",
    "prewarm",
    "remove_leftovers",
]
