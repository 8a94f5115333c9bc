"""The tasks that ship with termgym (``envs/`` in the source tree, ``termgym.envs`` when installed)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


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
