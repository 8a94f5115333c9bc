"""``check_config``: one clear line for a setting no phase could use, before any work starts, for
configurations from the command line and from code alike; and the values each mode allows, read
from its ``Literal`` annotation (``--help`` lists the same)."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

from termgym.envs.families.split import FAMILY_SETS
from termgym.errors import ConfigError, UnknownName
from termgym.tasks.bundled import is_task_name, unknown_task
from termgym.tracking import require_tracker

from .config import Config, init_dir


def choices_of(annotation: object) -> tuple[str, ...]:
    """The values a ``Literal`` annotation allows (for a union of them, every member's, in order);
    empty for any other annotation."""
    if get_origin(annotation) is Literal:
        return tuple(get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        members = [choices_of(arg) for arg in get_args(annotation)]
        if all(members):
            return tuple(value for member in members for value in member)
    return ()


HINTS = get_type_hints(Config)  # each field's annotation, evaluated (the module's names resolved)
FIELD_CHOICES: dict[str, tuple[str, ...]] = {  # the modes: each Literal field and its values
    f.name: choices_of(HINTS[f.name]) for f in dataclasses.fields(Config) if choices_of(HINTS[f.name])
}
POOL_ONLY = ("families", "sft_first_families")  # read only with --pool: check_config checks them then


def check_config(cfg: Config) -> None:
    """One ``ValueError`` line for a value no phase could use, before any work starts."""
    for name, allowed in FIELD_CHOICES.items():
        if name not in POOL_ONLY and getattr(cfg, name) not in allowed:
            raise UnknownName(f"--{name.replace('_', '-')}", getattr(cfg, name), allowed)
    for name in () if cfg.pool else cfg.tasks:  # --pool generates its tasks
        if not is_task_name(name):
            raise unknown_task(name)
    if cfg.track:
        require_tracker(cfg.track)
    if cfg.kl_coef < 0:
        raise ConfigError(f"--kl-coef must be at least 0, got {cfg.kl_coef}")
    if cfg.generator == "server" and not (cfg.base_url and cfg.served_model):
        raise ConfigError(
            "--generator server needs --base-url URL and --served-model NAME (the vllm serve that samples the policy)"
        )
    if cfg.agent != "model" and cfg.action_format != "tool":
        raise ConfigError(f"--agent {cfg.agent} calls its bash tool: give --action-format tool")
    if cfg.agent_config and cfg.agent == "model":
        raise ConfigError("--agent-config applies to a harness (--agent mini-swe-agent), not the model agent")
    if cfg.agent == "mini-swe-agent":  # the extra installed and its configuration readable, before any work
        from termgym.integrations.mini_swe_agent import load_config

        load_config(cfg.agent_config or None)
    if cfg.cluster and cfg.cpus_per_sandbox <= 0:
        raise ConfigError(f"--cpus-per-sandbox must be positive, got {cfg.cpus_per_sandbox}")
    if cfg.advantage == "group" and cfg.group_size < 2:
        raise ConfigError("--advantage group compares episodes of the same task: give --group-size 2 or more")
    for name in (
        "reward_scale",
        "steps",
        "batch_size",
        "minibatch_size",
        "concurrency",
        "max_turns",
        "max_new_tokens",
        "max_parse_errors",
        "update_epochs",
        "group_size",
    ):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.pool and cfg.init and not (init_dir(cfg) / "config.json").is_file():
        raise ConfigError(f"--init {cfg.init}: {init_dir(cfg)} is not a model directory (no config.json)")
    if not 0.0 <= cfg.start_floor <= 1.0:
        raise ConfigError(f"--start-floor is a share of assertions, from 0 to 1, got {cfg.start_floor}")
    if cfg.sft_data and not cfg.pool:
        raise ConfigError("--sft-data feeds the supervised start of the main job: give it with --pool")
    for given in cfg.sft_data.split(",") if cfg.sft_data else ():
        if not Path(given.strip()).exists():
            raise ConfigError(f"--sft-data {given.strip()}: no such file or directory")
    if cfg.pool and cfg.ppo_pool < 0:
        raise ConfigError(f"--ppo-pool must be at least 0, got {cfg.ppo_pool}")
    for name in POOL_ONLY if cfg.pool else ():  # a family set, or none for --sft-first-families
        if getattr(cfg, name) not in (*FAMILY_SETS, *(("",) if name == "sft_first_families" else ())):
            raise UnknownName(f"--{name.replace('_', '-')}", getattr(cfg, name), FAMILY_SETS)
    if (
        cfg.pool
        and cfg.sft_stop_share
        and not (0 < cfg.sft_stop_share <= 1 and cfg.sft_check_every >= 1 and cfg.sft_validation >= 1)
    ):
        raise ConfigError(
            f"--sft-stop-share must be in (0, 1], with --sft-check-every and --sft-validation at least 1"
            f" (got {cfg.sft_stop_share}, {cfg.sft_check_every}, {cfg.sft_validation})"
        )
    if (
        cfg.pool
        and cfg.sft_first_families
        and (cfg.sft_first_families not in FAMILY_SETS or cfg.sft_first_pool < 1 or cfg.sft_first_steps < 1)
    ):
        raise ConfigError(
            f"--sft-first-families must be one of {', '.join(FAMILY_SETS)}, with --sft-first-pool and"
            f" --sft-first-steps at least 1"
            f" (got {cfg.sft_first_families!r}, {cfg.sft_first_pool}, {cfg.sft_first_steps})"
        )
    if cfg.pool and (
        cfg.heldout < 1 or cfg.sft_batch_size < 1 or cfg.sft_steps < 0 or cfg.audit_k < 1 or cfg.eval_samples < 0
    ):
        raise ConfigError(
            "with --pool, --heldout, --sft-batch-size and --audit-k must be at least 1"
            " (--sft-steps and --eval-samples at least 0)"
        )
