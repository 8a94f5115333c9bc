"""The Docker backend: the task's own image, one container per trial, through the engine's API.

Guarantees: the image is the task's ``docker_image`` (pulled per ``SandboxSpec.pull``) or its
Dockerfile built once per content hash (``termgym.images.build``); the image's entrypoint runs with
the keeper as its command. Each container is created from one ``Recipe``
(``termgym.sandboxes.docker.pool``), with network ``none`` unless the task asks for it (never the
host's network namespace), the task's limits and the labels DESIGN.md gives. No harness step runs
a program by the container's ``PATH``. ``stop`` removes the container on every path but after
``keep``; ``close_shared`` and the interpreter's exit wait for the removals. All docker-py calls
are blocking and run in a dedicated thread pool, never on the event loop. The engine may be Podman
(``engine.Dialect`` says where its API answers otherwise).

Not covered: a disk quota, the other services of a Terminal-Bench 1 compose file, registry
credentials (``docker login`` is the engine's). What it covers and how, and the package's
modules: docs/guides/backends.md#inside-a-docker-sandbox."""

from __future__ import annotations

from termgym.sandboxes.docker.containers import (
    KEPT_PREFIX,
    create_started,
    remove_later,
    remove_orphans,
    wait_for_removals,
    warm_pool,
    warm_pool_on,
)
from termgym.sandboxes.docker.engine import docker_client, engine_errors
from termgym.sandboxes.docker.leftovers import HOOKS, attach, close_shared, prewarm, remove_leftovers
from termgym.sandboxes.docker.sandbox import DockerSandbox
from termgym.sandboxes.docker.stream import FrameDemux

__all__ = [
    "HOOKS",
    "KEPT_PREFIX",
    "DockerSandbox",
    "FrameDemux",
    "attach",
    "close_shared",
    "create_started",
    "docker_client",
    "engine_errors",
    "prewarm",
    "remove_later",
    "remove_leftovers",
    "remove_orphans",
    "wait_for_removals",
    "warm_pool",
    "warm_pool_on",
]
