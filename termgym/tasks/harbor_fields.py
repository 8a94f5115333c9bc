"""The field readers of Harbor's ``task.toml``: each reads one table or key of the parsed TOML and
gives it back checked, with Harbor's default when it is absent.

A wrong value raises :class:`~termgym.tasks.model.TaskError` naming ``task.toml`` and the key; a
key termgym accepts but does not act on (an unknown key, GPUs, an allowlist it cannot enforce)
appends a ``"task.toml: ..."`` line to the ``warnings`` list the caller passes. ``KNOWN_KEYS``
names every key each table may hold. ``termgym.tasks.harbor`` assembles the task from these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import cast, get_args

from termgym.sandboxes.base import Resources
from termgym.tasks.model import RESOURCE_BOUNDS, Healthcheck, TaskError, _timeout
from termgym.verifiers.report import ReportFormat

_NETWORK_MODES = {"public": True, "allowlist": True, "no-network": False}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(?:I?B)?", re.IGNORECASE)
_SIZE_FACTOR_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_HOST_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")

# Every key Harbor's TaskConfig defines (harbor 0.13, schema 1.3), per table, plus termgym's own
# ([verifier].report_format / assertions / allow_system_changes, allow_internet on a phase) and
# [task].version (written by schema 1.4 tasks). Anything else is accepted with a warning naming it.
_PHASE_NETWORK = ("network_mode", "allowed_hosts", "allow_internet")
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "top": frozenset(
        {"schema_version", "version", "source", "multi_step_reward_strategy", "artifacts", "steps"}
        | {"task", "metadata", "verifier", "agent", "environment", "solution"}
    ),
    "task": frozenset({"name", "description", "authors", "keywords", "version"}),
    "agent": frozenset({"timeout_sec", "user", *_PHASE_NETWORK}),
    "verifier": frozenset(
        {"timeout_sec", "env", "user", "environment_mode", "environment", "report_format", "assertions"}
        | {"allow_system_changes", "agent_paths"}
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
_USER = re.compile(r"[^\s:-][^\s:]*(?::[^\s:]+)?")


def warn_unknown(table: Mapping[str, object], known: frozenset[str], label: str, warnings: list[str]) -> None:
    """A warning for each key of ``table`` (``label``) that is not in ``known``."""
    for key in table:
        if key not in known:
            warnings.append(f"task.toml: unknown key {_label(label, key)} ignored")


def _label(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def check_platform(environment: Mapping[str, object], config: Path, warnings: list[str]) -> None:
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
    skills = optional_str(environment, "environment", "skills_dir", config)
    if skills is not None:
        warnings.append(f"task.toml: [environment].skills_dir = {skills!r} not supported by termgym; ignored")


def user(table: Mapping[str, object], section: str, config: Path) -> str | None:
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


def healthcheck(value: object, label: str, config: Path, warnings: list[str]) -> Healthcheck | None:
    """Harbor's ``healthcheck`` table, with its defaults; a missing or blank ``command`` is an error."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TaskError(config, f"{label} must be a table, got {value!r}")
    warn_unknown(value, KNOWN_KEYS["healthcheck"], label, warnings)
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


def report_format(verifier: Mapping[str, object], config: Path) -> ReportFormat | None:
    """``[verifier].report_format``: the one report format to grade from, or None."""
    value = verifier.get("report_format")
    formats = get_args(ReportFormat)
    if value is not None and value not in formats:
        raise TaskError(config, f"[verifier].report_format must be one of {list(formats)}, got {value!r}")
    return cast(ReportFormat | None, value)


def assertion_count(verifier: Mapping[str, object], config: Path) -> int | None:
    """``[verifier].assertions``: how many assertions the verifier defines (positive), or None."""
    value = verifier.get("assertions")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise TaskError(config, f"[verifier].assertions must be a positive integer, got {value!r}")
    return value


def flag(table: Mapping[str, object], key: str, section: str, config: Path) -> bool:
    """``[section].key``: true or false, false when absent."""
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise TaskError(config, f"{section}.{key} must be true or false, got {value!r}")
    return value


def agent_paths(verifier: Mapping[str, object], config: Path) -> tuple[str, ...]:
    """``[verifier].agent_paths``: absolute paths without ``..``, none of them ``/``; () when absent."""
    value = verifier.get("agent_paths", [])
    if not isinstance(value, list) or not all(
        isinstance(item, str) and item.startswith("/") and ".." not in item.split("/") and item.strip("/")
        for item in value
    ):
        raise TaskError(config, f"[verifier].agent_paths must be a list of absolute paths other than /, got {value!r}")
    return tuple("/" + item.strip("/") for item in value)


def artifacts(value: object, label: str, config: Path, warnings: list[str]) -> tuple[str, ...]:
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
            warn_unknown(item, KNOWN_KEYS["artifact"], f"{label}[{index}]", warnings)
            for key in ("destination", "exclude"):
                if item.get(key):
                    warnings.append(f"task.toml: {label}[{index}].{key} not supported by termgym; ignored")
        paths.append("/" + source.strip("/"))
    return tuple(paths)


def table(data: Mapping[str, object], key: str, config: Path) -> dict[str, object]:
    """The table ``[key]`` of ``data``, empty when absent."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise TaskError(config, f"[{key}] must be a table, got {value!r}")
    return value


def optional_str(table: Mapping[str, object], section: str, key: str, config: Path) -> str | None:
    """``[section].key``: a non-blank string, or None when absent."""
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TaskError(config, f"[{section}].{key} must be a non-empty string, got {value!r}")
    return value


def resources(environment: Mapping[str, object], config: Path) -> Resources:
    """``[environment]``'s cpus, memory and storage (``memory_mb`` or the legacy ``memory = "2G"``),
    each within what a container engine accepts."""
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


def network(environment: Mapping[str, object], section: str, config: Path, warnings: list[str]) -> bool:
    """The environment's network: ``network_mode``, else the legacy ``allow_internet``, else on."""
    network = phase_network(environment, section, config, warnings)
    return True if network is None else network


def phase_network(table: Mapping[str, object], section: str, config: Path, warnings: list[str]) -> bool | None:
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


def env(table: Mapping[str, object], section: str, config: Path, environ: Mapping[str, str]) -> Mapping[str, str]:
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
