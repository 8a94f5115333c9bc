"""PPO's arithmetic as pure tensor functions: masked GAE, whitening, clipped losses, diagnostics.

Conventions shared by every function: tensors are ``[batch, time]``; ``mask`` is 1.0 on action
(sampled) tokens and 0.0 elsewhere (prompt, observation, framing, padding); position ``t`` of
``values`` is the critic's estimate before action token ``t`` is emitted. No function reads or
writes anything but its arguments; none changes its inputs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0.0 when the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over action tokens only.

    Positions where ``mask`` is 0 are skipped as if absent: the last action token of one turn
    bootstraps from the value of the first action token of the next turn (the observation tokens
    in between carry no reward and no value of their own). After the last action token the episode
    is over: the bootstrap value is 0. Returns ``(advantages, returns)``, both 0 where the mask is
    0; ``returns = advantages + values`` on action tokens. Rewards at masked-out positions must be 0.
    """
    if rewards.shape != values.shape or values.shape != mask.shape:
        raise ValueError(
            f"shapes differ: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, mask {tuple(mask.shape)}"
        )
    if bool(((rewards != 0) & (mask == 0)).any()):
        raise ValueError("a reward sits on a masked-out position; put it on an action token")
    batch, time = rewards.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(batch, dtype=values.dtype)
    running = torch.zeros(batch, dtype=values.dtype)
    for t in reversed(range(time)):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        running = torch.where(on, candidate, running)
        next_value = torch.where(on, values[:, t], next_value)
        advantages[:, t] = torch.where(on, candidate, torch.zeros_like(candidate))
    returns = (advantages + values) * mask
    return advantages, returns


def group_members(groups: Sequence[Hashable]) -> list[list[int]]:
    """The indices of each group's members, groups in order of first appearance."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    return list(members.values())


def leave_one_out_advantages(rewards: torch.Tensor, groups: Sequence[Hashable]) -> torch.Tensor:
    """Per-episode advantage without a critic (RLOO): each episode's reward minus the mean reward of
    the *other* episodes of its group (the same task in the same batch). An episode alone in its
    group gets 0: there is nothing to compare it with. ``rewards`` is ``[episodes]``."""
    advantages = torch.zeros_like(rewards)
    for indices in group_members(groups):
        if len(indices) > 1:
            r = rewards[indices]
            advantages[indices] = r - (r.sum() - r) / (len(indices) - 1)
    return advantages


def equal_reward_share(rewards: torch.Tensor, groups: Sequence[Hashable]) -> float:
    """The share of the groups (episodes of the same task in the batch) that hold at least 2
    episodes, all with exactly the same reward: groups that tell a group baseline nothing (every
    episode of the task passed, or every one failed). Counted over all groups, singletons included
    (a singleton never counts as equal); 0.0 when there is no group. ``rewards`` is ``[episodes]``,
    one group name per episode."""
    if len(groups) != rewards.shape[0]:
        raise ValueError(f"{rewards.shape[0]} rewards for {len(groups)} group names")
    members = group_members(groups)
    equal = sum(1 for indices in members if len(indices) > 1 and bool((rewards[indices] == rewards[indices[0]]).all()))
    return equal / len(members) if members else 0.0


def scale_to_unit(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``x`` divided by its root mean square over the mask (not shifted: a zero stays zero); 0
    elsewhere."""
    return x * torch.rsqrt(masked_mean(x**2, mask) + eps) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``x`` shifted and scaled to mean 0 and (population) variance 1 over the mask; 0 elsewhere."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (symmetric clip), token mean over the mask. Returns ``(loss,
    clip_fraction)``: the fraction of masked tokens whose clipped term was the one taken."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    clip_fraction = masked_mean((clipped > unclipped).float(), mask)
    return loss, clip_fraction.detach()


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """CleanRL's ``approx_kl``: the token mean over the mask of ``(ratio - 1) - log(ratio)``, with
    ``log(ratio) = logp - old_logp``: the "k3" estimate of KL(old || new) from tokens the old policy
    sampled (never negative, 0 exactly where the two agree). How far an update has moved the policy
    on its own batch; detached (a diagnostic, never a loss)."""
    logratio = (logp - old_logp).detach()
    return masked_mean(torch.expm1(logratio) - logratio, mask)


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the log-probs of tokens the policy
    sampled: ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (the "k3" estimator: never negative,
    0 exactly where the two agree, and unbiased when the tokens are drawn from the policy)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float = 0.5
) -> torch.Tensor:
    """Clipped value loss: 0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2),
    token mean over the mask."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the mask: 1 is perfect, 0 is as good as predicting the mean,
    negative is worse. NaN when the returns have no variance (equal returns everywhere, up to float
    rounding: a variance below 1e-12 of their mean square)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    if float(var_returns) <= 1e-12 * max(float(masked_mean(returns**2, mask)), 1e-30):
        return float("nan")
    return float(1.0 - var_residual / var_returns)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` (last dimension)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] at every position, in float32."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
