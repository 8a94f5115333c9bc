"""Sandbox backends behind one small contract (``base.Sandbox``), chosen by name.

``local`` (the embedded default, bubblewrap) is built in; other backends are imported lazily so
their SDKs are needed only when used.
"""

from __future__ import annotations

from termgym.sandboxes.base import ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec
from termgym.tasks import Task

BACKENDS = ("local",)


def sandbox_spec(task: Task, *, run_id: str) -> SandboxSpec:
    """The sandbox a task's environment needs, labelled as DESIGN.md says."""
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
    )


def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    if backend == "local":
        from termgym.sandboxes.local import LocalSandbox

        return LocalSandbox(spec)
    raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "ExecResult", "ProcessChannel", "Resources", "Sandbox", "SandboxSpec", "create_sandbox", "sandbox_spec"]
