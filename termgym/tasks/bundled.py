"""The tasks that ship with termgym (``envs/`` in the source tree, ``termgym.envs`` when installed)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from termgym.tasks import Task, load_task


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


def resolve_task(name_or_path: str) -> Task:
    """A task directory path, or the name of a bundled task (``file-ops/organize-by-ext``);
    ``TaskError`` (a ``ConfigError``) when neither names a loadable task."""
    path = Path(name_or_path)
    if not path.exists():
        bundled = bundled_task_path(name_or_path)
        if bundled is not None:
            path = bundled
    return load_task(path)
