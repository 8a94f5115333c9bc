"""The Harbor / Terminal-Bench 2 loader (``task.toml``); ``termgym.tasks`` documents the format."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from termgym.tasks import harbor_fields as fields
from termgym.tasks.model import (
    DEFAULT_AGENT_TIMEOUT_SEC,
    DEFAULT_BUILD_TIMEOUT_SEC,
    DEFAULT_VERIFIER_TIMEOUT_SEC,
    Task,
    TaskError,
    TaskStep,
    _family,
    _read_instruction,
    _read_text,
    _timeout,
)

_VERIFIER_MODES = ("shared", "separate")
_REWARD_STRATEGIES = ("mean", "final")
_STEP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


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
    fields.warn_unknown(data, fields.KNOWN_KEYS["top"], "", warnings)
    task_table = fields.table(data, "task", config)
    metadata = fields.table(data, "metadata", config)
    agent = fields.table(data, "agent", config)
    verifier = fields.table(data, "verifier", config)
    environment = fields.table(data, "environment", config)
    solution = fields.table(data, "solution", config)
    for table, section in ((task_table, "task"), (agent, "agent"), (verifier, "verifier")):
        fields.warn_unknown(table, fields.KNOWN_KEYS[section], f"[{section}]", warnings)
    fields.warn_unknown(environment, fields.KNOWN_KEYS["environment"], "[environment]", warnings)
    fields.warn_unknown(solution, fields.KNOWN_KEYS["solution"], "[solution]", warnings)
    fields.check_platform(environment, config, warnings)
    if solution.get("env"):
        warnings.append("task.toml: [solution].env is not passed to the solution by termgym; ignored")

    name = fields.optional_str(task_table, "task", "name", config) or fallback_name
    docker_image = fields.optional_str(environment, "environment", "docker_image", config)
    workdir = fields.optional_str(environment, "environment", "workdir", config)
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
    network = fields.network(environment, "[environment]", config, warnings)
    agent_network = fields.phase_network(agent, "[agent]", config, warnings)
    verifier_network = fields.phase_network(verifier, "[verifier]", config, warnings)
    healthcheck = fields.healthcheck(environment.get("healthcheck"), "[environment].healthcheck", config, warnings)
    artifacts = fields.artifacts(data.get("artifacts", []), "artifacts", config, warnings)

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
        resources=fields.resources(environment, config),
        network=network,
        verifier_env=fields.env(verifier, "verifier", config, environ),
        environment_env=fields.env(environment, "environment", config, environ),
        workdir=workdir,
        metadata=MappingProxyType(dict(metadata)),
        report_format=fields.report_format(verifier, config),
        expected_assertions=fields.assertion_count(verifier, config),
        allow_system_changes=fields.flag(verifier, "allow_system_changes", "[verifier]", config),
        agent_paths=fields.agent_paths(verifier, config),
        verifier_mode=mode,
        artifacts=artifacts,
        agent_user=fields.user(agent, "[agent]", config),
        verifier_user=fields.user(verifier, "[verifier]", config),
        agent_network=agent_network,
        verifier_network=verifier_network,
        healthcheck=healthcheck,
        steps=steps,
        multi_step_reward_strategy=strategy,
        warnings=tuple(warnings),
    )


@dataclass(frozen=True)
class _Phase:
    """What one agent phase gets: instruction, test script and solution (a task's or a step's)."""

    instruction: str
    tests_dir: Path
    test_script: str
    solution_dir: Path | None
    solution_script: str | None


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
        fields.warn_unknown(item, fields.KNOWN_KEYS["step"], label, warnings)
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
            fields.warn_unknown(table, fields.KNOWN_KEYS[f"step_{part}"], f"{label}.{part}", warnings)
            for key in sorted(set(table) & (fields.KNOWN_KEYS[f"step_{part}"] - {"timeout_sec"})):
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
