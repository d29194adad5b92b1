"""LMPPO's pure functions (algorithms/ppo/objective.py) against hand-computed values."""

from __future__ import annotations

import pytest
import torch as th

from algorithms.common.losses import kl_k3
from algorithms.common.rollout.rows import returns_to_go
from algorithms.ppo import objective

MASK = th.tensor([[True, True, True], [True, True, False]])


def test_gae_matches_the_hand_computed_example() -> None:
    # row 0: r = [0, 0, 1], V = [0.5, 0.6, 0.8]; row 1: r = [0, 2], V = [1.0, 0.5] and a padding column
    rewards = th.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    values = th.tensor([[0.5, 0.6, 0.8], [1.0, 0.5, 9.9]])
    advantages, returns = objective.gae(rewards, values, MASK, gamma=0.9, gae_lambda=0.5)
    # delta_2 = 1 - 0.8 = 0.2; delta_1 = 0.9 * 0.8 - 0.6 = 0.12; delta_0 = 0.9 * 0.6 - 0.5 = 0.04
    # A_2 = 0.2; A_1 = 0.12 + 0.45 * 0.2 = 0.21; A_0 = 0.04 + 0.45 * 0.21 = 0.1345
    # row 1: delta_1 = 2 - 0.5 = 1.5 (V after the last token is 0); delta_0 = 0.9 * 0.5 - 1 = -0.55;
    # A_0 = -0.55 + 0.45 * 1.5 = 0.125; the padding column gets 0 whatever it holds
    expected = th.tensor([[0.1345, 0.21, 0.2], [0.125, 1.5, 0.0]])
    th.testing.assert_close(advantages, expected)
    th.testing.assert_close(returns, th.tensor([[0.6345, 0.81, 1.0], [1.125, 2.0, 0.0]]))


def test_gae_with_lambda_one_and_no_discount_is_the_return_minus_the_value() -> None:
    rewards = th.tensor([[0.1, -0.2, 1.0]])
    values = th.tensor([[0.3, 0.4, 0.5]])
    advantages, returns = objective.gae(rewards, values, th.ones(1, 3, dtype=th.bool), gamma=1.0, gae_lambda=1.0)
    th.testing.assert_close(returns, th.tensor([[0.9, 0.8, 1.0]]))  # Monte-Carlo returns to go
    th.testing.assert_close(advantages, returns - values)


def test_gae_rejects_out_of_range_gamma_and_lambda() -> None:
    with pytest.raises(ValueError, match="gae_lambda"):
        objective.gae(th.zeros(1, 2), th.zeros(1, 2), th.ones(1, 2, dtype=th.bool), 0.9, 1.5)


def test_token_rewards_put_the_score_on_the_last_token_and_the_kl_penalty_everywhere() -> None:
    kl = th.tensor([[0.1, -0.2, 0.3], [0.5, 0.5, 7.0]])
    rewards = objective.token_rewards(th.tensor([1.0, 2.0]), MASK, kl, kl_coef=0.1)
    th.testing.assert_close(rewards, th.tensor([[-0.01, 0.02, 0.97], [-0.05, 1.95, 0.0]]))
    plain = objective.token_rewards(th.tensor([1.0, 2.0]), MASK)
    th.testing.assert_close(plain, th.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]))
    with pytest.raises(ValueError, match="kl_coef"):
        objective.token_rewards(th.tensor([1.0, 2.0]), MASK, kl, kl_coef=-1.0)


def test_returns_to_go_over_turns() -> None:
    rewards = th.tensor([[1.0, 0.0, 2.0], [0.5, 9.0, 9.0]])
    played = th.tensor([[True, True, True], [True, False, False]])
    th.testing.assert_close(returns_to_go(rewards, 0.5, played), th.tensor([[1.5, 1.0, 2.0], [0.5, 0.0, 0.0]]))


def test_whiten_uses_the_valid_entries_only() -> None:
    values = th.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = th.tensor([[True, True], [True, False]])
    scale = (2 / 3) ** 0.5  # the population std of 1, 2, 3
    th.testing.assert_close(objective.whiten(values, mask), th.tensor([[-1 / scale, 0.0], [1 / scale, 0.0]]))


def test_clipped_value_loss_by_hand() -> None:
    values, old = th.tensor([[0.5, 1.2]]), th.tensor([[0.2, 0.9]])
    returns, mask = th.tensor([[0.0, 1.5]]), th.ones(1, 2, dtype=th.bool)
    # token 0: (0.5 - 0)^2 = 0.25, clipped V = 0.2 + 0.2 = 0.4 -> 0.16: max 0.25
    # token 1: (1.2 - 1.5)^2 = 0.09, clipped V = 0.9 + 0.2 = 1.1 -> 0.16: max 0.16 (the clipped one)
    loss, fraction = objective.clipped_value_loss(values, old, returns, mask, 0.2)
    th.testing.assert_close(loss, th.tensor(0.5 * (0.25 + 0.16) / 2))
    th.testing.assert_close(fraction, th.tensor(0.5))
    unclipped, _ = objective.clipped_value_loss(values, old, returns, mask, None)
    th.testing.assert_close(unclipped, th.tensor(0.5 * (0.25 + 0.09) / 2))


def test_ppo_loss_on_policy_is_minus_the_mean_advantage_plus_the_value_term() -> None:
    logp = th.log(th.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    advantages = th.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 99.0]])
    values, returns = th.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]), th.zeros(2, 3)
    loss, stats = objective.ppo_loss(
        logp, logp, advantages, values, values, returns, MASK, clip_range=0.2, clip_range_vf=0.2, vf_coef=0.1
    )
    policy = -(1.0 - 2.0 + 0.5 + 3.0 + 1.0) / 5  # token mean over the 5 valid tokens; padding ignored
    value = 0.5 * (0 + 1 + 0 + 1 + 1) / 5
    th.testing.assert_close(stats["policy_loss"], th.tensor(policy))
    th.testing.assert_close(stats["value_loss"], th.tensor(value))
    th.testing.assert_close(loss, th.tensor(policy + 0.1 * value))
    assert stats["approx_kl"] == 0 and stats["clip_fraction"] == 0


def test_kl_in_the_loss_adds_kl_coef_times_the_mean_k3() -> None:
    logp = th.log(th.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    ref = th.log(th.tensor([[0.4, 0.5, 0.8], [0.2, 0.1, 0.3]]))
    args = (logp, logp, th.ones(2, 3), th.zeros(2, 3), th.zeros(2, 3), th.zeros(2, 3), MASK)
    settings = {"clip_range": 0.2, "clip_range_vf": None, "vf_coef": 0.5}
    without, _ = objective.ppo_loss(*args, **settings)
    with_kl, stats = objective.ppo_loss(*args, **settings, ref_logp=ref, kl_coef=0.3)
    k3 = kl_k3(logp, ref)[MASK].mean()
    th.testing.assert_close(stats["kl"], k3)
    th.testing.assert_close(with_kl - without, 0.3 * k3)
