"""The supervised warm start: demonstrations through the model agent's loop with the reference
as the teacher, recorded in real sandboxes (only resolved ones kept), equal to the rollout of a
policy that samples them, and a deterministic supervised loop that learns them."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import cast

import pytest
import torch

from termgym.agents.model import LoopSettings, ModelAgent
from termgym.agents.renderers import make_renderer
from termgym.env import AsyncTerminalEnv
from termgym.envs.families import generate_split, reference_commands
from termgym.episode.options import EnvOptions
from termgym.errors import TrainingError
from termgym.tasks import load_task
from termgym.trainer.policy_client import TeacherClient
from termgym.trainer.rollout import SHORT_TEXT_SYSTEM, RolloutSettings, run_policy_episode
from termgym.trainer.sampler import Sampler, TokenSampler
from termgym.trainer.sft import collect_demonstrations, reference_replies, supervised_train
from termgym.trainer.trajectory import Trajectory
from tests.trainer.fake_env import FakeEnv

OPTIONS = EnvOptions(backend="local", max_turns=4, command_timeout=5.0)
SETTINGS = RolloutSettings(
    LoopSettings(action_format="text", max_tokens=48, context="none", system_prompt=SHORT_TEXT_SYSTEM), 512, 64
)


@pytest.fixture(scope="module")
def family_tasks(tmp_path_factory):
    """One task of each training family (write-file, make-dir, copy-file, dir-and-file, dir-file-copy)."""
    return [load_task(p) for p in generate_split(tmp_path_factory.mktemp("pool"), "train", 5, seed=3)]


class ReplaySampler(TokenSampler):
    """A sampler that types a fixed token sequence, one token per request: the policy that
    would produce exactly the demonstration."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    async def sample(self, ids, generator):
        return self.tokens.pop(0), -0.5


async def test_a_demonstration_is_the_rollout_of_a_policy_that_samples_it(family_tasks, tiny_policy, no_leaks):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    found = await collect_demonstrations(
        family_tasks, lambda t: reference_commands(t.path), OPTIONS, renderer, SETTINGS
    )
    assert not found.problems and len(found.demonstrations) == len(family_tasks)
    for task, demo in zip(family_tasks, found.demonstrations):
        typed = [token for token, m in zip(demo.ids, demo.mask) if m]
        trajectory = Trajectory(task=task.name)
        async with AsyncTerminalEnv(task, OPTIONS) as env:
            instruction, info = await env.reset()
            # The replaying double implements only what an episode calls of a Sampler.
            replay = cast(Sampler, ReplaySampler(typed))
            step = await run_policy_episode(env, instruction, info, replay, renderer, SETTINGS, None, trajectory)
        (sample,) = trajectory.samples
        assert sample.ids == demo.ids and sample.loss_mask == demo.mask
        assert trajectory.commands == list(demo.commands) and trajectory.stop_reason == "submitted"
        assert step is not None and step[4]["resolved"]  # the policy that types the demonstration solves it


async def test_only_resolved_reference_episodes_become_demonstrations(family_tasks, tiny_policy, no_leaks):
    records = []
    broken = {family_tasks[0].name}
    renderer = make_renderer("chatml", tiny_policy[1])

    def commands(task):
        return ["true"] if task.name in broken else reference_commands(task.path)

    found = await collect_demonstrations(family_tasks, commands, OPTIONS, renderer, SETTINGS, on_record=records.append)
    assert len(records) == len(family_tasks)  # every trial reported, the failed one included
    assert [d.task for d in found.demonstrations] == [t.name for t in family_tasks[1:]]
    assert sorted(r.resolved for r in records) == [False] + [True] * (len(family_tasks) - 1)


def demonstration_rows(renderer, settings, instruction: str, commands: list[str]):
    """A reference episode through the loop on a scripted env whose commands print nothing (what
    the families' references print): its segments and the teacher."""
    client = TeacherClient(
        renderer, reference_replies(renderer, settings, commands), settings.max_context, settings.observation_tokens
    )
    env = FakeEnv([""], max_turns=len(commands) + 1)
    asyncio.run(ModelAgent(client, settings.loop).run(env, instruction, {"workdir": "/app"}))  # pyright: ignore[reportArgumentType]
    return env.transcript, client


def test_a_reference_beyond_the_budgets_is_reported(tiny_policy):
    renderer = make_renderer("chatml", tiny_policy[1])
    long = ["cp /app/stespib/bandus.txt /app/stespib/kelcamhehe.txt"]
    reply = len(reference_replies(renderer, SETTINGS, long)[0])
    transcript, client = demonstration_rows(renderer, SETTINGS, "Copy it.", long)
    assert transcript.stop_reason == "submitted" and client.backend and not client.backend.overlong
    short_turn = RolloutSettings(replace(SETTINGS.loop, max_tokens=reply - 1), 512, 64)
    _, cut = demonstration_rows(renderer, short_turn, "Copy it.", long)
    assert cut.backend is not None and cut.backend.overlong == [reply]
    (segment,) = [s for s in transcript.segments if any(s.mask)]
    short_context = RolloutSettings(SETTINGS.loop, len(segment.ids) - 1, 64)
    exhausted, _ = demonstration_rows(renderer, short_context, "Copy it.", long)
    assert exhausted.stop_reason == "context_exhausted"


@pytest.mark.parametrize("name", ["tiny", "tiny-long"])
def test_the_pool_presets_budgets_fit_every_reference_of_their_pools(name, tmp_path, tiny_policy):
    """The main job's (and the recipe's) turn and context budgets can reproduce the reference of
    every task it trains on (a command cut at max_new_tokens would make its task impossible), with
    observations as the families' references return them (empty)."""
    from termgym.trainer.config import PRESETS, Config
    from termgym.trainer.rollout import rollout_settings

    preset = PRESETS[name]
    settings = rollout_settings(Config(**preset))
    renderer = make_renderer("chatml", tiny_policy[1])
    for path in generate_split(tmp_path, "train", preset["pool"], seed=0, family_set=preset.get("families", "short")):
        commands = list(reference_commands(path))
        transcript, client = demonstration_rows(renderer, settings, (path / "instruction.md").read_text(), commands)
        assert client.backend is not None and not client.backend.overlong, path.name
        assert transcript.stop_reason == "submitted" and len(transcript.segments) == 1, path.name


def _rows(tokenizer, commands_per_row):
    renderer = make_renderer("chatml", tokenizer)
    rows = []
    for i, commands in enumerate(commands_per_row):
        transcript, _ = demonstration_rows(renderer, SETTINGS, f"Task {i}.", list(commands))
        (segment,) = transcript.segments
        rows.append((segment.ids, segment.mask))
    return rows


def test_supervised_training_learns_the_demonstrations_deterministically(tiny_policy):
    policy, tokenizer = tiny_policy
    rows = _rows(tokenizer, [(f"mkdir /app/d{i}",) for i in range(4)])
    runs = []
    for _ in range(2):
        model = copy.deepcopy(policy)
        torch.manual_seed(0)
        runs.append(
            supervised_train(model, rows, steps=30, batch_size=2, lr=1e-2, seed=5, pad_id=tokenizer.pad_token_id)
        )
    assert runs[0] == runs[1]
    assert runs[0][-1] < runs[0][0] * 0.5
    assert not model.training  # left in eval mode for sampling


def test_supervised_training_without_demonstrations_is_one_clear_error(tiny_policy):
    with pytest.raises(TrainingError, match="no demonstrations"):
        supervised_train(tiny_policy[0], [], steps=1, batch_size=1, lr=1e-3, seed=0)


def test_length_sorted_forwards_give_the_one_forward_loss_and_gradient(tiny_policy):
    from termgym.trainer.batch import pad_batch
    from termgym.trainer.sft import accumulate_supervised_loss, supervised_loss

    policy, tokenizer = tiny_policy
    model = copy.deepcopy(policy)
    commands = ("mkdir /app/a", "echo word > /app/a/longer-name.txt", "cp /app/x.txt /app/y.txt", "true")
    rows = _rows(tokenizer, [commands[: i + 1] for i in range(4)])
    assert len({len(ids) for ids, _ in rows}) == 4  # different lengths: padding differs between the ways

    def gradients() -> list[torch.Tensor]:
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        return grads

    reference = supervised_loss(model, *pad_batch(rows, tokenizer.pad_token_id))
    reference.backward()
    expected = gradients()
    for rows_per_forward in (1, 3, 4):
        loss = accumulate_supervised_loss(model, rows, tokenizer.pad_token_id, rows_per_forward)
        assert loss == pytest.approx(reference.item(), rel=1e-5)
        for got, want in zip(gradients(), expected, strict=True):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)
