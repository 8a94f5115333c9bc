"""Batches: token sequences right-padded into tensors, a step's trajectories as the PPO update's
tensors, and the forward passes over them (log-probs of the predicted tokens, the critic's values)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TypedDict

import torch

from termgym.errors import TrainingError

from . import losses
from .routing import NOT_RECORDED, ROUTING_DTYPE
from .trajectory import Trajectory


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
    """A step's trajectories as the PPO update's tensors (``make_batch``): one row per sample."""

    ids: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    rollout_logp: torch.Tensor
    rewards: torch.Tensor
    weights: torch.Tensor
    routing: torch.Tensor | None
    episode_rewards: torch.Tensor
    groups: list[str]
    row_episode: torch.Tensor


def nothing_to_train(trajectories: Sequence[Trajectory], max_context: int | None = None) -> str:
    """Why ``trajectories``, none of which sampled anything, leave nothing to train on, in one
    line: when every episode ended for want of context before its first reply, the length of the
    prompt against the limit (``max_context``); else how the episodes ended."""
    if not trajectories:
        return "no trajectory sampled anything: there is nothing to train on"
    if all(t.context_exhausted and t.replies == 0 for t in trajectories):
        shortest, longest = min(t.prompt_tokens for t in trajectories), max(t.prompt_tokens for t in trajectories)
        prompt = f"{shortest} tokens" if shortest == longest else f"{shortest} to {longest} tokens"
        limit = "the context limit" if max_context is None else f"--max-context {max_context}"
        return (
            f"every episode ({len(trajectories)}) ended before its first reply (context_exhausted): the prompt is "
            f"{prompt}, and {limit} leaves no room for a reply; give a larger --max-context"
        )
    ended = Counter(t.stop_reason or "no stop reason" for t in trajectories)
    how = ", ".join(f"{reason} {count}" for reason, count in sorted(ended.items()))
    return f"no trajectory sampled anything (stop reasons: {how}): there is nothing to train on"


def make_batch(
    trajectories: Sequence[Trajectory], weights: Sequence[float], pad_id: int, *, max_context: int | None = None
) -> Batch:
    """Right-padded tensors, one row per sample (segment) of every trajectory. Per-token arrays have
    ``T - 1`` columns, aligned with the *predicted* token ``ids[:, 1:]``: ``mask`` (1 on sampled
    tokens), ``rollout_logp``, ``rewards`` (the episode's reward on each sample's last sampled
    token: every segment carries the episode's reward), ``weights`` (the scheduler's per-trial
    weight, on each of its rows). ``routing`` is aligned with ``ids`` (``[rows, T, layers, top_k]``,
    -1 where not recorded and on padding), or None when any sample has none. ``episode_rewards``
    and ``groups`` (task names) have one entry per trajectory; ``row_episode`` maps each row to its
    trajectory. With no sample at all, a ``TrainingError`` says why (``nothing_to_train``, against
    ``max_context``, the episodes' context limit)."""
    rows = [(sample, episode) for episode, t in enumerate(trajectories) for sample in t.samples]
    if not rows:
        raise TrainingError(nothing_to_train(trajectories, max_context))
    ids, attention, mask = pad_batch([(s.ids, s.loss_mask) for s, _ in rows], pad_id)
    n, width = ids.shape
    rollout_logp, rewards = torch.zeros((n, width)), torch.zeros((n, width))
    for row, (s, episode) in enumerate(rows):
        rollout_logp[row, : len(s.ids)] = torch.tensor(s.logprobs, dtype=torch.float32)
        sampled = [i for i, m in enumerate(s.loss_mask) if m]
        if sampled:
            rewards[row, sampled[-1]] = trajectories[episode].reward
    routing: torch.Tensor | None = None
    recorded = [s.routing for s, _ in rows if s.routing is not None]
    if len(recorded) == len(rows):
        routing = torch.full((n, width, *recorded[0].shape[1:]), NOT_RECORDED, dtype=ROUTING_DTYPE)
        for row, ((s, _), s_routing) in enumerate(zip(rows, recorded)):
            routing[row, : len(s.ids)] = s_routing
    return {
        "ids": ids,
        "attention": attention,
        "mask": mask,
        "rollout_logp": rollout_logp[:, 1:],
        "rewards": rewards[:, 1:],
        "weights": torch.tensor([float(weights[episode]) for _, episode in rows], dtype=torch.float32),
        "routing": routing,
        "episode_rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "groups": [t.task for t in trajectories],
        "row_episode": torch.tensor([episode for _, episode in rows], dtype=torch.long),
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
