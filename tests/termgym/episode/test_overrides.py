"""Harbor's run overrides, the network choice and the reward scale: applied to the task, recorded
in every trial, validated in one line; and ``check``'s view of a trial that is not resolved."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest

from termgym.episode.overrides import RunOverrides, apply_overrides, network_asked
from termgym.errors import ConfigError
from termgym.sandboxes.base import Resources
from termgym.tasks import load_task
from tests.helpers import KIT_SOURCE, termgym, write_task
from tests.termgym.cli.test_cli import one_line_error


def test_no_override_leaves_the_task_as_it_is(task_dir):
    task = load_task(task_dir)
    changed, applied, warnings = apply_overrides(task, RunOverrides())
    assert changed == task and applied == {} and warnings == []


def test_multipliers_and_resources_change_the_task_and_say_so(task_dir):
    task = load_task(task_dir)
    overrides = RunOverrides(agent_timeout_multiplier=2.5, verifier_timeout_multiplier=0.5, memory_mb=512, cpus=2)
    changed, applied, _ = apply_overrides(task, overrides)
    assert changed.agent_timeout_sec == task.agent_timeout_sec * 2.5
    assert changed.verifier_timeout_sec == task.verifier_timeout_sec * 0.5
    assert changed.resources == Resources(cpus=2, memory_mb=512, storage_mb=task.resources.storage_mb)
    assert applied == {
        "agent_timeout_multiplier": 2.5,
        "verifier_timeout_multiplier": 0.5,
        "override_cpus": 2,
        "override_memory_mb": 512,
    }


def test_network_none_withholds_every_phase_and_warns_only_when_asked(task_dir):
    task = replace(load_task(task_dir), network=True, verifier_network=False)
    changed, applied, warnings = apply_overrides(task, RunOverrides(network="none"))
    assert network_asked(task) == {"agent": True, "verifier": False}
    assert network_asked(changed) == {"agent": False, "verifier": False}
    assert applied == {"network": "none"} and len(warnings) == 1 and "agent phase" in warnings[0]
    offline = replace(task, network=False, verifier_network=None)
    assert apply_overrides(offline, RunOverrides(network="none"))[1:] == ({}, [])


@pytest.mark.parametrize(
    "fields",
    [
        {"agent_timeout_multiplier": 0},
        {"verifier_timeout_multiplier": float("inf")},
        {"cpus": 0.0},
        {"memory_mb": 2.5},
        {"storage_mb": 0},
        {"network": "bridge"},
    ],
)
def test_nonsense_overrides_are_config_errors(fields):
    with pytest.raises(ConfigError, match="--"):
        RunOverrides(**fields)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--agent-timeout-multiplier", "0"),
        ("--verifier-timeout-multiplier", "-2"),
        ("--override-memory-mb", "0"),
        ("--override-cpus", "abc"),
        ("--network", "host"),
        ("--pull", "sometimes"),
        ("--reward-scale", "0"),
    ],
)
def test_bad_override_values_are_one_line_and_exit_2(task_dir, flag, value):
    result = termgym("check", str(task_dir), flag, value)
    assert result.returncode == 2
    assert flag in one_line_error(result)


def test_check_records_the_overrides_and_the_reward_scale(task_dir, no_leaks):
    result = termgym(
        "check", str(task_dir), "--json", "--reward-scale", "4", "--agent-timeout-multiplier", "3", "--network", "none"
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["resolved"] and record["passed"] == 2
    assert record["reward_scale"] == 4 and record["reward"] == pytest.approx(2 / 4)
    # the task asks for no network: --network none withholds nothing, so it is not an override that applied
    assert record["overrides"] == {"agent_timeout_multiplier": 3.0}


def test_check_shows_the_verifier_output_tail_and_v_shows_all(tmp_path, no_leaks):
    lines = "\n".join(f"echo line-{n:03d}" for n in range(60))
    test_sh = f'#!/bin/sh\n{KIT_SOURCE}\n{lines}\ntg_check "result exists" test -f /app/result.txt\ntg_finish\n'
    task_dir = write_task(tmp_path, test_sh=textwrap.dedent(test_sh))
    tail = termgym("check", str(task_dir), "--agent", "null")
    assert tail.returncode == 0, tail.stderr
    assert "verifier output (last 20 lines" in tail.stdout
    assert "line-059" in tail.stdout and "line-010" not in tail.stdout
    everything = termgym("check", str(task_dir), "--agent", "null", "-v")
    assert "line-000" in everything.stdout and "line-059" in everything.stdout
    resolved = termgym("check", str(task_dir))
    assert "verifier output" not in resolved.stdout and "line-059" not in resolved.stdout


def test_the_trainer_config_carries_the_reward_scale():
    from termgym.trainer.checks import check_config
    from termgym.trainer.config import Config
    from termgym.trainer.flags import parse_config
    from termgym.trainer.rollout import rollout_options

    cfg = parse_config(["--reward-scale", "5"])
    assert cfg.reward_scale == 5 and rollout_options(cfg, "r").reward_scale == 5
    with pytest.raises(ConfigError, match="--reward-scale"):
        check_config(replace(Config(), reward_scale=0))
