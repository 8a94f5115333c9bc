"""Harbor's run overrides, applied to a task before its sandbox is made: the timeout multipliers,
the resource overrides and the run's network choice (``--network none``).

``apply_overrides`` is pure: it returns the task the trial runs, the overrides that changed
something (name -> value, for the record) and one warning per phase that gets less network than
the task asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from termgym.errors import ConfigError
from termgym.sandboxes.base import Resources
from termgym.tasks import RESOURCE_BOUNDS, Task

NetworkChoice = Literal["task", "none"]
NETWORK_CHOICES: tuple[str, ...] = get_args(NetworkChoice)


@dataclass(frozen=True)
class RunOverrides:
    """What the whole run changes in every task (None or 1.0: nothing)."""

    agent_timeout_multiplier: float = 1.0
    verifier_timeout_multiplier: float = 1.0
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: str = "task"

    def __post_init__(self) -> None:
        for name in ("agent_timeout_multiplier", "verifier_timeout_multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}")
        for name in ("cpus", "memory_mb", "storage_mb"):
            value = getattr(self, name)
            if value is None:
                continue
            low, high = RESOURCE_BOUNDS[name]
            whole = name != "cpus"
            if isinstance(value, bool) or (whole and not isinstance(value, int)) or not low <= value <= high:
                kind = "a whole number" if whole else "a number"
                raise ConfigError(
                    f"--override-{name.replace('_', '-')} must be {kind} from {low:g} to {high:g}, got {value!r}"
                )
        if self.network not in NETWORK_CHOICES:
            raise ConfigError(f"--network must be one of {', '.join(NETWORK_CHOICES)}, got {self.network!r}")


def apply_overrides(task: Task, overrides: RunOverrides) -> tuple[Task, dict[str, Any], list[str]]:
    """The task as the run changes it, the overrides that applied, and the network warnings."""
    applied: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    if overrides.agent_timeout_multiplier != 1.0:
        applied["agent_timeout_multiplier"] = overrides.agent_timeout_multiplier
        changes["agent_timeout_sec"] = task.agent_timeout_sec * overrides.agent_timeout_multiplier
        changes["steps"] = tuple(
            replace(s, agent_timeout_sec=s.agent_timeout_sec * overrides.agent_timeout_multiplier) for s in task.steps
        )
    if overrides.verifier_timeout_multiplier != 1.0:
        applied["verifier_timeout_multiplier"] = overrides.verifier_timeout_multiplier
        changes["verifier_timeout_sec"] = task.verifier_timeout_sec * overrides.verifier_timeout_multiplier
        changes["steps"] = tuple(
            replace(s, verifier_timeout_sec=s.verifier_timeout_sec * overrides.verifier_timeout_multiplier)
            for s in changes.get("steps", task.steps)
        )
    resources: dict[str, Any] = {
        name: value
        for name, value in (
            ("cpus", overrides.cpus),
            ("memory_mb", overrides.memory_mb),
            ("storage_mb", overrides.storage_mb),
        )
        if value is not None
    }
    if resources:
        applied.update({f"override_{name}": value for name, value in resources.items()})
        changes["resources"] = Resources(**{**task.resources.__dict__, **resources})
    warnings: list[str] = []
    if overrides.network == "none":
        asked = [phase for phase, wants in network_asked(task).items() if wants]
        if asked:
            applied["network"] = "none"
            warnings.append(
                f"the task asks for network in its {' and '.join(asked)} phase; --network none withholds it"
            )
        changes.update(network=False, agent_network=False, verifier_network=False)
    return replace(task, **changes), applied, warnings


def override_fields(args: Any) -> dict[str, Any]:
    """The EnvOptions fields a command's override flags set (``termgym.cli.common.run_overrides_options``)."""
    overrides = RunOverrides(
        agent_timeout_multiplier=args.agent_timeout_multiplier,
        verifier_timeout_multiplier=args.verifier_timeout_multiplier,
        cpus=args.override_cpus,
        memory_mb=args.override_memory_mb,
        storage_mb=args.override_storage_mb,
        network=args.network,
    )
    return {
        "overrides": overrides,
        "pull": args.pull,
        "build": getattr(args, "build", False),
        "reward_scale": args.reward_scale,
    }


def network_asked(task: Task) -> dict[str, bool]:
    """Per phase, whether the task asks for network: ``[agent]`` / ``[verifier]`` override the
    environment's setting, as Harbor's phase ``network_mode`` does."""
    return {
        "agent": task.network if task.agent_network is None else task.agent_network,
        "verifier": task.network if task.verifier_network is None else task.verifier_network,
    }
