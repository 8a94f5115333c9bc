"""The Docker backend: the task's own image, one container per trial, through the engine's API.

What it covers: the task's ``docker_image`` (pulled per ``SandboxSpec.pull``), else its Dockerfile
built once per content hash (``termgym.images.build``), with network only when the task allows it
(never the host's network namespace), FROM aliases for air-gapped builds; the image's own entrypoint
runs with the keeper as its command (its services are up); one container per trial with network
``none`` (unless the task asks for network, which fails clearly when the engine has none), the
task's CPU (at most the engine's, with a warning) and memory limits, a pids limit, a per-file size
limit of the task's storage, the labels DESIGN.md gives, and the engine's tiny init as PID 1 (it
reaps zombies), running the keeper, ``/bin/sleep infinity`` by absolute path. The persistent shell
runs over one attached exec stream; files move as tar archives through the API. Killing the agent's
processes restarts the container (its init is killed, so the kernel ends every process in it, the
keeper included, which a root process could otherwise rewrite through ``/proc/<pid>/mem``), then
waits until the engine lists the new keeper. ``agent_changes`` asks the engine what the container
changed against its image, and ``exec_traced`` runs a command under termgym's own ``strace``, put
into the container (``termgym.sandboxes.docker.tracer``; for the tamper check,
``termgym.episode.guard``). No harness step runs a program by the container's ``PATH``: commands get
their environment through the exec API and their deadline from the host; files go through the
archive API. ``stop`` removes the container on every path, but after ``keep`` (``--keep``), which
renames it ``termgym-kept-<id>`` and leaves it running for ``attach`` to enter again; the removal
runs in the background (``remove_later``), and ``close_shared`` and the interpreter's exit wait for
it. Every container is created from one ``Recipe`` (``termgym.sandboxes.docker.pool``), in one
blocking call (create, start, find the keeper); with ``TERMGYM_DOCKER_POOL`` set, ``start`` takes an
identical, started container from the warm pool when one is ready, and ``close_shared`` closes the
pool.

What it does not cover: a disk quota (overlay2 on ext4 has none; the per-file limit and the agent
timeout bound what one trial can write), the other services of a Terminal-Bench 1 compose file
(reported as unsupported), registry credentials (``docker login`` is the engine's). The agent is
root in the file system the verifier then runs in: what it changed there is not prevented; a load
of it by the verifier is detected (``termgym.episode.guard``).

The engine may be Podman (``DOCKER_HOST`` at ``podman system service``): where its
Docker-compatible API answers otherwise, ``engine.Dialect`` says how (docs/guides/backends.md,
"Podman").

All docker-py calls are blocking; they run in a dedicated thread pool, never on the event loop.

The package: ``engine`` (the client, its thread pool, the fault mapping), ``sandbox``
(``DockerSandbox``), ``stream`` (exec streams), ``transfer`` (archives), ``containers`` (create,
remove, the warm pool), ``pool`` (the warm pool's logic, engine-free), ``leftovers`` (the
registry's hooks: gc, attach, prewarm).
"""

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
