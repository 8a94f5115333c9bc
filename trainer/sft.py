"""The supervised warm start: reference-solution episodes of the training pool, run in real
sandboxes through the model agent's episode loop, then teacher-forced cross-entropy on the tokens
the policy would have typed.

A demonstration is the episode a policy that typed the reference commands would have had: the
``TeacherClient`` (``trainer/policy_client.py``) replies with each command as the renderer's
canonical ids of that reply in the run's action format (then the submit), and everything else (the
prompt, the observations the sandbox really returned, the bridges) comes from the same loop and
renderer as a rollout. The loss covers only the replies (mask 1, close tokens included), never the
prompt or the observations, so supervised training and PPO train the same positions.

Guarantees: a demonstration's ids are what a rollout whose policy sampled those replies would hold
(``tests/trainer/test_sft.py``); by default only episodes the verifier resolved in one segment
become demonstrations, so a broken reference never teaches (``resolved_only=False`` keeps every
submitted one-segment episode: a scripted teacher's, mistakes included, as a distilled model's
trajectories are unfiltered); a reference the rollout's budgets could not
reproduce (a reply longer than ``max_new_tokens``, an episode beyond the context) is reported in
``DemonstrationSet.problems``; ``supervised_train`` is deterministic in its seed on CPU.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from termgym.agents.actions import Command, Submit, action_message
from termgym.agents.renderers import Renderer
from termgym.env import AsyncTerminalEnv, EnvOptions
from termgym.errors import TrainingError
from termgym.records import TrialRecord
from termgym.tasks import Task
from termgym.trial import StepReturn, run_trials

from . import losses
from .batch import forward_logp, pad_batch
from .policy_client import TeacherClient
from .rollout import RolloutSettings, run_client_episode


@dataclass(frozen=True)
class Demonstration:
    """One reference episode as training rows: its ids and the mask of what the policy types."""

    task: str
    commands: tuple[str, ...]
    ids: list[int]
    mask: list[int]


@dataclass
class DemonstrationSet:
    demonstrations: list[Demonstration] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # references the budgets cannot reproduce


def reference_replies(renderer: Renderer, settings: RolloutSettings, commands: Sequence[str]) -> list[list[int]]:
    """Pure: the canonical ids of each reply of a reference episode: every command, then the submit."""
    if settings.harness is not None:  # the harness calls its bash tool, and submits by a command
        typed = [*commands, settings.harness.submit_command]
        return [renderer.render_assistant(action_message("tool", Command(c))) for c in typed]
    fmt = settings.loop.action_format
    actions = [*(Command(c) for c in commands), Submit()]
    return [renderer.render_assistant(action_message(fmt, action)) for action in actions]


@dataclass
class _ReferenceAgent:
    """The model agent's loop with the teacher as its model."""

    task: str
    commands: tuple[str, ...]
    client: TeacherClient
    settings: RolloutSettings
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    segments: int = 0
    stop_reason: str | None = None
    name: str = "reference"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        try:
            return await run_client_episode(env, instruction, info, self.client, self.settings, self.name)
        finally:
            transcript = env.transcript
            self.stop_reason = transcript.stop_reason
            sampled = [s for s in transcript.segments if any(s.mask)]
            self.segments = len(sampled)
            if sampled:
                self.ids, self.mask = list(sampled[0].ids), list(sampled[0].mask)

    def problem(self) -> str | None:
        """Why the rollout's budgets could not reproduce this reference, or None."""
        backend = self.client.backend
        if backend is not None and backend.overlong:
            return (
                f"a reference reply of {self.task} needs {backend.overlong[0]} tokens, more than "
                f"--max-new-tokens {self.settings.loop.max_tokens}"
            )
        if self.stop_reason == "context_exhausted" or self.segments > 1:
            return f"the reference episode of {self.task} does not fit --max-context {self.settings.max_context}"
        return None


async def collect_demonstrations(
    tasks: Sequence[Task],
    commands: Callable[[Task], Sequence[str]],
    options: EnvOptions,
    renderer: Renderer,
    settings: RolloutSettings,
    *,
    concurrency: int = 4,
    on_record: Callable[[TrialRecord], None] | None = None,
    resolved_only: bool = True,
) -> DemonstrationSet:
    """One reference episode per task (``commands(task)``: its reference commands), in task order;
    only resolved episodes become demonstrations, or with ``resolved_only=False`` every episode
    that submitted. Every trial's record goes to ``on_record``."""
    jobs = []
    for task in tasks:
        typed = tuple(commands(task))
        replies = reference_replies(renderer, settings, typed)
        client = TeacherClient(renderer, replies, settings.max_context, settings.observation_tokens)
        jobs.append((task, _ReferenceAgent(task.name, typed, client, settings)))
    records = await run_trials(
        jobs,
        options,
        concurrency=max(1, concurrency),
        on_record=(lambda record, _agent: on_record(record)) if on_record is not None else None,
    )
    result = DemonstrationSet()
    for (_, agent), record in zip(jobs, records):
        if (problem := agent.problem()) is not None:
            result.problems.append(problem)
        elif (record.resolved or not resolved_only) and agent.stop_reason == "submitted" and agent.segments == 1:
            result.demonstrations.append(Demonstration(agent.task, agent.commands, agent.ids, agent.mask))
    return result


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


def supervised_steps(
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
) -> Iterator[float]:
    """``steps`` AdamW steps on minibatches drawn without replacement (reshuffled every pass) from
    ``rows``, with a linear warm-up over the first tenth, yielding each step's loss as it is taken
    (the policy in training mode meanwhile; a caller that stops early has the policy of the last
    step yielded). Each minibatch runs as ``accumulate_supervised_loss`` forwards of
    ``rows_per_forward`` rows."""
    if not rows:
        raise TrainingError("no demonstrations to train on (did every reference episode fail?)")
    order_rng = random.Random(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    order: list[int] = []
    for _ in range(steps):
        policy.train()
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
        yield loss


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
    """Every step of ``supervised_steps``, ``on_step(step, loss)`` after each; returns the loss of
    every step, the policy left in evaluation mode."""
    losses = []
    training = supervised_steps(
        policy,
        rows,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        pad_id=pad_id,
        max_grad_norm=max_grad_norm,
        rows_per_forward=rows_per_forward,
    )
    for step, loss in enumerate(training):
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss)
    policy.eval()
    return losses
