"""The task model: ``Task`` and its parts, the one-line ``TaskError``, the defaults, and the
small readers both loaders share (``termgym.tasks`` documents the formats)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from termgym.errors import ConfigError
from termgym.sandboxes.base import Resources
from termgym.verifiers.report import ReportFormat

DEFAULT_AGENT_TIMEOUT_SEC = 900.0  # Harbor: None (no limit); its task template writes 900
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
TB1_DEFAULT_AGENT_TIMEOUT_SEC = 360.0
TB1_DEFAULT_TEST_TIMEOUT_SEC = 60.0
TB1_TEST_DIR = "/tests"

# What every container engine accepts (Docker: at least 0.01 CPU and 6 MB of memory); beyond the
# upper bounds no machine exists, and the engines' integer fields overflow.
RESOURCE_BOUNDS: dict[str, tuple[float, float]] = {
    "cpus": (0.01, 4096.0),
    "memory_mb": (6, 16 * 1024 * 1024),
    "storage_mb": (1, 1024 * 1024 * 1024),
}


class TaskError(ConfigError):
    """A task directory that cannot be loaded.

    ``str(error)`` is one line, ``"<offending file or directory>: <problem>"``; ``path`` and
    ``problem`` hold the parts.
    """

    kind = "invalid_task"

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = Path(path)
        self.problem = " ".join(problem.split())
        super().__init__(f"{self.path}: {self.problem}")


@dataclass(frozen=True)
class Healthcheck:
    """Harbor's ``[environment].healthcheck`` (Docker's HEALTHCHECK semantics): ``command`` is run
    in the sandbox, each try at most ``timeout_sec``, until one exits 0, before the agent gets the
    environment. During the first ``start_period_sec`` failures do not count and tries are
    ``start_interval_sec`` apart; after it, tries are ``interval_sec`` apart and ``retries``
    consecutive failures fail the environment (Harbor fails at the first failure when 0)."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    retries: int = 3
    start_interval_sec: float = 5.0  # the wait between failed tries during the start period


@dataclass(frozen=True)
class TaskStep:
    """One entry of a multi-step task's ``[[steps]]``, run in order in the same sandbox.

    ``instruction`` is ``steps/<name>/instruction.md``. ``tests_dir`` holds the step's test
    script: ``steps/<name>/tests`` when it has ``test.sh``, else the task's ``tests`` (what goes to
    ``/tests`` is :meth:`Task.step_test_files`). ``solution_dir`` is ``steps/<name>/solution`` when
    it exists, else the task's (``solution_script`` None when it has no ``solve.sh``). The timeouts
    are ``[steps.agent]`` / ``[steps.verifier]``'s ``timeout_sec``, else the task's."""

    name: str
    instruction: str
    tests_dir: Path
    test_script: str
    solution_dir: Path | None
    solution_script: str | None
    agent_timeout_sec: float
    verifier_timeout_sec: float


@dataclass(frozen=True)
class Task:
    """A validated task. Paths are resolved; mappings are read-only.

    Guaranteed by :func:`load_task`: ``instruction`` is not blank; the test script exists
    (``tests_dir`` itself may be missing for TB1; ``environment_dir`` may be missing for a
    Harbor task that only names a ``docker_image``);
    ``dockerfile`` exists unless ``docker_image`` is set (then it may be None); the timeouts
    are finite and positive; ``solution_script``, when set, exists under the solution. A
    multi-step task (``steps`` not empty) has every step's instruction and test script; its own
    ``instruction``, ``tests_dir``, ``test_script``, ``solution_dir`` and ``solution_script`` are
    its first step's. ``warnings`` names each key accepted but not acted on, one line each.
    """

    name: str
    family: str
    path: Path
    layout: Literal["harbor", "tb1"]
    instruction: str
    environment_dir: Path
    dockerfile: Path | None
    docker_image: str | None
    compose_file: Path | None
    solution_dir: Path | None
    solution_script: str | None
    tests_dir: Path
    test_script: str
    agent_timeout_sec: float
    verifier_timeout_sec: float
    build_timeout_sec: float
    resources: Resources
    network: bool
    verifier_env: Mapping[str, str]
    environment_env: Mapping[str, str]
    workdir: str | None
    metadata: Mapping[str, object]
    report_format: ReportFormat | None = None  # [verifier].report_format: grade that source alone
    expected_assertions: int | None = None  # [verifier].assertions, or what an audit counted
    # [verifier].allow_system_changes: the agent's work is to change system paths (install a package),
    # so changes there are recorded but neither warned about nor failed (termgym.episode.tamper)
    allow_system_changes: bool = False
    # [verifier].agent_paths: absolute paths outside the work directory where the verifier runs the
    # agent's work on purpose (a tool it installs, a module it writes); loads there are not tampering
    agent_paths: tuple[str, ...] = ()
    verifier_mode: Literal["shared", "separate"] = "shared"  # [verifier].environment_mode
    artifacts: tuple[str, ...] = ()  # absolute paths: copied out after the episode (and into a separate verifier)
    agent_user: str | None = None  # [agent].user: who the agent's shell runs as (None: the image's user)
    verifier_user: str | None = None  # [verifier].user: who the test script runs as
    agent_network: bool | None = None  # [agent].network_mode / allow_internet (None: the environment's)
    verifier_network: bool | None = None  # [verifier].network_mode / allow_internet (None: the environment's)
    healthcheck: Healthcheck | None = None  # [environment].healthcheck
    steps: tuple[TaskStep, ...] = ()  # [[steps]]: a multi-step task
    multi_step_reward_strategy: Literal["mean", "final"] = "mean"
    warnings: tuple[str, ...] = ()  # keys accepted but not acted on (unknown, unsupported), one line each

    def solution_files(self) -> list[tuple[Path, str]]:
        """``(host file, path relative to /solution)`` for each file to upload, sorted.

        Harbor: every file under ``solution/``; TB1: ``solution.sh`` alone; [] without a solution.
        """
        if self.layout == "tb1":
            script = self.path / "solution.sh"
            return [(script, "solution.sh")] if self.solution_script and script.is_file() else []
        return _files_under(self.solution_dir) if self.solution_dir is not None else []

    def step_test_files(self, step: TaskStep) -> list[tuple[Path, str]]:
        """``(host file, path relative to /tests)`` for a step, sorted: the task's ``tests/`` with
        ``steps/<name>/tests/`` over it (a step file wins), as Harbor uploads them."""
        return replace(self, tests_dir=step.tests_dir).test_files()

    def step_solution_files(self, step: TaskStep) -> list[tuple[Path, str]]:
        """``(host file, path relative to /solution)`` for a step's solution, sorted; [] without one."""
        return _files_under(step.solution_dir) if step.solution_dir is not None else []

    def test_files(self) -> list[tuple[Path, str]]:
        """``(host file, path relative to /tests)`` for every file under ``tests/``, sorted by
        the second item; for TB1 also ``run-tests.sh`` (which wins over a ``tests/run-tests.sh``).
        A step's view of a Harbor task (``tests_dir`` under ``steps/<name>/``) is the task's
        ``tests/`` with the step's files over it, as Harbor uploads them."""
        shared = self.path / "tests"
        if self.layout == "harbor" and self.tests_dir != shared:
            merged = {relative: file for file, relative in [*_files_under(shared), *_files_under(self.tests_dir)]}
            return [(merged[relative], relative) for relative in sorted(merged)]
        files = _files_under(self.tests_dir)
        if self.layout == "tb1":
            files = [item for item in files if item[1] != "run-tests.sh"]
            files.append((self.path / "run-tests.sh", "run-tests.sh"))
            files.sort(key=lambda item: item[1])
        return files


def _files_under(directory: Path) -> list[tuple[Path, str]]:
    if not directory.is_dir():
        return []
    files = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for filename in filenames:
            file = Path(dirpath, filename)
            if file.is_file():
                files.append((file, file.relative_to(directory).as_posix()))
    return sorted(files, key=lambda item: item[1])


def _timeout(table: Mapping[str, object], key: str, label: str, default: float, config: Path) -> float:
    value = table.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TaskError(config, f"{label} must be a positive number, got {value!r}")
    return float(value)


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(file, f"cannot read: {exc}") from None


def _read_instruction(file: Path) -> str:
    if not file.is_file():
        raise TaskError(file, "missing instruction file")
    text = _read_text(file)
    if not text.strip():
        raise TaskError(file, "instruction is empty")
    return text


def _family(category: object, task_dir: Path) -> str:
    return category.strip() if isinstance(category, str) and category.strip() else task_dir.parent.name
