"""The tasks that ship with termgym (``envs/`` in the source tree, ``termgym.envs`` when installed)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from termgym.errors import did_you_mean
from termgym.tasks import Task, TaskError, load_task


def bundled_root() -> Path:
    return Path(str(resources.files("termgym.envs")))


def bundled_task_path(name: str) -> Path | None:
    """``file-ops/organize-by-ext`` (or ``termgym/file-ops/organize-by-ext``) to its directory."""
    relative = name.removeprefix("termgym/").strip("/")
    if not relative or ".." in relative.split("/"):
        return None
    candidate = bundled_root() / relative
    return candidate if (candidate / "task.toml").is_file() else None


def bundled_task_paths() -> list[Path]:
    return sorted(p.parent for p in bundled_root().glob("*/*/task.toml"))


def bundled_task_names() -> list[str]:
    """The bundled tasks' names (``family/task``), sorted."""
    root = bundled_root()
    return [path.relative_to(root).as_posix() for path in bundled_task_paths()]


def resolve_task(name_or_path: str) -> Task:
    """A task directory path, or the name of a bundled task (``file-ops/organize-by-ext``);
    ``TaskError`` (a ``ConfigError``) when neither names a loadable task, naming the closest
    bundled tasks when some are close (``did_you_mean``)."""
    path = Path(name_or_path)
    if not path.exists():
        bundled = bundled_task_path(name_or_path)
        if bundled is None:
            raise unknown_task(name_or_path)
        path = bundled
    return load_task(path)


def is_task_name(name_or_path: str) -> bool:
    """Whether ``name_or_path`` is an existing path or a bundled task's name (nothing loaded)."""
    return Path(name_or_path).exists() or bundled_task_path(name_or_path) is not None


def unknown_task(name: str) -> TaskError:
    """The error for ``name``, neither a path nor a bundled task: the closest bundled names."""
    hint = did_you_mean(name.removeprefix("termgym/").strip("/"), bundled_task_names())
    problem = "task directory does not exist, nor is it a bundled task (termgym list names them)"
    return TaskError(Path(name), f"{problem}; {hint}" if hint else problem)
