"""Sandbox backends behind one small contract (``base.Sandbox``), chosen by name.

``local`` (the embedded default, bubblewrap) is built in; other backends are imported lazily so
their SDKs are needed only when used.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from termgym.images import load_aliases
from termgym.sandboxes.base import ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec
from termgym.tasks import Task

BACKENDS = ("local", "docker", "daytona")


def sandbox_spec(task: Task, *, run_id: str, image_aliases: Mapping[str, str] | None = None) -> SandboxSpec:
    """The sandbox a task's environment needs, labelled as DESIGN.md says. ``image_aliases``
    defaults to the built-in ones plus the config file's (``termgym.images.load_aliases``)."""
    return SandboxSpec(
        name=task.name,
        context_dir=task.environment_dir,
        dockerfile=task.dockerfile,
        image=task.docker_image,
        resources=task.resources,
        network=task.network,
        env=dict(task.environment_env),
        labels={"termgym": "1", "termgym.run": run_id or "adhoc"},
        build_timeout_sec=task.build_timeout_sec,
        compose_file=task.compose_file,
        image_aliases=dict(image_aliases) if image_aliases is not None else load_aliases(),
    )


def preflight(backend: str) -> None:
    """Raise ``BackendUnavailable`` (one line, saying what to do) when ``backend`` cannot work here:
    a missing binary, a daemon that does not answer, missing credentials."""
    if backend == "local":
        from termgym.sandboxes.local import require_tools

        require_tools()
    elif backend == "docker":
        from termgym.sandboxes.docker import docker_client

        docker_client()
    elif backend == "daytona":
        from termgym.sandboxes.daytona import check_credentials

        check_credentials()


async def close_backends() -> None:
    """Close the clients that backends share across sandboxes (for now, Daytona's), if loaded."""
    if "termgym.sandboxes.daytona" in sys.modules:
        await sys.modules["termgym.sandboxes.daytona"].close_providers()


def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    if backend == "local":
        from termgym.sandboxes.local import LocalSandbox

        return LocalSandbox(spec)
    if backend == "docker":
        from termgym.sandboxes.docker import DockerSandbox

        return DockerSandbox(spec)
    if backend == "daytona":
        from termgym.sandboxes.daytona import DaytonaSandbox

        return DaytonaSandbox(spec)
    raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "close_backends", "preflight", "ExecResult", "ProcessChannel", "Resources", "Sandbox", "SandboxSpec", "create_sandbox", "sandbox_spec"]
