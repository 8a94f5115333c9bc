"""Load terminal tasks from disk: Harbor / Terminal-Bench 2 (``task.toml``) and Terminal-Bench 1
(``task.yaml``).

Guarantees: a task loads with the defaults of its project (Harbor's agent timeout, unlimited there,
is :data:`DEFAULT_AGENT_TIMEOUT_SEC` here) and resources within what a container engine accepts
(:data:`RESOURCE_BOUNDS`); a key termgym does not define or act on is accepted with a warning in
``Task.warnings``; every problem raises :class:`TaskError`, whose message is one line naming the
offending file. ``[verifier].report_format`` and ``[verifier].assertions`` are termgym's own keys;
a separate grading image (``[verifier.environment]``) is not supported yet.

The layouts, the defaults and every key: docs/guides/tasks.md#task-layout."""

from __future__ import annotations

import os
from pathlib import Path

from termgym.sandboxes.base import Resources
from termgym.tasks.harbor import _load_harbor
from termgym.tasks.model import (
    DEFAULT_AGENT_TIMEOUT_SEC,
    DEFAULT_BUILD_TIMEOUT_SEC,
    DEFAULT_VERIFIER_TIMEOUT_SEC,
    RESOURCE_BOUNDS,
    TB1_DEFAULT_AGENT_TIMEOUT_SEC,
    TB1_DEFAULT_TEST_TIMEOUT_SEC,
    Healthcheck,
    Task,
    TaskError,
    TaskStep,
)
from termgym.tasks.tb1 import _load_tb1, compose_variables, fill_compose

__all__ = [
    "DEFAULT_AGENT_TIMEOUT_SEC",
    "DEFAULT_BUILD_TIMEOUT_SEC",
    "DEFAULT_VERIFIER_TIMEOUT_SEC",
    "RESOURCE_BOUNDS",
    "TB1_DEFAULT_AGENT_TIMEOUT_SEC",
    "TB1_DEFAULT_TEST_TIMEOUT_SEC",
    "Healthcheck",
    "Resources",
    "Task",
    "TaskError",
    "TaskStep",
    "compose_variables",
    "discover_tasks",
    "fill_compose",
    "load_task",
]


def load_task(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Task:
    """Load and validate the task in directory ``path`` (``task.toml`` wins over ``task.yaml``).

    ``name`` is Harbor's ``[task].name`` when set. Otherwise, when ``root`` is given and the task
    lies two or more levels below it (``root/<family>/<task>``, the bundled layout), it is the
    path relative to ``root`` (``"<family>/<task>"``); else the directory name.
    """
    given = Path(path)
    if not given.exists():
        raise TaskError(given, "task directory does not exist")
    if not given.is_dir():
        raise TaskError(given, "not a directory (a task is a directory with task.toml or task.yaml)")
    task_dir = given.resolve()
    fallback_name = task_dir.name
    if root is not None:
        root_dir = Path(root).resolve()
        if task_dir.is_relative_to(root_dir) and len(task_dir.relative_to(root_dir).parts) >= 2:
            fallback_name = task_dir.relative_to(root_dir).as_posix()
    if (task_dir / "task.toml").is_file():
        return _load_harbor(task_dir, fallback_name, os.environ)
    if (task_dir / "task.yaml").is_file():
        return _load_tb1(task_dir, fallback_name, os.environ)
    raise TaskError(task_dir, "not a task directory: no task.toml or task.yaml")


def discover_tasks(root: str | os.PathLike[str]) -> list[Task]:
    """Every task under ``root`` (directories holding task.toml or task.yaml), sorted by name.

    A ``root`` that is itself a task gives ``[that task]``. Hidden directories are skipped and
    nothing below a task directory is searched. Raises :class:`TaskError` for a missing root,
    any invalid task, or two tasks with the same name.
    """
    given = Path(root)
    if not given.is_dir():
        raise TaskError(given, "task root does not exist" if not given.exists() else "task root is not a directory")
    root_dir = given.resolve()
    if _is_task_dir(root_dir):
        return [load_task(root_dir)]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root_dir):
        directory = Path(dirpath)
        if directory != root_dir and _is_task_dir(directory):
            found.append(directory)
            dirnames.clear()
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    tasks: dict[str, Task] = {}
    for directory in found:
        task = load_task(directory, root=root_dir)
        if task.name in tasks:
            raise TaskError(directory, f"duplicate task name {task.name!r} (also {tasks[task.name].path})")
        tasks[task.name] = task
    return [tasks[name] for name in sorted(tasks)]


def _is_task_dir(directory: Path) -> bool:
    return (directory / "task.toml").is_file() or (directory / "task.yaml").is_file()
