"""The supervised warm start: reference-solution trajectories of the training pool, recorded in
real sandboxes, then teacher-forced cross-entropy on the policy's own turns.

A demonstration is what the policy would have produced had it typed the reference commands: the
same chat prompt, each command's tokens and ``<|im_end|>``, the observation the sandbox really
returned (framed exactly as ``trainer/rollout.py`` frames it), and ``<|submit|>`` at the end. The
loss covers only what the policy types (commands, end-of-turn and submit tokens), never the prompt
or the observations, so supervised training and PPO train the same positions.

Guarantees: ``demonstration_tokens`` is pure and agrees token for token with the rollout framing
(``tests/trainer/test_sft.py``); ``collect_demonstrations`` keeps only demonstrations whose episode
the verifier resolved, so a broken reference never teaches; ``supervised_train`` is deterministic
in its seed on CPU.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions
from termgym.errors import TrainingError
from termgym.records import TrialRecord
from termgym.tasks import Task
from termgym.trainer import losses
from termgym.trainer.batch import forward_logp, pad_batch
from termgym.trainer.chat import ChatFormat
from termgym.trial import Step, run_trials


@dataclass(frozen=True)
class Demonstration:
    """One reference episode: the commands typed and what the sandbox answered to each."""

    task: str
    instruction: str
    commands: tuple[str, ...]
    observations: tuple[str, ...]


def demonstration_tokens(chat: ChatFormat, demo: Demonstration, observation_tokens: int) -> tuple[list[int], list[int]]:
    """``(ids, loss_mask)`` of ``demo`` in the rollout's framing; the mask is 1 on the tokens the
    policy types: each command, its ``<|im_end|>``, and the final ``<|submit|>``."""
    ids = chat.prompt(demo.instruction)
    mask = [0] * len(ids)
    for command, observation in zip(demo.commands, demo.observations):
        typed = chat.text(command) + [chat.im_end]
        framed = chat.observation(observation, observation_tokens, closed=True)
        ids, mask = ids + typed + framed, mask + [1] * len(typed) + [0] * len(framed)
    return ids + [chat.submit], mask + [1]


def typed_runs(mask: Sequence[int]) -> list[int]:
    """Pure: the lengths of the runs of 1 in a demonstration's loss mask, in order: one per
    command (its tokens and ``<|im_end|>``), then the final ``<|submit|>``."""
    runs: list[int] = []
    previous = 0
    for bit in mask:
        if bit and previous:
            runs[-1] += 1
        elif bit:
            runs.append(1)
        previous = bit
    return runs


def budget_problem(
    demos: Sequence[Demonstration], rows: Sequence[tuple[list[int], list[int]]], max_new_tokens: int, max_context: int
) -> str | None:
    """Pure: why the rollout's budgets could not reproduce some demonstration (a command longer
    than ``max_new_tokens`` with its end-of-turn token, or an episode longer than ``max_context``),
    or None when every one fits. ``rows`` are the demonstrations' ``demonstration_tokens``. A task
    whose reference does not fit is one the policy can be taught but could never complete."""
    for demo, (ids, mask) in zip(demos, rows, strict=True):
        for command, needed in zip(demo.commands, typed_runs(mask)):
            if needed > max_new_tokens:
                return (
                    f"the reference command {command!r} ({demo.task}) needs {needed} tokens, more than "
                    f"--max-new-tokens {max_new_tokens}"
                )
        if len(ids) > max_context:
            return (
                f"the reference episode of {demo.task} needs {len(ids)} tokens, more than --max-context {max_context}"
            )
    return None


@dataclass
class _ReferenceAgent:
    """Types the reference commands one per turn, recording each observation, then submits."""

    commands: tuple[str, ...]
    observations: list[str] = field(default_factory=list)
    name: str = "reference"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        for command in self.commands:
            step = await env.step(command)
            self.observations.append(step[0])
            if env.done:
                return step
        return await env.step(SUBMIT)


async def collect_demonstrations(
    tasks: Sequence[Task],
    commands: Callable[[Task], Sequence[str]],
    options: EnvOptions,
    *,
    concurrency: int = 4,
    on_record: Callable[[TrialRecord], None] | None = None,
) -> list[Demonstration]:
    """One reference episode per task (``commands(task)``: its reference commands), in task order;
    only episodes the verifier resolved become demonstrations. Every trial's record goes to
    ``on_record``, resolved or not."""
    jobs = [(task, _ReferenceAgent(tuple(commands(task)))) for task in tasks]
    records = await run_trials(
        jobs,
        options,
        concurrency=max(1, concurrency),
        on_record=(lambda record, _agent: on_record(record)) if on_record is not None else None,
    )
    return [
        Demonstration(task.name, task.instruction, agent.commands, tuple(agent.observations))
        for (task, agent), record in zip(jobs, records)
        if record.resolved and len(agent.observations) == len(agent.commands)
    ]


def save_demonstrations(path: Path, demos: Sequence[Demonstration]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(d)) + "\n" for d in demos), encoding="utf-8")


def supervised_loss(policy, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the masked tokens (those the policy types)."""
    return -losses.masked_mean(forward_logp(policy, ids, attention)[0], mask)


def accumulate_supervised_loss(
    policy, batch: Sequence[tuple[list[int], list[int]]], pad_id: int, rows_per_forward: int
) -> float:
    """Back-propagate ``supervised_loss`` of ``batch`` (the mean over all its typed tokens) in
    forwards of at most ``rows_per_forward`` rows of similar length, so short rows are not padded
    to the longest of the batch; returns the loss. The gradient is the one-forward gradient, up to
    float rounding (about a third less compute on the main job's demonstrations)."""
    typed = sum(sum(mask) for _, mask in batch)
    by_length = sorted(batch, key=lambda row: len(row[0]))
    total = 0.0
    for start in range(0, len(by_length), rows_per_forward):
        ids, attention, mask = pad_batch(by_length[start : start + rows_per_forward], pad_id)
        part = -(forward_logp(policy, ids, attention)[0] * mask).sum() / max(typed, 1)
        part.backward()
        total += float(part.detach())
    return total


def supervised_train(
    policy,
    rows: Sequence[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int = 0,
    max_grad_norm: float = 1.0,
    rows_per_forward: int = 8,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """``steps`` AdamW steps on minibatches drawn without replacement (reshuffled every pass) from
    ``rows``, with a linear warm-up over the first tenth; returns the loss of every step. Each
    minibatch runs as ``accumulate_supervised_loss`` forwards of ``rows_per_forward`` rows."""
    if not rows:
        raise TrainingError("no demonstrations to train on (did every reference episode fail?)")
    order_rng = random.Random(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    policy.train()
    order: list[int] = []
    losses = []
    for step in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(rows)))
            order_rng.shuffle(fresh)
            order += fresh
        picked, order = order[:batch_size], order[batch_size:]
        optimizer.zero_grad()
        loss = accumulate_supervised_loss(policy, [rows[i] for i in picked], pad_id, max(1, rows_per_forward))
        torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        optimizer.step()
        schedule.step()
        losses.append(loss)
        if on_step is not None:
            on_step(step, losses[-1])
    policy.eval()
    return losses
