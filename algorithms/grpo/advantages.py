"""GRPO's advantages, every formula of them: group-relative (:func:`group_advantages`, scaled per group, per
batch or not at all), leave-one-out (:func:`leave_one_out_advantages`, RLOO) or against the value baseline
(:func:`value_baseline`), the choice among them (:func:`relative_advantages`), the groups with no signal
(:func:`uniform_group_mask`) and which groups an update leaves out (:func:`left_out_groups`). Pure functions over
tensors, but for :func:`value_baseline` (the value head's estimate); the original design's competition and diversity
guard, which change the advantages, are in :mod:`algorithms.grpo.controls`.

Where it sits in the data flow: after the rollout, the episodes' returns ``(K, G)`` (all ranks' groups) come
here; :class:`~algorithms.grpo.grpo.GRPO` keeps the rows of the groups that are not left out, with their
advantages, in the :class:`~algorithms.common.rollout.batch.RolloutBatch` the update trains on
(loss: :mod:`algorithms.grpo.objective`).

Sources: GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), §4.1.2; Dr. GRPO, Liu et al. 2025 (arXiv
2503.20783), no std scaling; RLOO, Ahmadian et al. 2024 (arXiv 2402.14740).
"""

from __future__ import annotations

import torch
import torch as th
from torch import Tensor

from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import left_pad
from algorithms.common.rollout.rows import Rows
from grpo_gym.validation import check_choice

ADVANTAGE_SCALES = ("group", "batch", "none")


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (K, G), got {tuple(rewards.shape)}.")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; score unscorable completions explicitly (e.g. 0).")


def uniform_group_mask(rewards: Tensor, atol: float = 0.0) -> Tensor:
    """Groups whose rewards are all equal (within ``atol``): their advantages are zero, no signal.

    Used for DAPO's dynamic sampling (drop such groups) and to log ``rollout/frac_uniform_groups``.
    A group of one completion is uniform.

    :param rewards: rewards, shape ``(K, G)``
    :param atol: largest ``max - min`` spread still counted as uniform
    :return: boolean mask, shape ``(K,)``
    """
    _check_rewards(rewards)
    spread = rewards.amax(dim=1) - rewards.amin(dim=1)  # (K,)
    return spread <= atol


def group_advantages(rewards: Tensor, scale: str = "group", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages ``A = (r - mean_group(r)) / (std + eps)`` (DeepSeekMath §4.1.2).

    ``scale="group"`` divides by each group's std (GRPO); ``"batch"`` by the std of all ``K*G`` rewards
    (Lite PPO, TRL ``scale_rewards="batch"``); ``"none"`` does not divide (Dr. GRPO). The std is the
    unbiased (Bessel-corrected) one, as in TRL. A group whose rewards are all equal, including a group of
    one (G=1), gets exactly zero advantages, never NaN.

    :param rewards: rewards, shape ``(K, G)``: row k holds the G completions of prompt k
    :param scale: ``"group"``, ``"batch"`` or ``"none"``
    :param eps: added to the std before dividing
    :return: advantages, shape ``(K, G)``
    """
    check_choice("scale", scale, ADVANTAGE_SCALES)
    _check_rewards(rewards)
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    if rewards.shape[1] < 2 or rewards.numel() == 0:  # the std of one value is NaN: no signal anyway
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (K, G)
    if scale == "group":
        advantages = centred / (rewards.std(dim=1, keepdim=True) + eps)  # (K, G) / (K, 1)
    elif scale == "batch":
        advantages = centred / (rewards.std() + eps)  # (K, G) / ()
    else:
        advantages = centred  # (K, G): Dr. GRPO
    uniform = uniform_group_mask(rewards).unsqueeze(1)  # (K, 1): the mean can be 1 ulp off r, force 0
    return torch.where(uniform, 0.0, advantages)  # (K, G)


def leave_one_out_advantages(rewards: Tensor) -> Tensor:
    """RLOO's advantages ``A_i = r_i - mean_{j != i} r_j`` (Kool et al. 2019; Ahmadian et al. 2024, arXiv
    2402.14740): each completion's baseline is the mean reward of the other ``G - 1`` of its group, so the
    baseline does not depend on the completion it scores. Equal to ``G / (G - 1) * (r_i - mean_group(r))``; not
    divided by a std. A group whose rewards are all equal gets exactly zero advantages.

    :param rewards: rewards, shape ``(K, G)`` with ``G >= 2``
    :return: advantages, shape ``(K, G)``
    """
    _check_rewards(rewards)
    group = rewards.shape[1]
    if group < 2:
        raise ValueError(f"leave-one-out advantages need at least 2 completions per group, got G={group}.")
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (group - 1)  # (K, G)
    uniform = uniform_group_mask(rewards).unsqueeze(1)  # (K, 1)
    return torch.where(uniform, 0.0, rewards - others_mean)  # (K, G)


def relative_advantages(
    returns: Tensor, scale: str = "group", baseline: Tensor | None = None, leave_one_out: bool = False
) -> Tensor:
    """``(K, G)`` advantages: ``returns - baseline`` (the value baseline, ``(K, G)``) when a baseline is given,
    RLOO's when ``leave_one_out`` (:func:`leave_one_out_advantages`, not scaled), else
    GRPO's group-relative ones (:func:`group_advantages`, scaled by ``scale``)."""
    if leave_one_out:
        return leave_one_out_advantages(returns)  # (K, G)
    if baseline is not None:
        return returns - baseline  # (K, G)
    return group_advantages(returns, scale=scale)  # (K, G)


TURN_CREDITS = ("episode", "reward_to_go")
"""The values of GRPO's ``turn_credit``: what each model turn of a multi-turn episode trains on."""


def turn_weights(returns: Tensor, scale: str = "group", relative: bool = True, eps: float = 1e-4) -> Tensor:
    """``(K,)`` the weight ``w_g`` of a return difference in each group's advantages (per-turn credit,
    :func:`turn_advantages`): ``1 / (std_g + eps)`` for GRPO's ``scale="group"`` (0 for a group whose returns are all
    equal, whose advantages are 0: no signal, and no division by a vanishing std), ``1 / (std + eps)`` of the
    rollout for ``"batch"`` (0 when every return is equal), 1 for ``"none"`` and when not ``relative`` (RLOO, the
    value baseline: not divided); 0 for groups of one under a relative scale (their advantages are 0)."""
    _check_rewards(returns)
    k, g = returns.shape
    returns = returns if returns.is_floating_point() else returns.to(torch.get_default_dtype())
    if not relative or scale == "none":
        return returns.new_ones(k)
    if g < 2:
        return returns.new_zeros(k)
    if scale == "group":
        return torch.where(uniform_group_mask(returns), 0.0, 1.0 / (returns.std(dim=1) + eps))  # (K,)
    if bool(returns.amax() == returns.amin()):
        return returns.new_zeros(k)
    return (1.0 / (returns.std() + eps)).expand(k).clone()  # (K,)


def turn_advantages(
    episode_advantages: Tensor, episode_returns: Tensor, row_returns: Tensor, row_episodes: Tensor, weights: Tensor
) -> Tensor:
    """``(N,)`` per-turn advantages (``turn_credit="reward_to_go"``): row ``n`` (turn ``t`` of episode ``i``) gets
    ``A_{i,t} = A_i + w_i (G_{i,t} - G_{i,0})``, i.e. with GRPO's group-relative ``A_i = (G_{i,0} - mean_g) / s_g``::

        A_{i,t} = (G_{i,t} - mean_{j in g} G_{j,0}) / s_g

    ``G_{i,t}`` the discounted reward-to-go from turn ``t`` (:func:`~algorithms.common.rollout.rows.turn_returns`),
    ``mean_g`` and ``s_g`` the baseline and scale of the episode's group computed on the episode returns
    ``G_{j,0}`` exactly as for ``turn_credit="episode"`` (RLOO: the others' mean, no scale; the value baseline: the
    value head's estimate), and ``w_i`` the weight of the episode's group (:func:`turn_weights`: ``1 / s_g``, 0 for
    a group without signal) times the competition's coefficient. The episode-level baseline is one number per
    group, not a mean over the episodes that reached turn ``t`` (whose presence there depends on their own earlier
    turns); with only a final reward and ``gamma = 1`` every ``G_{i,t}`` equals ``G_{i,0}`` and this is the episode
    credit exactly.

    :param episode_advantages: ``(E,)`` the episodes' advantages ``A_i``
    :param episode_returns: ``(E,)`` the returns ``G_{i,0}`` (from the same computation as ``row_returns``)
    :param row_returns: ``(N,)`` each row's ``G_{i,t}``
    :param row_episodes: ``(N,)`` each row's episode
    :param weights: ``(E,)`` each episode's ``w_i``
    """
    offset = row_returns - episode_returns[row_episodes]  # (N,)
    return episode_advantages[row_episodes] + weights[row_episodes] * offset  # (N,)


def value_baseline(policy: TransformerPolicy, rows: Rows, group_size: int) -> Tensor:
    """The value baseline: ``(K_local, G)`` the value head's estimate of each episode's first prompt (a group
    shares its prompt)."""
    first = rows.first_turns()
    ids, mask = left_pad([rows.contexts[i] for i in first], policy.pad_token_id)
    with th.no_grad():
        values = policy.predict_values(ids.to(policy.device), mask.to(policy.device)).cpu()  # (E,)
    episodes = th.as_tensor([rows.episodes[i] for i in first])
    return th.zeros(len(episodes)).index_copy_(0, episodes, values).view(-1, group_size)  # (K_local, G)


def left_out_groups(uniform: Tensor, drop_uniform: bool, diversity: Tensor | None = None) -> Tensor:
    """``(K,)`` groups the update leaves out: the uniform ones when ``drop_uniform`` (DAPO's fix), and those the
    diversity guard names; when that would be every group, none (a zero-advantage update, not no update)."""
    dropped = uniform if drop_uniform else th.zeros_like(uniform)  # (K,)
    if diversity is not None:
        dropped = dropped | diversity
    if bool(dropped.all()):
        dropped = th.zeros_like(dropped)
    return dropped
