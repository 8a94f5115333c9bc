"""Hand-computed tables for the pure PPO functions (trainer/losses.py)."""

from __future__ import annotations

import math

import pytest
import torch

from termgym.trainer import losses

T = torch.tensor

# One episode of two turns: action tokens at 0-1 (turn 1) and 4 (turn 2); 2-3 are observation tokens
# whose (absurd) values must be ignored; the reward sits on the last action token.
MASK = [1.0, 1.0, 0.0, 0.0, 1.0]
REWARDS = [0.0, 0.0, 0.0, 0.0, 1.0]
VALUES = [0.5, 0.6, 9.0, -9.0, 0.8]

GAE_CASES = [
    # (gamma, lam, advantages, returns), worked by hand:
    # gamma=lam=1: t4 d=1-0.8=0.2; t1 d=0.8-0.6=0.2, A=0.4; t0 d=0.6-0.5=0.1, A=0.5; R = 1 everywhere.
    (1.0, 1.0, [0.5, 0.4, 0.0, 0.0, 0.2], [1.0, 1.0, 0.0, 0.0, 1.0]),
    # lam=0.5: t1 A=0.2+0.5*0.2=0.3; t0 A=0.1+0.5*0.3=0.25.
    (1.0, 0.5, [0.25, 0.3, 0.0, 0.0, 0.2], [0.75, 0.9, 0.0, 0.0, 1.0]),
    # gamma=0.5: t1 d=0.5*0.8-0.6=-0.2, A=-0.2+0.5*0.2=-0.1; t0 d=0.5*0.6-0.5=-0.2, A=-0.2-0.05=-0.25;
    # the returns are the discounted reward over action tokens only: 0.5^2, 0.5^1, 1.
    (0.5, 1.0, [-0.25, -0.1, 0.0, 0.0, 0.2], [0.25, 0.5, 0.0, 0.0, 1.0]),
    # lam=0: one-step TD errors.
    (1.0, 0.0, [0.1, 0.2, 0.0, 0.0, 0.2], [0.6, 0.8, 0.0, 0.0, 1.0]),
]


@pytest.mark.parametrize(("gamma", "lam", "advantages", "returns"), GAE_CASES)
def test_masked_gae_skips_observation_tokens(gamma, lam, advantages, returns):
    adv, ret = losses.masked_gae(T([REWARDS]), T([VALUES]), T([MASK]), gamma, lam)
    assert torch.allclose(adv, T([advantages]), atol=1e-6)
    assert torch.allclose(ret, T([returns]), atol=1e-6)


def test_masked_gae_rows_are_independent_and_padding_is_inert():
    rewards = T([[*REWARDS, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    values = T([[*VALUES, 5.0, 5.0], [1.0, 1.5, 7.0, 7.0, 7.0, 7.0, 7.0]])
    mask = T([[*MASK, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    adv, ret = losses.masked_gae(rewards, values, mask)
    assert torch.allclose(adv[0], T([0.5, 0.4, 0.0, 0.0, 0.2, 0.0, 0.0]), atol=1e-6)
    # row 2: t1 d=2-1.5=0.5; t0 d=1.5-1=0.5, A=1.0; returns 2, 2.
    assert torch.allclose(adv[1], T([1.0, 0.5, 0, 0, 0, 0, 0]), atol=1e-6)
    assert torch.allclose(ret[1], T([2.0, 2.0, 0, 0, 0, 0, 0]), atol=1e-6)


def test_masked_gae_rejects_a_reward_off_the_action_tokens():
    with pytest.raises(ValueError, match="masked-out"):
        losses.masked_gae(T([[0.0, 1.0]]), T([[0.0, 0.0]]), T([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="shapes"):
        losses.masked_gae(T([[0.0]]), T([[0.0, 0.0]]), T([[1.0, 0.0]]))


def test_whiten_over_the_mask_only():
    x, mask = T([[1.0, 3.0, 100.0]]), T([[1.0, 1.0, 0.0]])
    assert torch.allclose(losses.whiten(x, mask), T([[-1.0, 1.0, 0.0]]), atol=1e-4)


E_HALF = math.exp(0.5)
POLICY_CASES = [
    # (logp - old_logp, advantage, loss, clip fraction): ratio 1 gives -A; beyond 1 +/- 0.2 the
    # pessimistic (larger) term is taken.
    (0.0, 1.0, -1.0, 0.0),
    (0.5, 1.0, -1.2, 1.0),  # ratio e^0.5 = 1.65 > 1.2 with A > 0: clipped to -1.2
    (0.5, -1.0, E_HALF, 0.0),  # A < 0: the unclipped 1.65 is the larger loss
    (-0.5, 1.0, -math.exp(-0.5), 0.0),  # ratio 0.61 with A > 0: unclipped -0.61 is larger than -0.8
    (-0.5, -1.0, 0.8, 1.0),  # ratio 0.61 with A < 0: clipped to 0.8
]


@pytest.mark.parametrize(("delta", "advantage", "loss", "clip_fraction"), POLICY_CASES)
def test_clipped_policy_loss(delta, advantage, loss, clip_fraction):
    got, fraction = losses.policy_loss(
        T([[delta, 9.0]]), T([[0.0, 0.0]]), T([[advantage, 9.0]]), T([[1.0, 0.0]]), clip=0.2
    )
    assert float(got) == pytest.approx(loss, abs=1e-6)
    assert float(fraction) == pytest.approx(clip_fraction)


VALUE_CASES = [
    # (V, V_old, R, loss): 0.5 * max((V-R)^2, (V_old + clamp(V-V_old, +-0.5) - R)^2)
    (1.0, 0.0, 2.0, 0.5 * 2.25),  # clipped prediction 0.5 is further from 2: (1.5)^2
    (1.0, 0.0, 0.0, 0.5 * 1.0),  # unclipped is worse: 1^2
    (0.2, 0.0, 0.2, 0.0),
    (0.0, 1.0, 0.0, 0.5 * 0.25),  # clipped prediction 0.5: 0.5^2 > 0
]


@pytest.mark.parametrize(("value", "old", "ret", "loss"), VALUE_CASES)
def test_clipped_value_loss(value, old, ret, loss):
    got = losses.value_loss(T([[value, 5.0]]), T([[old, 0.0]]), T([[ret, 0.0]]), T([[1.0, 0.0]]), clip=0.5)
    assert float(got) == pytest.approx(loss, abs=1e-6)


EV_CASES = [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 1.0),
    ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], 0.0),
    ([1.0, 2.0, 3.0], [11.0, 12.0, 13.0], 1.0),  # a constant offset is invisible to variance
    ([1.0, 2.0, 3.0], [3.0, 2.0, 1.0], -3.0),  # Var(R-V) = 8/3, Var(R) = 2/3
]


@pytest.mark.parametrize(("returns", "values", "expected"), EV_CASES)
def test_explained_variance(returns, values, expected):
    mask = T([[1.0, 1.0, 1.0, 0.0]])
    got = losses.explained_variance(T([[*returns, 50.0]]), T([[*values, -50.0]]), mask)
    assert got == pytest.approx(expected, abs=1e-6)


def test_explained_variance_is_nan_without_return_variance():
    assert math.isnan(losses.explained_variance(T([[1.0, 1.0]]), T([[0.0, 2.0]]), T([[1.0, 1.0]])))
    # equal returns that float rounding made differ in the last bit: still no variance to explain
    assert math.isnan(
        losses.explained_variance(T([[0.05, 0.05 + 1e-9, 0.05]]), T([[0.0, 0.3, 0.1]]), T([[1.0, 1.0, 1.0]]))
    )


def test_token_logprobs_and_entropy():
    logits = T([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    assert torch.allclose(losses.token_logprobs(logits, torch.tensor([[1, 0]])), T([[math.log(0.5), math.log(0.75)]]))
    assert torch.allclose(losses.entropy_from_logits(logits)[0, 0], T(math.log(2.0)))


def test_kl_to_reference_is_zero_where_they_agree_and_estimates_the_kl_from_samples():
    same = torch.log(torch.tensor([0.2, 0.5]))
    assert torch.equal(losses.kl_to_reference(same, same), torch.zeros(2))
    assert bool((losses.kl_to_reference(same, same - 0.3) > 0).all()) and bool(
        (losses.kl_to_reference(same, same + 0.3) > 0).all()
    )
    # the token mean over samples of the policy approaches the exact KL(policy || reference)
    policy, reference = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.5, 0.3])
    exact = float((policy * (policy / reference).log()).sum())
    tokens = torch.multinomial(policy, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = float(losses.kl_to_reference(policy.log()[tokens], reference.log()[tokens]).mean())
    assert estimate == pytest.approx(exact, rel=0.02)


def test_leave_one_out_advantages_compare_each_episode_with_the_rest_of_its_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.25, 0.7])
    groups = ["a", "a", "a", "b", "b", "c"]
    advantages = losses.leave_one_out_advantages(rewards, groups)
    assert torch.allclose(advantages, torch.tensor([1.0, -0.5, -0.5, 0.25, -0.25, 0.0]))  # c is alone: 0


def test_scale_to_unit_keeps_zeros_and_signs():
    x = torch.tensor([[2.0, 2.0, 0.0], [0.0, -4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    y = losses.scale_to_unit(x, mask)
    assert abs(float(losses.masked_mean(y**2, mask)) - 1.0) < 1e-6
    assert y[0, 2] == 0 and y[1, 0] == 0 and y[1, 2] == 0 and y[1, 1] < 0 < y[0, 0]


LN2 = math.log(2.0)
APPROX_KL_CASES = [
    # (logp - old_logp per token, CleanRL's approx_kl: token mean of (ratio - 1) - log ratio)
    ([0.0, 0.0], 0.0),  # nothing moved
    ([LN2, 0.0], (1.0 - LN2) / 2),  # ratio 2: 1 - ln 2 = 0.307, averaged with a token that did not move
    ([-LN2, -LN2], LN2 - 0.5),  # ratio 1/2: -0.5 + ln 2 = 0.193 on both tokens
    ([LN2, -LN2], 0.5 * (1.0 - LN2) + 0.5 * (LN2 - 0.5)),  # moving up and down does not cancel: 0.25
]


@pytest.mark.parametrize(("deltas", "expected"), APPROX_KL_CASES)
def test_approx_kl_is_cleanrls_estimate_over_the_mask(deltas, expected):
    old = T([[-1.0, -2.0, -3.0]])
    logp = old + T([[*deltas, 5.0]])  # the third token is masked out: its absurd move must not count
    got = losses.approx_kl(logp, old, T([[1.0, 1.0, 0.0]]))
    assert float(got) == pytest.approx(expected, abs=1e-6)
    assert float(got) >= 0.0


def test_approx_kl_is_detached_and_estimates_kl_old_to_new_from_samples_of_old():
    logp = T([[0.3, -0.2]]).requires_grad_(True)
    assert not losses.approx_kl(logp, T([[0.0, 0.0]]), T([[1.0, 1.0]])).requires_grad
    old, new = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.5, 0.3])
    exact = float((old * (old / new).log()).sum())  # KL(old || new)
    tokens = torch.multinomial(old, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = float(losses.approx_kl(new.log()[tokens][None], old.log()[tokens][None], torch.ones(1, len(tokens))))
    assert estimate == pytest.approx(exact, rel=0.02)


EQUAL_SHARE_CASES = [
    # (episode rewards, their groups, share of groups with >= 2 episodes all of equal reward)
    ([1.0, 1.0, 0.0, 0.0], ["a", "a", "b", "b"], 1.0),  # a all passed, b all failed: both tell nothing
    ([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], 0.5),  # a differs; b is equal at 0.5
    ([1.0, 0.0, 0.3], ["a", "a", "b"], 0.0),  # b is alone: never counted as equal, but counted as a group
    ([0.2, 0.2, 0.2, 0.7], ["a", "b", "a", "b"], 0.5),  # groups need not be contiguous
    ([0.0, 0.0, 0.0, 0.0, 1.0], ["a", "a", "a", "b", "c"], 1 / 3),
    ([0.25], ["a"], 0.0),
    ([], [], 0.0),  # no group at all
]


@pytest.mark.parametrize(("rewards", "groups", "expected"), EQUAL_SHARE_CASES)
def test_equal_reward_share(rewards, groups, expected):
    assert losses.equal_reward_share(T(rewards), groups) == pytest.approx(expected)


def test_equal_reward_share_needs_one_group_per_reward():
    with pytest.raises(ValueError, match="3 rewards for 2 group names"):
        losses.equal_reward_share(T([0.0, 1.0, 1.0]), ["a", "a"])


def test_group_members_in_order_of_first_appearance():
    assert losses.group_members(["b", "a", "b", "c", "a"]) == [[0, 2], [1, 4], [3]]
