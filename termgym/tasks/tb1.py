"""The Terminal-Bench 1 loader (``task.yaml``, its compose file and ``T_BENCH_*`` variables);
``termgym.tasks`` documents the format."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from termgym.sandboxes.base import Resources
from termgym.tasks.model import (
    DEFAULT_BUILD_TIMEOUT_SEC,
    TB1_DEFAULT_AGENT_TIMEOUT_SEC,
    TB1_DEFAULT_TEST_TIMEOUT_SEC,
    TB1_TEST_DIR,
    Task,
    TaskError,
    _family,
    _read_text,
    _timeout,
)

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
    allow_system_changes = data.get("allow_system_changes", False)  # termgym's own key, as [verifier]'s
    if not isinstance(allow_system_changes, bool):
        raise TaskError(config, f"'allow_system_changes' must be true or false, got {allow_system_changes!r}")
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
        allow_system_changes=allow_system_changes,
        warnings=tuple(warnings),
    )


_TB1_CONSUMED = frozenset({"instruction", "max_agent_timeout_sec", "max_test_timeout_sec", "allow_system_changes"})
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
