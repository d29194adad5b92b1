"""The shared update step leaves out the rows that carry no gradient (a uniform group's zero advantages), when GRPO's
loss has no KL, entropy or value term: the gradient is the one of the whole minibatch, for every loss aggregation."""

from __future__ import annotations

import dataclasses

import pytest
import torch as th

import grpo_gym
from algorithms import GRPO
from algorithms.common.rollout.batch import RolloutBatch, loss_share, rows_with_gradient
from algorithms.grpo import update
from tests.sizes import ENV_KWARGS, TINY


@pytest.fixture(scope="module")
def rollout() -> tuple[GRPO, RolloutBatch]:
    """A model and one real rollout of 4 groups x 4 completions, groups 0 and 2 made uniform (zero advantages)."""
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    model = GRPO("TransformerPolicy", env, n_groups=4, group_size=4, cold_start=False, policy_kwargs=TINY, seed=0)
    model.learn(16)
    batch = model._rollout
    assert batch is not None and len(batch) == 16
    advantages = th.linspace(-1.5, 1.5, len(batch))
    advantages[(batch.groups == 0) | (batch.groups == 2)] = 0.0
    return model, dataclasses.replace(batch, advantages=advantages)


def gradient(model: GRPO, batch: RolloutBatch, settings: update.LossSettings, skip: bool) -> th.Tensor:
    """The flat gradient of the minibatch's loss, with or without leaving out the rows that carry none."""
    policy = model.policy
    ran = rows_with_gradient(batch) if skip else batch
    loss, _, _ = update.minibatch_loss(policy, ran, settings)
    policy.optimizer.zero_grad(set_to_none=True)
    (loss * loss_share(ran, batch, settings.aggregation)).backward()
    return th.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
def test_rows_without_gradient_are_left_out_and_the_gradient_is_the_same(rollout, aggregation: str) -> None:
    model, batch = rollout
    settings = update.LossSettings(0.2, 0.2, ent_coef=0.0, beta=0.0, aggregation=aggregation, vf_coef=0.5)
    assert update.prunable(settings, value_head=False)
    ran = rows_with_gradient(batch)
    assert len(ran) == 8 and bool((ran.advantages != 0).all())  # groups 1 and 3
    whole, left_out = gradient(model, batch, settings, skip=False), gradient(model, batch, settings, skip=True)
    assert whole.abs().max() > 0
    th.testing.assert_close(left_out, whole, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("ent_coef", "beta", "value_head"), [(0.01, 0.0, False), (0.0, 0.04, False), (0.0, 0.0, True)])
def test_every_row_runs_when_a_term_reads_it(ent_coef: float, beta: float, value_head: bool) -> None:
    """An entropy bonus, a KL term or a value head give a zero-advantage row a gradient: nothing is left out."""
    settings = update.LossSettings(0.2, 0.2, ent_coef=ent_coef, beta=beta, aggregation="sequence", vf_coef=0.5)
    assert not update.prunable(settings, value_head)


def test_a_minibatch_of_uniform_groups_keeps_one_row_and_a_zero_gradient(rollout) -> None:
    """The optimizer still steps on it (weight decay and Adam's moments move as without the shortcut)."""
    model, batch = rollout
    uniform = dataclasses.replace(batch, advantages=th.zeros(len(batch)))
    settings = update.LossSettings(0.2, 0.2, ent_coef=0.0, beta=0.0, aggregation="token", vf_coef=0.5)
    ran = rows_with_gradient(uniform)
    assert len(ran) == 1
    assert gradient(model, uniform, settings, skip=True).abs().max() == 0


def test_replayed_rows_count_by_their_weighted_advantage(rollout) -> None:
    """A row whose importance weight is zero carries no gradient either; a zero-advantage fresh row stays out."""
    _, batch = rollout
    weights = th.ones(len(batch))
    weights[batch.groups == 1] = 0.0
    ran = rows_with_gradient(dataclasses.replace(batch, weights=weights))
    assert th.unique(ran.groups).tolist() == [3]
