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

Harbor's other keys (healthcheck, users, per-phase network, ``[[steps]]``,
``multi_step_reward_strategy``) are read as ``harbor`` 0.13's ``TaskConfig`` defines them; a key it
does not define, or one termgym does not act on, is accepted with a warning in ``Task.warnings``
(docs/guides/tasks.md lists them). A TB1 ``docker-compose.yaml`` is read with the ``T_BENCH_*``
variables of TB1's harness filled in (:func:`compose_variables`, :func:`fill_compose`).

Every problem raises :class:`TaskError`, whose message is one line naming the offending file.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
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
    "compose_variables",
    "discover_tasks",
    "fill_compose",
    "load_task",
]

DEFAULT_AGENT_TIMEOUT_SEC = 900.0  # Harbor: None (no limit); its task template writes 900
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
TB1_DEFAULT_AGENT_TIMEOUT_SEC = 360.0
TB1_DEFAULT_TEST_TIMEOUT_SEC = 60.0
TB1_TEST_DIR = "/tests"

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
    warnings: list[str] = []
    for key in ("schema_version", "version"):
        if key in data and not isinstance(data[key], str):
            raise TaskError(config, f"{key} must be a string, got {data[key]!r}")
    _warn_unknown(data, _KNOWN_KEYS["top"], "", warnings)
    task_table = _table(data, "task", config)
    metadata = _table(data, "metadata", config)
    agent = _table(data, "agent", config)
    verifier = _table(data, "verifier", config)
    environment = _table(data, "environment", config)
    solution = _table(data, "solution", config)
    for table, section in ((task_table, "task"), (agent, "agent"), (verifier, "verifier")):
        _warn_unknown(table, _KNOWN_KEYS[section], f"[{section}]", warnings)
    _warn_unknown(environment, _KNOWN_KEYS["environment"], "[environment]", warnings)
    _warn_unknown(solution, _KNOWN_KEYS["solution"], "[solution]", warnings)
    _check_platform(environment, config, warnings)
    if solution.get("env"):
        warnings.append("task.toml: [solution].env is not passed to the solution by termgym; ignored")

    name = _optional_str(task_table, "task", "name", config) or fallback_name
    docker_image = _optional_str(environment, "environment", "docker_image", config)
    workdir = _optional_str(environment, "environment", "workdir", config)
    if workdir is not None and not workdir.startswith("/"):
        raise TaskError(config, f"[environment].workdir must be an absolute path, got {workdir!r}")

    environment_dir = task_dir / "environment"
    dockerfile: Path | None = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        if docker_image is None:
            raise TaskError(dockerfile, "missing Dockerfile (and task.toml sets no [environment].docker_image)")
        dockerfile = None
    compose = environment_dir / "docker-compose.yaml"
    if "environment" in verifier:
        raise TaskError(
            config,
            "[verifier.environment] (a separate grading image) is not supported yet; "
            'environment_mode = "separate" grades in a fresh sandbox of the task\'s own environment',
        )
    mode = verifier.get("environment_mode", "shared")
    if mode not in _VERIFIER_MODES:
        raise TaskError(config, f"[verifier].environment_mode must be one of {list(_VERIFIER_MODES)}, got {mode!r}")
    strategy = data.get("multi_step_reward_strategy", "mean")
    if strategy not in _REWARD_STRATEGIES:
        raise TaskError(
            config, f"multi_step_reward_strategy must be one of {list(_REWARD_STRATEGIES)}, got {strategy!r}"
        )
    agent_timeout = _timeout(agent, "timeout_sec", "[agent].timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC, config)
    verifier_timeout = _timeout(verifier, "timeout_sec", "[verifier].timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC, config)
    network = _network(environment, "[environment]", config, warnings)
    agent_network = _phase_network(agent, "[agent]", config, warnings)
    verifier_network = _phase_network(verifier, "[verifier]", config, warnings)
    healthcheck = _healthcheck(environment.get("healthcheck"), "[environment].healthcheck", config, warnings)
    artifacts = _artifacts(data.get("artifacts", []), "artifacts", config, warnings)

    solution_dir = task_dir / "solution"
    single = _Phase(
        instruction="",
        tests_dir=task_dir / "tests",
        test_script="test.sh",
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        solution_script="solve.sh" if (solution_dir / "solve.sh").is_file() else None,
    )
    steps = _steps(data.get("steps", []), task_dir, single, agent_timeout, verifier_timeout, config, warnings)
    if steps:
        first = steps[0]
        instruction = first.instruction
        single = _Phase(instruction, first.tests_dir, first.test_script, first.solution_dir, first.solution_script)
    else:
        instruction = _read_instruction(task_dir / "instruction.md")
        if not (single.tests_dir / "test.sh").is_file():
            raise TaskError(single.tests_dir / "test.sh", "missing test script (Harbor tasks need tests/test.sh)")
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
        solution_dir=single.solution_dir,
        solution_script=single.solution_script,
        tests_dir=single.tests_dir,
        test_script=single.test_script,
        agent_timeout_sec=agent_timeout,
        verifier_timeout_sec=verifier_timeout,
        build_timeout_sec=_timeout(
            environment, "build_timeout_sec", "[environment].build_timeout_sec", DEFAULT_BUILD_TIMEOUT_SEC, config
        ),
        resources=_resources(environment, config),
        network=network,
        verifier_env=_env(verifier, "verifier", config, environ),
        environment_env=_env(environment, "environment", config, environ),
        workdir=workdir,
        metadata=MappingProxyType(dict(metadata)),
        report_format=_report_format(verifier, config),
        expected_assertions=_assertion_count(verifier, config),
        verifier_mode=mode,
        artifacts=artifacts,
        agent_user=_user(agent, "[agent]", config),
        verifier_user=_user(verifier, "[verifier]", config),
        agent_network=agent_network,
        verifier_network=verifier_network,
        healthcheck=healthcheck,
        steps=steps,
        multi_step_reward_strategy=strategy,
        warnings=tuple(warnings),
    )


# Every key Harbor's TaskConfig defines (harbor 0.13, schema 1.3), per table, plus termgym's own
# ([verifier].report_format / assertions, allow_internet on a phase) and [task].version (written by
# schema 1.4 tasks). Anything else is accepted with a warning naming it.
_PHASE_NETWORK = ("network_mode", "allowed_hosts", "allow_internet")
_KNOWN_KEYS: dict[str, frozenset[str]] = {
    "top": frozenset(
        {"schema_version", "version", "source", "multi_step_reward_strategy", "artifacts", "steps"}
        | {"task", "metadata", "verifier", "agent", "environment", "solution"}
    ),
    "task": frozenset({"name", "description", "authors", "keywords", "version"}),
    "agent": frozenset({"timeout_sec", "user", *_PHASE_NETWORK}),
    "verifier": frozenset(
        {"timeout_sec", "env", "user", "environment_mode", "environment", "report_format", "assertions"}
        | set(_PHASE_NETWORK)
    ),
    "environment": frozenset(
        {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "memory", "storage"}
        | {"gpus", "gpu_types", "tpu", "env", "mcp_servers", "skills_dir", "workdir", "healthcheck"}
        | set(_PHASE_NETWORK)
    ),
    "solution": frozenset({"env"}),
    "healthcheck": frozenset(
        {"command", "interval_sec", "timeout_sec", "start_period_sec", "start_interval_sec", "retries"}
    ),
    "step": frozenset({"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}),
    "step_agent": frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"}),
    "step_verifier": frozenset(
        {"timeout_sec", "env", "user", "network_mode", "allowed_hosts", "environment_mode", "environment"}
    ),
    "artifact": frozenset({"source", "destination", "exclude"}),
}
_REWARD_STRATEGIES = ("mean", "final")
_STEP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_USER = re.compile(r"[^\s:-][^\s:]*(?::[^\s:]+)?")


@dataclass(frozen=True)
class _Phase:
    """What one agent phase gets: instruction, test script and solution (a task's or a step's)."""

    instruction: str
    tests_dir: Path
    test_script: str
    solution_dir: Path | None
    solution_script: str | None


def _warn_unknown(table: Mapping[str, object], known: frozenset[str], label: str, warnings: list[str]) -> None:
    for key in table:
        if key not in known:
            warnings.append(f"task.toml: unknown key {_label(label, key)} ignored")


def _label(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _check_platform(environment: Mapping[str, object], config: Path, warnings: list[str]) -> None:
    """``os`` must be linux (a Windows task cannot run in termgym's sandboxes); accelerators, MCP
    servers and skills are warned about when asked for, silent when empty or zero."""
    task_os = environment.get("os", "linux")
    if not isinstance(task_os, str) or task_os.lower() not in ("linux", "windows"):
        raise TaskError(config, f"[environment].os must be 'linux' or 'windows', got {task_os!r}")
    if task_os.lower() == "windows":
        raise TaskError(config, "[environment].os = 'windows': termgym runs Linux sandboxes only")
    gpus = environment.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise TaskError(config, f"[environment].gpus must be a non-negative integer, got {gpus!r}")
    if gpus:
        warnings.append(f"task.toml: [environment].gpus = {gpus}: termgym attaches no GPUs; ignored")
    for key, what in (("gpu_types", "GPU types"), ("mcp_servers", "MCP servers")):
        value = environment.get(key)
        if value is not None and not isinstance(value, list):
            raise TaskError(config, f"[environment].{key} must be a list, got {value!r}")
        if value:
            warnings.append(f"task.toml: [environment].{key} ({len(value)} {what}) not supported by termgym; ignored")
    tpu = environment.get("tpu")
    if tpu is not None and not isinstance(tpu, dict):
        raise TaskError(config, f"[environment].tpu must be a table, got {tpu!r}")
    if tpu:
        warnings.append("task.toml: [environment].tpu: termgym attaches no TPUs; ignored")
    skills = _optional_str(environment, "environment", "skills_dir", config)
    if skills is not None:
        warnings.append(f"task.toml: [environment].skills_dir = {skills!r} not supported by termgym; ignored")


def _user(table: Mapping[str, object], section: str, config: Path) -> str | None:
    """``[section].user``: a name or uid, optionally ``:group`` (what ``docker exec -u`` takes); an
    integer uid becomes its decimal string."""
    value = table.get("user")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _USER.fullmatch(value):
        return value
    raise TaskError(config, f"{section}.user must be a user name or uid (optionally name:group), got {value!r}")


def _number(
    table: Mapping[str, object], key: str, label: str, default: float, config: Path, *, positive: bool
) -> float:
    value = table.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        kind = "a positive" if positive else "a non-negative"
        raise TaskError(config, f"{label}.{key} must be {kind} number, got {value!r}")
    return float(value)


def _healthcheck(value: object, label: str, config: Path, warnings: list[str]) -> Healthcheck | None:
    """Harbor's ``healthcheck`` table, with its defaults; a missing or blank ``command`` is an error."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TaskError(config, f"{label} must be a table, got {value!r}")
    _warn_unknown(value, _KNOWN_KEYS["healthcheck"], label, warnings)
    command = value.get("command")
    if not isinstance(command, str) or not command.strip():
        raise TaskError(config, f"{label}.command must be a non-empty string, got {command!r}")
    retries = value.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise TaskError(config, f"{label}.retries must be a non-negative integer, got {retries!r}")
    return Healthcheck(
        command=command,
        interval_sec=_number(value, "interval_sec", label, 5.0, config, positive=False),
        timeout_sec=_number(value, "timeout_sec", label, 30.0, config, positive=True),
        start_period_sec=_number(value, "start_period_sec", label, 0.0, config, positive=False),
        start_interval_sec=_number(value, "start_interval_sec", label, 5.0, config, positive=False),
        retries=retries,
    )


def _steps(
    value: object,
    task_dir: Path,
    shared: _Phase,
    agent_timeout: float,
    verifier_timeout: float,
    config: Path,
    warnings: list[str],
) -> tuple[TaskStep, ...]:
    """Harbor's ``[[steps]]``: each names ``steps/<name>/`` with its ``instruction.md``; its test
    script is ``steps/<name>/tests/test.sh``, else the task's ``tests/test.sh``; its solution is
    ``steps/<name>/solution/``, else the task's; timeouts are ``[steps.agent]`` /
    ``[steps.verifier]``'s, else the task's."""
    if not isinstance(value, list):
        raise TaskError(config, f"steps must be an array of tables ([[steps]]), got {value!r}")
    steps: list[TaskStep] = []
    for index, item in enumerate(value):
        label = f"steps[{index}]"
        if not isinstance(item, dict):
            raise TaskError(config, f"{label} must be a table, got {item!r}")
        _warn_unknown(item, _KNOWN_KEYS["step"], label, warnings)
        name = item.get("name")
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            raise TaskError(config, f"{label}.name must be a directory name under steps/, got {name!r}")
        if any(step.name == name for step in steps):
            raise TaskError(config, f"{label}.name {name!r} is used by two steps")
        phases = {}
        for part in ("agent", "verifier"):
            table = item.get(part, {})
            if not isinstance(table, dict):
                raise TaskError(config, f"{label}.{part} must be a table, got {table!r}")
            _warn_unknown(table, _KNOWN_KEYS[f"step_{part}"], f"{label}.{part}", warnings)
            for key in sorted(set(table) & (_KNOWN_KEYS[f"step_{part}"] - {"timeout_sec"})):
                warnings.append(f"task.toml: {label}.{part}.{key} (per step) not supported by termgym yet; ignored")
            phases[part] = table
        for key in ("min_reward", "healthcheck", "artifacts"):
            if key in item:
                warnings.append(f"task.toml: {label}.{key} (per step) not supported by termgym yet; ignored")
        step_dir = task_dir / "steps" / name
        if not step_dir.is_dir():
            raise TaskError(step_dir, f"missing step directory for {label} ({name!r})")
        if (step_dir / "workdir").is_dir():
            warnings.append(
                f"task.toml: steps/{name}/workdir (files and setup.sh) not supported by termgym yet; ignored"
            )
        tests_dir = step_dir / "tests" if (step_dir / "tests" / "test.sh").is_file() else shared.tests_dir
        if not (tests_dir / "test.sh").is_file():
            raise TaskError(
                step_dir / "tests" / "test.sh", f"missing test script for step {name!r} (and no tests/test.sh)"
            )
        solution_dir, solution_script = shared.solution_dir, shared.solution_script
        if (step_dir / "solution").is_dir():
            solution_dir = step_dir / "solution"
            solution_script = "solve.sh" if (solution_dir / "solve.sh").is_file() else None
        steps.append(
            TaskStep(
                name=name,
                instruction=_read_instruction(step_dir / "instruction.md"),
                tests_dir=tests_dir,
                test_script="test.sh",
                solution_dir=solution_dir,
                solution_script=solution_script,
                agent_timeout_sec=_timeout(
                    phases["agent"], "timeout_sec", f"{label}.agent.timeout_sec", agent_timeout, config
                ),
                verifier_timeout_sec=_timeout(
                    phases["verifier"], "timeout_sec", f"{label}.verifier.timeout_sec", verifier_timeout, config
                ),
            )
        )
    return tuple(steps)


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


def _artifacts(value: object, label: str, config: Path, warnings: list[str]) -> tuple[str, ...]:
    """Harbor's top-level ``artifacts``: paths, or tables with a ``source`` path (``destination``
    and ``exclude`` are warned about and ignored); each absolute, without ``..``."""
    if not isinstance(value, list):
        raise TaskError(config, f"{label} must be a list of paths, got {value!r}")
    paths = []
    for index, item in enumerate(value):
        source = item.get("source") if isinstance(item, dict) else item
        if (
            not isinstance(source, str)
            or not source.startswith("/")
            or ".." in source.split("/")
            or source.strip("/") == ""
        ):
            raise TaskError(
                config,
                f"{label}[{index}] must be an absolute path (or a table with one as source), got {item!r}",
            )
        if isinstance(item, dict):
            _warn_unknown(item, _KNOWN_KEYS["artifact"], f"{label}[{index}]", warnings)
            for key in ("destination", "exclude"):
                if item.get(key):
                    warnings.append(f"task.toml: {label}[{index}].{key} not supported by termgym; ignored")
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


def _network(environment: Mapping[str, object], section: str, config: Path, warnings: list[str]) -> bool:
    """The environment's network: ``network_mode``, else the legacy ``allow_internet``, else on."""
    network = _phase_network(environment, section, config, warnings)
    return True if network is None else network


def _phase_network(table: Mapping[str, object], section: str, config: Path, warnings: list[str]) -> bool | None:
    """``network_mode`` (public, allowlist: on; no-network: off), else ``allow_internet``, else None.

    As in Harbor, ``allowed_hosts`` goes with ``allowlist`` alone and ``allowlist`` needs it;
    termgym does not enforce an allowlist (the sandbox gets the whole network) and warns so."""
    hosts = table.get("allowed_hosts")
    if hosts is not None and (
        not isinstance(hosts, list) or not all(isinstance(host, str) and host.strip() for host in hosts)
    ):
        raise TaskError(config, f"{section}.allowed_hosts must be a list of host names, got {hosts!r}")
    if "network_mode" in table:
        mode = table["network_mode"]
        if not isinstance(mode, str) or mode not in _NETWORK_MODES:
            raise TaskError(config, f"{section}.network_mode must be one of {sorted(_NETWORK_MODES)}, got {mode!r}")
        if mode == "allowlist":
            if not hosts:
                raise TaskError(config, f'{section}.network_mode = "allowlist" needs a non-empty allowed_hosts')
            warnings.append(
                f'task.toml: {section}.network_mode = "allowlist" is not enforced by termgym: '
                f"the sandbox gets the whole network, not only {', '.join(hosts)}"
            )
        elif hosts:
            raise TaskError(config, f'{section}.allowed_hosts is only valid with network_mode = "allowlist"')
        return _NETWORK_MODES[mode]
    if hosts:
        raise TaskError(config, f'{section}.allowed_hosts is only valid with network_mode = "allowlist"')
    allow = table.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise TaskError(config, f"{section}.allow_internet must be true or false, got {allow!r}")
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


def _load_tb1(task_dir: Path, fallback_name: str, environ: Mapping[str, str]) -> Task:
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
    warnings: list[str] = []
    compose = _tb1_compose(task_dir / "docker-compose.yaml", fallback_name, environ, warnings)
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
        environment_env=MappingProxyType({"TEST_DIR": TB1_TEST_DIR, **compose.env}),
        workdir=compose.workdir,
        metadata=MappingProxyType(metadata),
        warnings=tuple(warnings),
    )


_TB1_CONSUMED = frozenset({"instruction", "max_agent_timeout_sec", "max_test_timeout_sec"})
_COMPOSE_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def compose_variables(
    task_name: str, *, logs_path: str = "/tmp/termgym-tb1/logs", agent_logs_path: str = "/tmp/termgym-tb1/agent-logs"
) -> dict[str, str]:
    """The ``T_BENCH_*`` variables Terminal-Bench 1's harness sets for a task's compose file.

    Container paths are TB1's (``/tests``, ``/logs``, ``/agent-logs``); the image and container
    names are derived from ``task_name`` (lowercase, ``[a-z0-9_.-]``); ``logs_path`` and
    ``agent_logs_path`` are the host side of the logs volumes, which termgym does not mount."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task_name.lower()).strip("-._") or "task"
    return {
        "T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME": f"termgym-tb1-{slug}",
        "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME": f"termgym-tb1-{slug}-client",
        "T_BENCH_TASK_DOCKER_NAME_PREFIX": "termgym-tb1",
        "T_BENCH_TEST_DIR": TB1_TEST_DIR,
        "T_BENCH_TASK_LOGS_PATH": logs_path,
        "T_BENCH_CONTAINER_LOGS_PATH": "/logs",
        "T_BENCH_TASK_AGENT_LOGS_PATH": agent_logs_path,
        "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs",
    }


def fill_compose(text: str, variables: Mapping[str, str]) -> str:
    """``text`` with compose interpolation done from ``variables``, as ``docker compose`` does:
    ``${VAR}`` and ``$VAR`` (empty when unset), ``${VAR:-default}`` (default when unset or empty),
    ``${VAR-default}`` (default when unset), ``$$`` (a literal ``$``). Other forms stay as written."""

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        value = variables.get(name)
        if match["op"] == ":-" and not value:
            return match["default"]
        if match["op"] == "-" and value is None:
            return match["default"]
        return value or ""

    return _COMPOSE_VARIABLE.sub(substitute, text)


def _fill_values(data: object, variables: Mapping[str, str]) -> object:
    """Every string value of parsed YAML filled by :func:`fill_compose` (keys stay as written),
    as compose interpolates after parsing: a value cannot inject YAML."""
    if isinstance(data, str):
        return fill_compose(data, variables)
    if isinstance(data, list):
        return [_fill_values(item, variables) for item in data]
    if isinstance(data, dict):
        return {key: _fill_values(value, variables) for key, value in data.items()}
    return data


@dataclass(frozen=True)
class _Compose:
    env: Mapping[str, str]
    workdir: str | None


def _tb1_compose(compose: Path, task_name: str, environ: Mapping[str, str], warnings: list[str]) -> _Compose:
    """What termgym takes from a TB1 compose file, its values' ``T_BENCH_*`` variables filled in
    (host variables too, as compose would): the main service's (``client``, else the first)
    ``environment`` and ``working_dir``. Other services are the sandbox backend's to refuse."""
    variables = {**environ, **compose_variables(task_name)}
    try:
        data = _fill_values(yaml.safe_load(_read_text(compose)), variables)
    except yaml.YAMLError as exc:
        raise TaskError(compose, f"invalid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return _Compose(MappingProxyType({}), None)
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict):
        raise TaskError(compose, "must be a mapping with a services mapping")
    if not services:
        return _Compose(MappingProxyType({}), None)
    main = "client" if "client" in services else next(iter(services))
    service = services[main]
    if not isinstance(service, dict):
        raise TaskError(compose, f"services.{main} must be a mapping, got {service!r}")
    env = _compose_env(service.get("environment"), f"services.{main}.environment", compose, variables)
    workdir = service.get("working_dir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise TaskError(compose, f"services.{main}.working_dir must be an absolute path, got {workdir!r}")
    build = service.get("build")
    context = build.get("context", ".") if isinstance(build, dict) else build
    dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
    if build is None and isinstance(service.get("image"), str):
        image = service["image"]
        warnings.append(
            f"{compose.name}: services.{main}.image = {image!r} is not pulled; termgym builds the Dockerfile"
        )
    elif build is not None and (str(context).strip("/") not in (".", "") or dockerfile != "Dockerfile"):
        warnings.append(
            f"{compose.name}: services.{main}.build (context {context!r}, dockerfile {dockerfile!r}) is not used; "
            "termgym builds the task's Dockerfile with the task directory as context"
        )
    return _Compose(MappingProxyType(env), workdir)


def _compose_env(value: object, label: str, compose: Path, variables: Mapping[str, str]) -> dict[str, str]:
    """A compose ``environment`` (a list of ``KEY=VALUE`` / ``KEY``, or a mapping) as strings; a
    bare ``KEY`` (or a null value) passes the variable through and is dropped when unset."""
    if value is None:
        return {}
    if isinstance(value, list):
        pairs: list[tuple[object, object]] = []
        for item in value:
            if not isinstance(item, str) or not item.split("=", 1)[0]:
                raise TaskError(compose, f"{label} entries must be KEY=VALUE strings, got {item!r}")
            key, sep, item_value = item.partition("=")
            pairs.append((key, item_value if sep else None))
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise TaskError(compose, f"{label} must be a list or a mapping, got {value!r}")
    env = {}
    for key, item_value in pairs:
        if item_value is None:
            if str(key) in variables:
                env[str(key)] = variables[str(key)]
        elif isinstance(item_value, bool):
            env[str(key)] = "true" if item_value else "false"
        elif isinstance(item_value, (str, int, float)):
            env[str(key)] = str(item_value)
        else:
            raise TaskError(compose, f"{label}.{key} must be a string or a number, got {item_value!r}")
    return env


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
