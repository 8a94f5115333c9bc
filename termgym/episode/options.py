"""What a run sets for every episode it runs (``EnvOptions``), checked when made: a bad value is a
``ConfigError`` in one line, never a failure halfway through a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from termgym.episode.overrides import RunOverrides
from termgym.episode.tamper import TAMPER_POLICIES
from termgym.errors import ConfigError
from termgym.images.pull import PULL_POLICIES
from termgym.output import DEFAULT_OUTPUT_LIMIT
from termgym.verifiers import DEFAULT_SCALE

DEFAULT_MAX_TURNS = 50
DEFAULT_COMMAND_TIMEOUT = 180.0


@dataclass(frozen=True)
class EnvOptions:
    backend: str = "local"
    max_turns: int = DEFAULT_MAX_TURNS
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT  # per command; also capped by the agent timeout
    agent_timeout: float | None = None  # None: the task's own
    reward_scale: int = DEFAULT_SCALE
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    run_id: str = ""
    image_aliases: Mapping[str, str] | None = None  # None: built-in and config-file aliases
    tamper: str = "fail"  # forged loads: "fail" scores the trial 0, "warn" records them (termgym.episode.tamper)
    trials_dir: str | None = None  # where each trial's directory (its transcript) goes; None: not kept
    overrides: RunOverrides = field(default_factory=RunOverrides)  # Harbor's run overrides (termgym.episode.overrides)
    pull: str = "missing"  # registry images (docker): missing, never, always
    build: bool = False  # build the Dockerfile even when the task names a docker_image
    cluster: str | None = None  # a Ray cluster's address (--cluster): sandboxes run on its nodes
    keep: bool = False  # leave the sandbox running after the episode (record.kept says how to enter it)

    def __post_init__(self) -> None:
        if self.pull not in PULL_POLICIES:
            raise ConfigError(f"--pull must be one of {', '.join(PULL_POLICIES)}, got {self.pull!r}")
        if isinstance(self.reward_scale, bool) or not isinstance(self.reward_scale, int) or self.reward_scale < 1:
            raise ConfigError(f"--reward-scale must be a whole number of at least 1, got {self.reward_scale!r}")
        if self.tamper not in TAMPER_POLICIES:
            raise ConfigError(f"tamper must be one of {', '.join(TAMPER_POLICIES)}, got {self.tamper!r}")
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.command_timeout <= 0:
            raise ConfigError(f"command_timeout must be positive, got {self.command_timeout}")
        if self.agent_timeout is not None and self.agent_timeout <= 0:
            raise ConfigError(f"agent_timeout must be positive, got {self.agent_timeout}")
