"""Batches: token sequences right-padded into tensors, a step's trajectories as the PPO update's
tensors, and the forward passes over them (log-probs of the predicted tokens, the critic's values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import torch

from termgym.trainer import losses
from termgym.trainer.routing import NOT_RECORDED, ROUTING_DTYPE

if TYPE_CHECKING:  # a type only: the rollout imports this module's padding through the sampler
    from termgym.trainer.rollout import Trajectory


def pad_ids(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``ids`` and their ``attention`` mask (1 on real tokens)."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
    return ids, attention


def pad_batch(
    rows: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``ids``, ``attention`` and the loss mask aligned with ``ids[:, 1:]``, for
    ``(ids, loss_mask)`` rows (the trainer's batches and the supervised warm start's)."""
    ids, attention = pad_ids([seq for seq, _ in rows], pad_id)
    mask = torch.zeros(ids.shape)
    for row, (_, loss_mask) in enumerate(rows):
        mask[row, : len(loss_mask)] = torch.tensor(loss_mask, dtype=torch.float32)
    return ids, attention, mask[:, 1:]


class Batch(TypedDict):
    """A step's trajectories as the PPO update's tensors (``make_batch``)."""

    ids: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    rollout_logp: torch.Tensor
    rewards: torch.Tensor
    weights: torch.Tensor
    routing: torch.Tensor | None
    episode_rewards: torch.Tensor
    groups: list[str]


def make_batch(trajectories: Sequence[Trajectory], weights: Sequence[float], pad_id: int) -> Batch:
    """Right-padded tensors. Per-token arrays have ``T - 1`` columns, aligned with the *predicted*
    token ``ids[:, 1:]``: ``mask`` (1 on sampled tokens), ``rollout_logp``, ``rewards`` (the
    episode's reward on its last sampled token), ``weights`` (the scheduler's per-trial weight).
    ``routing`` is aligned with ``ids`` (``[n, T, layers, top_k]``, -1 where not recorded and on
    padding), or None when any trajectory has none. ``episode_rewards`` and ``groups`` (task names)
    have one entry per trajectory."""
    ids, attention, mask = pad_batch([(t.ids, t.loss_mask) for t in trajectories], pad_id)
    n, width = ids.shape
    rollout_logp, rewards = torch.zeros((n, width)), torch.zeros((n, width))
    for row, t in enumerate(trajectories):
        rollout_logp[row, : len(t.ids)] = torch.tensor(t.logprobs, dtype=torch.float32)
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        if sampled:
            rewards[row, sampled[-1]] = t.reward
    routing: torch.Tensor | None = None
    recorded = [t.routing for t in trajectories if t.routing is not None]
    if trajectories and len(recorded) == len(trajectories):
        routing = torch.full((n, width, *recorded[0].shape[1:]), NOT_RECORDED, dtype=ROUTING_DTYPE)
        for row, (t, t_routing) in enumerate(zip(trajectories, recorded)):
            routing[row, : len(t.ids)] = t_routing
    return {
        "ids": ids,
        "attention": attention,
        "mask": mask,
        "rollout_logp": rollout_logp[:, 1:],
        "rewards": rewards[:, 1:],
        "weights": torch.tensor(list(weights), dtype=torch.float32),
        "routing": routing,
        "episode_rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "groups": [t.task for t in trajectories],
    }


def forward_logp(
    policy, ids: torch.Tensor, attention: torch.Tensor, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``ids[:, 1:]`` under ``policy``, and the per-position entropy if asked."""
    logits = policy(input_ids=ids, attention_mask=attention).logits[:, :-1]
    return losses.token_logprobs(logits, ids[:, 1:]), losses.entropy_from_logits(logits) if entropy else None


def forward_values(critic, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The critic's value of the state before each predicted token ``ids[:, 1:]``."""
    return critic(ids, attention)[:, :-1]
