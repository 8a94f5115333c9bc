"""Training through an unchanged harness (``--agent mini-swe-agent``): the reference demonstrations
run the real mini-swe-agent against the scripted teacher behind the gateway, and equal the rollout
of a policy that samples them; PPO steps through the harness keep the ids sampled (token drift 0)
and count the harness's history rewrites as breaks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from termgym.agents.model import LoopSettings
from termgym.agents.renderers import make_renderer
from termgym.cli import main as termgym_main
from termgym.env import AsyncTerminalEnv
from termgym.envs.families import generate_split, reference_commands
from termgym.episode.options import EnvOptions
from termgym.errors import ConfigError
from termgym.integrations.mini_swe_agent import SUBMIT_LINE, MiniSweAgent, load_config
from termgym.tasks import load_task
from termgym.trainer.checks import check_config
from termgym.trainer.config import Config
from termgym.trainer.rollout import RolloutSettings, run_policy_episode
from termgym.trainer.sampler import Sampler
from termgym.trainer.sft import collect_demonstrations, reference_replies
from termgym.trainer.trajectory import Trajectory
from tests.trainer.test_ppo import metrics_of, tiny_args
from tests.trainer.test_sft import ReplaySampler

pytest.importorskip("minisweagent", reason="the harnesses extra")

OPTIONS = EnvOptions(backend="local", max_turns=5, command_timeout=5.0)


@pytest.fixture(scope="module")
def harness_settings() -> RolloutSettings:
    loop = LoopSettings(action_format="tool", max_tokens=96, context="none")
    return RolloutSettings(loop, 768, 64, harness=MiniSweAgent(load_config("tiny"), max_turns=5))


@pytest.fixture(scope="module")
def family_tasks(tmp_path_factory):
    return [load_task(p) for p in generate_split(tmp_path_factory.mktemp("pool"), "train", 5, seed=3)]


def test_the_teachers_replies_are_bash_tool_calls_ending_with_the_harness_submit(tiny_policy, harness_settings):
    renderer = make_renderer("chatml", tiny_policy[1])
    replies = reference_replies(renderer, harness_settings, ["mkdir /app/x"])
    texts = [renderer.tokenizer.decode(r) for r in replies]
    assert len(texts) == 2 and all('"name": "bash"' in t for t in texts)
    assert "mkdir /app/x" in texts[0] and f"echo {SUBMIT_LINE}" in texts[1]
    assert "submit" not in texts[1].replace(SUBMIT_LINE, "")  # not termgym's own submit tool


async def test_a_harness_demonstration_is_the_rollout_of_a_policy_that_samples_it(
    family_tasks, tiny_policy, harness_settings, no_leaks
):
    renderer = make_renderer("chatml", tiny_policy[1])
    found = await collect_demonstrations(
        family_tasks, lambda t: reference_commands(t.path), OPTIONS, renderer, harness_settings
    )
    assert not found.problems and len(found.demonstrations) == len(family_tasks)
    for task, demo in zip(family_tasks, found.demonstrations):
        typed = [token for token, m in zip(demo.ids, demo.mask) if m]
        assert SUBMIT_LINE in renderer.tokenizer.decode(typed)
        trajectory = Trajectory(task=task.name)
        async with AsyncTerminalEnv(task, OPTIONS) as env:
            instruction, info = await env.reset()
            replay = cast(Sampler, ReplaySampler(typed))
            step = await run_policy_episode(
                env, instruction, info, replay, renderer, harness_settings, None, trajectory
            )
            calls = env.transcript.calls
        (sample,) = trajectory.samples
        assert sample.ids == demo.ids and sample.loss_mask == demo.mask
        assert trajectory.stop_reason == "submitted" and step is not None and step[4]["resolved"]
        # mini-swe-agent's action, as termgym ran it: a fresh subshell at the working directory
        assert all(c.startswith("( cd -- /app || exit 1\n") for c in trajectory.commands)
        assert [c.strip().splitlines()[1] for c in trajectory.commands] == [*demo.commands, f"echo {SUBMIT_LINE}"]
        # one gateway call per reply, each answered, and the harness's requests carried its own tool
        assert len(calls) == len(demo.commands) + 1 and {c["status"] for c in calls} == {200}
        assert [t["function"]["name"] for t in calls[0]["request"]["tools"]] == ["bash"]


def test_ppo_steps_through_the_harness_keep_the_sampled_ids(tmp_path, tiny_policy_dir, no_leaks, capsys):
    out = tmp_path / "run"
    extra = ["--agent", "mini-swe-agent", "--agent-config", "tiny", "--action-format", "tool", "--max-new-tokens", "64"]
    assert termgym_main(["train", *tiny_args(out, tiny_policy_dir, 2, *extra)]) == 0
    for m in metrics_of(out):
        assert m["token_drift"] == 0 and m["action_tokens"] > 0
        # a random policy rarely writes a valid tool call; mini-swe-agent then drops the reply from
        # its history, so the next prompt does not extend the sample: a counted break, a new sample
        assert m["segments_per_episode"] >= 1.0
        assert (m["segments_per_episode"] > 1.0) == (m["bridge_break_rate"] > 0)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["error"] is None for r in records)
    assert "step 2/2 reward" in capsys.readouterr().err


def test_a_harness_needs_the_tool_format_and_the_model_agent_takes_no_harness_config():
    with pytest.raises(ConfigError, match="--action-format tool"):
        check_config(Config(agent="mini-swe-agent", action_format="text"))
    with pytest.raises(ConfigError, match="--agent-config applies to a harness"):
        check_config(Config(agent_config="tiny"))
    check_config(Config(agent="mini-swe-agent", action_format="tool", agent_config="tiny"))


def test_an_unknown_agent_config_is_one_line_before_any_work(tmp_path, capsys):
    missing = Path(tmp_path) / "nope.yaml"
    with pytest.raises(ConfigError, match="no such file"):
        load_config(missing)
    out = tmp_path / "run"
    argv = [
        "train",
        "--agent",
        "mini-swe-agent",
        "--action-format",
        "tool",
        "--agent-config",
        str(missing),
        "--out",
        str(out),
    ]
    assert termgym_main(argv) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1 and not out.exists()
