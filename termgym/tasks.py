"""Load terminal tasks from disk: Harbor / Terminal-Bench 2 (``task.toml``) and Terminal-Bench 1 (``task.yaml``).

Harbor layout::

    task.toml  instruction.md  environment/Dockerfile  [environment/docker-compose.yaml]
    [solution/solve.sh ...]  tests/test.sh [...]

The Dockerfile may be missing when ``[environment].docker_image`` names a prebuilt image.

Terminal-Bench 1 layout::

    task.yaml  Dockerfile  docker-compose.yaml  run-tests.sh  [solution.sh | solution.yaml]  [tests/...]

``tests/`` is optional for TB1: ``tests_dir`` then points at a directory that does not exist and
:meth:`Task.test_files` returns only ``run-tests.sh``. A ``solution.yaml`` (TB1 keystroke list)
is not a script: ``solution_script`` is None and ``metadata["solution_yaml"]`` names the file.

Defaults: Harbor's ``[agent].timeout_sec`` defaults to None (no limit); termgym uses
:data:`DEFAULT_AGENT_TIMEOUT_SEC` (900 s) instead. Resources default to the pre-2026 Harbor
values 1 CPU / 2048 MB / 10240 MB, and must lie within what a container engine accepts
(:data:`RESOURCE_BOUNDS`). TB1 timeouts default to 360 s (agent) and 60 s (tests).

Verification keys besides Harbor's: ``[verifier].report_format`` (one of the report formats: the
verifier is graded from that source alone) and ``[verifier].assertions`` (how many assertions the
verifier defines: a report claiming more is an error). Harbor's ``[verifier].environment_mode =
"separate"`` grades in a fresh sandbox of the task's environment, into which the top-level
``artifacts`` paths (and ``/logs/artifacts``) are copied from the agent's; a separate grading
image (``[verifier.environment]``) is not supported yet.

Every problem raises :class:`TaskError`, whose message is one line naming the offending file.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal, cast, get_args

import yaml

from termgym.errors import ConfigError
from termgym.sandboxes.base import Resources
from termgym.verifiers.report import ReportFormat

__all__ = [
    "DEFAULT_AGENT_TIMEOUT_SEC",
    "DEFAULT_BUILD_TIMEOUT_SEC",
    "DEFAULT_VERIFIER_TIMEOUT_SEC",
    "Healthcheck",
    "RESOURCE_BOUNDS",
    "TB1_DEFAULT_AGENT_TIMEOUT_SEC",
    "TB1_DEFAULT_TEST_TIMEOUT_SEC",
    "Resources",
    "Task",
    "TaskError",
    "TaskStep",
    "discover_tasks",
    "load_task",
]

DEFAULT_AGENT_TIMEOUT_SEC = 900.0  # Harbor: None (no limit); its task template writes 900
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
TB1_DEFAULT_AGENT_TIMEOUT_SEC = 360.0
TB1_DEFAULT_TEST_TIMEOUT_SEC = 60.0

# What every container engine accepts (Docker: at least 0.01 CPU and 6 MB of memory); beyond the
# upper bounds no machine exists, and the engines' integer fields overflow.
RESOURCE_BOUNDS = {"cpus": (0.01, 4096.0), "memory_mb": (6, 16 * 1024 * 1024), "storage_mb": (1, 1024 * 1024 * 1024)}
_NETWORK_MODES = {"public": True, "allowlist": True, "no-network": False}
_VERIFIER_MODES = ("shared", "separate")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(?:I?B)?", re.IGNORECASE)
_SIZE_FACTOR_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_HOST_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


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
    """Harbor's ``[environment].healthcheck``: ``command`` (run by ``sh -c`` in the sandbox) must
    exit 0 before the agent gets the environment; tried every ``interval_sec``, each try at most
    ``timeout_sec``; failures during ``start_period_sec`` do not count against ``retries``."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    retries: int = 3


@dataclass(frozen=True)
class TaskStep:
    """One entry of a multi-step task's ``[[steps]]``: its own instruction, tests and solution
    (``steps/<name>/``), run in order in the same sandbox."""

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
    are finite and positive; ``solution_script``, when set, exists under the solution.
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
    verifier_mode: Literal["shared", "separate"] = "shared"  # [verifier].environment_mode
    artifacts: tuple[str, ...] = ()  # absolute paths: copied out after the episode (and into a separate verifier)
    agent_user: str | None = None  # [agent].user: who the agent's shell runs as (None: the image's user)
    verifier_user: str | None = None  # [verifier].user: who the test script runs as
    agent_network: bool | None = None  # [agent].network_mode / allow_internet (None: the environment's)
    verifier_network: bool | None = None  # [verifier].network_mode / allow_internet (None: the environment's)
    healthcheck: Healthcheck | None = None  # [environment].healthcheck
    steps: tuple[TaskStep, ...] = ()  # [[steps]]: a multi-step task
    multi_step_reward_strategy: Literal["mean", "final"] = "mean"
    warnings: tuple[str, ...] = ()  # what loading noticed and accepted (unknown keys), one line each

    def solution_files(self) -> list[tuple[Path, str]]:
        """``(host file, path relative to /solution)`` for each file to upload, sorted.

        Harbor: every file under ``solution/``; TB1: ``solution.sh`` alone; [] without a solution.
        """
        if self.layout == "tb1":
            script = self.path / "solution.sh"
            return [(script, "solution.sh")] if self.solution_script and script.is_file() else []
        return _files_under(self.solution_dir) if self.solution_dir is not None else []

    def test_files(self) -> list[tuple[Path, str]]:
        """``(host file, path relative to /tests)`` for every file under ``tests/``, sorted by
        the second item; for TB1 also ``run-tests.sh`` (which wins over a ``tests/run-tests.sh``)."""
        files = _files_under(self.tests_dir)
        if self.layout == "tb1":
            files = [item for item in files if item[1] != "run-tests.sh"]
            files.append((self.path / "run-tests.sh", "run-tests.sh"))
            files.sort(key=lambda item: item[1])
        return files


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
        return _load_tb1(task_dir, fallback_name)
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


# --- Harbor / Terminal-Bench 2 -----------------------------------------------------------------


def _load_harbor(task_dir: Path, fallback_name: str, environ: Mapping[str, str]) -> Task:
    config = task_dir / "task.toml"
    try:
        data = tomllib.loads(_read_text(config))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(config, f"invalid TOML: {exc}") from None
    for key in ("schema_version", "version"):
        if key in data and not isinstance(data[key], str):
            raise TaskError(config, f"{key} must be a string, got {data[key]!r}")
    task_table = _table(data, "task", config)
    metadata = _table(data, "metadata", config)
    agent = _table(data, "agent", config)
    verifier = _table(data, "verifier", config)
    environment = _table(data, "environment", config)

    name = _optional_str(task_table, "task", "name", config) or fallback_name
    docker_image = _optional_str(environment, "environment", "docker_image", config)
    workdir = _optional_str(environment, "environment", "workdir", config)
    if workdir is not None and not workdir.startswith("/"):
        raise TaskError(config, f"[environment].workdir must be an absolute path, got {workdir!r}")

    instruction = _read_instruction(task_dir / "instruction.md")
    tests_dir = task_dir / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise TaskError(tests_dir / "test.sh", "missing test script (Harbor tasks need tests/test.sh)")
    environment_dir = task_dir / "environment"
    dockerfile: Path | None = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        if docker_image is None:
            raise TaskError(dockerfile, "missing Dockerfile (and task.toml sets no [environment].docker_image)")
        dockerfile = None
    compose = environment_dir / "docker-compose.yaml"
    solution_dir = task_dir / "solution"
    if "environment" in verifier:
        raise TaskError(
            config,
            "[verifier.environment] (a separate grading image) is not supported yet; "
            'environment_mode = "separate" grades in a fresh sandbox of the task\'s own environment',
        )
    mode = verifier.get("environment_mode", "shared")
    if mode not in _VERIFIER_MODES:
        raise TaskError(config, f"[verifier].environment_mode must be one of {list(_VERIFIER_MODES)}, got {mode!r}")
    return Task(
        name=name,
        family=_family(metadata.get("category"), task_dir),
        path=task_dir,
        layout="harbor",
        instruction=instruction,
        environment_dir=environment_dir,
        dockerfile=dockerfile,
        docker_image=docker_image,
        compose_file=compose if compose.is_file() else None,
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        solution_script="solve.sh" if (solution_dir / "solve.sh").is_file() else None,
        tests_dir=tests_dir,
        test_script="test.sh",
        agent_timeout_sec=_timeout(agent, "timeout_sec", "[agent].timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC, config),
        verifier_timeout_sec=_timeout(
            verifier, "timeout_sec", "[verifier].timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC, config
        ),
        build_timeout_sec=_timeout(
            environment, "build_timeout_sec", "[environment].build_timeout_sec", DEFAULT_BUILD_TIMEOUT_SEC, config
        ),
        resources=_resources(environment, config),
        network=_network(environment, config),
        verifier_env=_env(verifier, "verifier", config, environ),
        environment_env=_env(environment, "environment", config, environ),
        workdir=workdir,
        metadata=MappingProxyType(dict(metadata)),
        report_format=_report_format(verifier, config),
        expected_assertions=_assertion_count(verifier, config),
        verifier_mode=mode,
        artifacts=_artifacts(data.get("artifacts", []), config),
    )


def _report_format(verifier: Mapping[str, object], config: Path) -> ReportFormat | None:
    value = verifier.get("report_format")
    formats = get_args(ReportFormat)
    if value is not None and value not in formats:
        raise TaskError(config, f"[verifier].report_format must be one of {list(formats)}, got {value!r}")
    return cast(ReportFormat | None, value)


def _assertion_count(verifier: Mapping[str, object], config: Path) -> int | None:
    value = verifier.get("assertions")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise TaskError(config, f"[verifier].assertions must be a positive integer, got {value!r}")
    return value


def _artifacts(value: object, config: Path) -> tuple[str, ...]:
    """Harbor's top-level ``artifacts``: paths, or tables with a ``source`` path; each absolute,
    without ``..``."""
    if not isinstance(value, list):
        raise TaskError(config, f"artifacts must be a list of paths, got {value!r}")
    paths = []
    for item in value:
        source = item.get("source") if isinstance(item, dict) else item
        if (
            not isinstance(source, str)
            or not source.startswith("/")
            or ".." in source.split("/")
            or source.strip("/") == ""
        ):
            raise TaskError(
                config, f"each artifact must be an absolute path (or a table with one as source), got {item!r}"
            )
        paths.append("/" + source.strip("/"))
    return tuple(paths)


def _table(data: Mapping[str, object], key: str, config: Path) -> dict[str, object]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise TaskError(config, f"[{key}] must be a table, got {value!r}")
    return value


def _optional_str(table: Mapping[str, object], section: str, key: str, config: Path) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TaskError(config, f"[{section}].{key} must be a non-empty string, got {value!r}")
    return value


def _timeout(table: Mapping[str, object], key: str, label: str, default: float, config: Path) -> float:
    value = table.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TaskError(config, f"{label} must be a positive number, got {value!r}")
    return float(value)


def _resources(environment: Mapping[str, object], config: Path) -> Resources:
    resources = _resource_values(environment, config)
    for key, (low, high) in RESOURCE_BOUNDS.items():
        value = getattr(resources, key)
        if not low <= value <= high:
            raise TaskError(
                config,
                f"[environment].{key} = {value:g} is outside what a container engine accepts ({low:g} to {high:g})",
            )
    return resources


def _resource_values(environment: Mapping[str, object], config: Path) -> Resources:
    cpus = _timeout(environment, "cpus", "[environment].cpus", 1.0, config)
    sizes = {}
    for key, legacy, default in (("memory_mb", "memory", 2048), ("storage_mb", "storage", 10240)):
        value = environment.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise TaskError(config, f"[environment].{key} must be a positive integer, got {value!r}")
        if legacy in environment:
            legacy_mb = _size_mb(environment[legacy], f"[environment].{legacy}", config)
            if value is not None and value != legacy_mb:
                raise TaskError(
                    config,
                    f"[environment].{legacy} = {environment[legacy]!r} ({legacy_mb} MB) conflicts with "
                    f"[environment].{key} = {value}",
                )
            value = legacy_mb
        sizes[key] = default if value is None else value
    return Resources(cpus=cpus, memory_mb=sizes["memory_mb"], storage_mb=sizes["storage_mb"])


def _size_mb(value: object, label: str, config: Path) -> int:
    """``"2G"`` -> 2048; units K, M, G, T (binary), an optional ``B``/``iB`` suffix."""
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    megabytes = int(float(match.group(1)) * _SIZE_FACTOR_MB[match.group(2).upper()]) if match else 0
    if megabytes < 1:
        raise TaskError(config, f"{label} must be a size like '2G' or '512M' (at least 1M), got {value!r}")
    return megabytes


def _network(environment: Mapping[str, object], config: Path) -> bool:
    if "network_mode" in environment:
        mode = environment["network_mode"]
        if not isinstance(mode, str) or mode not in _NETWORK_MODES:
            raise TaskError(config, f"[environment].network_mode must be one of {sorted(_NETWORK_MODES)}, got {mode!r}")
        return _NETWORK_MODES[mode]
    allow = environment.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise TaskError(config, f"[environment].allow_internet must be true or false, got {allow!r}")
    return allow


def _env(table: Mapping[str, object], section: str, config: Path, environ: Mapping[str, str]) -> Mapping[str, str]:
    """``[section].env`` with whole-value ``${VAR}`` / ``${VAR:-default}`` taken from ``environ``
    (as Harbor does: a set variable wins even when empty; unset without default is an error)."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise TaskError(config, f"[{section}].env must be a table of strings, got {value!r}")
    resolved = {}
    for key, item in value.items():
        if not isinstance(item, str):
            raise TaskError(config, f"[{section}].env.{key} must be a string, got {item!r}")
        match = _HOST_TEMPLATE.fullmatch(item)
        if match is not None:
            variable, default = match.group(1), match.group(2)
            if variable in environ:
                item = environ[variable]
            elif default is not None:
                item = default
            else:
                problem = f"host variable {variable} is not set and has no default"
                raise TaskError(config, f"[{section}].env.{key}: {problem}")
        resolved[key] = item
    return MappingProxyType(resolved)


# --- Terminal-Bench 1 --------------------------------------------------------------------------


def _load_tb1(task_dir: Path, fallback_name: str) -> Task:
    config = task_dir / "task.yaml"
    try:
        data = yaml.safe_load(_read_text(config))
    except yaml.YAMLError as exc:
        raise TaskError(config, f"invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(config, f"top level must be a mapping, got {type(data).__name__}")
    if "instruction" not in data:
        raise TaskError(config, "missing 'instruction'")
    instruction = data["instruction"]
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(config, f"'instruction' must be a non-empty string, got {instruction!r}")
    agent_timeout = _timeout(
        data, "max_agent_timeout_sec", "max_agent_timeout_sec", TB1_DEFAULT_AGENT_TIMEOUT_SEC, config
    )
    test_timeout = _timeout(data, "max_test_timeout_sec", "max_test_timeout_sec", TB1_DEFAULT_TEST_TIMEOUT_SEC, config)
    for required, why in (
        ("run-tests.sh", "missing test script (Terminal-Bench 1 tasks need run-tests.sh)"),
        ("docker-compose.yaml", "missing docker-compose.yaml (required by Terminal-Bench 1 tasks)"),
        ("Dockerfile", "missing Dockerfile"),
    ):
        if not (task_dir / required).is_file():
            raise TaskError(task_dir / required, why)
    metadata = {key: value for key, value in data.items() if key not in _TB1_CONSUMED}
    solution_script = None
    if (task_dir / "solution.sh").is_file():
        solution_script = "solution.sh"
    elif (task_dir / "solution.yaml").is_file():
        metadata["solution_yaml"] = "solution.yaml"
    return Task(
        name=fallback_name,
        family=_family(data.get("category"), task_dir),
        path=task_dir,
        layout="tb1",
        instruction=instruction,
        environment_dir=task_dir,
        dockerfile=task_dir / "Dockerfile",
        docker_image=None,
        compose_file=task_dir / "docker-compose.yaml",
        solution_dir=None,
        solution_script=solution_script,
        tests_dir=task_dir / "tests",
        test_script="run-tests.sh",
        agent_timeout_sec=agent_timeout,
        verifier_timeout_sec=test_timeout,
        build_timeout_sec=DEFAULT_BUILD_TIMEOUT_SEC,
        resources=Resources(),
        network=True,
        verifier_env=MappingProxyType({}),
        environment_env=MappingProxyType({"TEST_DIR": "/tests"}),
        workdir=None,
        metadata=MappingProxyType(metadata),
    )


_TB1_CONSUMED = frozenset({"instruction", "max_agent_timeout_sec", "max_test_timeout_sec"})


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
