"""The supervised warm start: demonstrations in the rollout's exact framing, recorded in real
sandboxes (only resolved ones kept), and a deterministic supervised loop that learns them."""

from __future__ import annotations

import copy
from typing import cast

import pytest
import torch

from termgym.env import AsyncTerminalEnv, EnvOptions
from termgym.envs.families import generate_split, reference_commands
from termgym.errors import TrainingError
from termgym.tasks import load_task
from termgym.trainer.chat import ChatFormat
from termgym.trainer.rollout import RolloutSettings, Trajectory, drive_episode
from termgym.trainer.sampler import Sampler, TokenSampler
from termgym.trainer.sft import (
    Demonstration,
    budget_problem,
    collect_demonstrations,
    demonstration_tokens,
    supervised_train,
    typed_runs,
)

OPTIONS = EnvOptions(backend="local", max_turns=4, command_timeout=5.0)


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
        return self.tokens.pop(0), 0.0


async def test_demonstration_tokens_equal_the_rollout_of_the_same_commands(family_tasks, tiny_policy, no_leaks):
    _, tokenizer = tiny_policy
    chat = ChatFormat(tokenizer)
    demos = await collect_demonstrations(family_tasks, lambda t: reference_commands(t.path), OPTIONS)
    assert len(demos) == len(family_tasks)
    for task, demo in zip(family_tasks, demos):
        ids, mask = demonstration_tokens(chat, demo, 64)
        typed = [token for token, m in zip(ids, mask) if m]
        trajectory = Trajectory(task=task.name)
        async with AsyncTerminalEnv(task, OPTIONS) as env:
            instruction, _ = await env.reset()
            # The replaying double implements only what drive_episode calls of a Sampler (generate_turn,
            # records_routing): it has no model to publish.
            replay = cast(Sampler, ReplaySampler(typed))
            step = await drive_episode(env, instruction, replay, chat, RolloutSettings(48, 512, 64), None, trajectory)
        assert trajectory.ids == ids and trajectory.loss_mask == mask
        assert trajectory.commands[:-1] == list(demo.commands)  # the last turn is the submit
        assert step is not None  # the episode stepped
        assert step[4]["resolved"]  # the policy that types the demonstration solves the task


async def test_only_resolved_reference_episodes_become_demonstrations(family_tasks, no_leaks):
    records = []
    broken = {family_tasks[0].name}

    def commands(task):
        return ["true"] if task.name in broken else reference_commands(task.path)

    demos = await collect_demonstrations(family_tasks, commands, OPTIONS, on_record=records.append)
    assert len(records) == len(family_tasks)  # every trial reported, the failed one included
    assert [d.task for d in demos] == [t.name for t in family_tasks[1:]]
    assert sorted(r.resolved for r in records) == [False] + [True] * (len(family_tasks) - 1)


def test_supervised_training_learns_the_demonstrations_deterministically(tiny_policy):
    policy, tokenizer = tiny_policy
    chat = ChatFormat(tokenizer)
    demos = [Demonstration(f"t{i}", f"Create the directory /app/d{i}.", (f"mkdir /app/d{i}",), ("",)) for i in range(4)]
    rows = [demonstration_tokens(chat, d, 64) for d in demos]
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


def test_budget_problem_names_a_demonstration_the_rollout_could_not_reproduce(tiny_policy):
    chat = ChatFormat(tiny_policy[1])
    short = Demonstration("short", "Create /app/a.", ("mkdir /app/a",), ("",))
    long = Demonstration("long", "Copy it.", ("cp /app/stespib/bandus.txt /app/stespib/kelcamhehe.txt",), ("",))
    turn = len(chat.text(long.commands[0])) + 1  # the command and its end-of-turn token
    rows = [demonstration_tokens(chat, demo, 64) for demo in (short, long)]
    episode = len(rows[1][0])
    assert typed_runs(rows[1][1]) == [turn, 1]  # the command, then the submit token
    assert budget_problem([short, long], rows, max_new_tokens=turn, max_context=episode) is None
    too_many_new = budget_problem([short, long], rows, max_new_tokens=turn - 1, max_context=episode)
    assert too_many_new is not None
    assert f"long) needs {turn} tokens, more than --max-new-tokens {turn - 1}" in too_many_new
    too_long = budget_problem([short, long], rows, max_new_tokens=turn, max_context=episode - 1)
    assert too_long is not None
    assert f"long needs {episode} tokens, more than --max-context {episode - 1}" in too_long


def test_the_tiny_preset_budgets_fit_every_reference_of_its_pool(tmp_path, tiny_policy):
    """The main job's turn and context budgets can reproduce the reference of every task it trains
    on (a command cut at max_new_tokens would make its task impossible); observations as the
    reference episodes of these families return them (empty)."""
    from termgym.trainer.config import PRESETS

    preset = PRESETS["tiny"]
    chat = ChatFormat(tiny_policy[1])
    paths = generate_split(tmp_path, "train", preset["pool"], seed=0)
    demos = [
        Demonstration(
            p.name, (p / "instruction.md").read_text(), tuple(reference_commands(p)), ("",) * len(reference_commands(p))
        )
        for p in paths
    ]
    rows = [demonstration_tokens(chat, demo, preset["observation_tokens"]) for demo in demos]
    assert budget_problem(demos, rows, preset["max_new_tokens"], preset["max_context"]) is None


def test_length_sorted_forwards_give_the_one_forward_loss_and_gradient(tiny_policy):
    from termgym.trainer.batch import pad_batch
    from termgym.trainer.sft import accumulate_supervised_loss, supervised_loss

    policy, tokenizer = tiny_policy
    model = copy.deepcopy(policy)
    chat = ChatFormat(tokenizer)
    commands = ("mkdir /app/a", "echo word > /app/a/longer-name.txt", "cp /app/x.txt /app/y.txt", "true")
    rows = [
        demonstration_tokens(chat, Demonstration(f"t{i}", f"Task {i}.", commands[: i + 1], ("",) * (i + 1)), 64)
        for i in range(4)
    ]
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
        assert loss == pytest.approx(float(reference), rel=1e-5)
        for got, want in zip(gradients(), expected, strict=True):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)
