"""The advantage formulas every algorithm may share, pure functions over a rollout's ``(K, G)`` rewards (K problems,
G completions each): group-relative (:func:`group_advantages`: GRPO, Dr. GRPO), leave-one-out
(:func:`leave_one_out_advantages`: RLOO) and the groups that carry no signal (:func:`uniform_group_mask`).

Sources: GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), §4.1.2; Dr. GRPO, Liu et al. 2025 (arXiv
2503.20783), no std scaling; RLOO, Kool et al. 2019 and Ahmadian et al. 2024 (arXiv 2402.14740).
"""

from __future__ import annotations

import torch as th
from torch import Tensor

from grpo_gym.validation import check_choice

#: how :func:`group_advantages` scales: by each group's std, the rollout's, or not at all
ADVANTAGE_SCALES = ("group", "batch", "none")


def check_rewards(rewards: Tensor) -> None:
    """``ValueError`` unless ``rewards`` is a ``(K, G)`` tensor of finite values."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (K, G), got {tuple(rewards.shape)}.")
    if not th.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; score unscorable completions explicitly (e.g. 0).")


def uniform_group_mask(rewards: Tensor, atol: float = 0.0) -> Tensor:
    """Groups whose rewards are all equal (within ``atol``): their advantages are zero, no signal.

    Used for DAPO's dynamic sampling (drop such groups) and to log ``rollout/frac_uniform_groups``.
    A group of one completion is uniform.

    :param rewards: rewards, shape ``(K, G)``
    :param atol: largest ``max - min`` spread still counted as uniform
    :return: boolean mask, shape ``(K,)``
    """
    check_rewards(rewards)
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
    check_rewards(rewards)
    dtype = rewards.dtype if rewards.is_floating_point() else th.get_default_dtype()
    if rewards.shape[1] < 2 or rewards.numel() == 0:  # the std of one value is NaN: no signal anyway
        return th.zeros_like(rewards, dtype=dtype)
    wide = rewards.double()  # (K, G): a float32 std of rewards near its range (3e38, -3e38) overflows to inf
    centred = wide - wide.mean(dim=1, keepdim=True)  # (K, G)
    if scale == "group":
        advantages = centred / (wide.std(dim=1, keepdim=True) + eps)  # (K, G) / (K, 1)
    elif scale == "batch":
        advantages = centred / (wide.std() + eps)  # (K, G) / ()
    else:
        advantages = centred  # (K, G): Dr. GRPO
    uniform = uniform_group_mask(rewards).unsqueeze(1)  # (K, 1): the mean can be 1 ulp off r, force 0
    return th.where(uniform, 0.0, advantages).to(dtype)  # (K, G)


def leave_one_out_advantages(rewards: Tensor) -> Tensor:
    """RLOO's advantages ``A_i = r_i - mean_{j != i} r_j`` (Kool et al. 2019; Ahmadian et al. 2024, arXiv
    2402.14740): each completion's baseline is the mean reward of the other ``G - 1`` of its group, so the
    baseline does not depend on the completion it scores. Equal to ``G / (G - 1) * (r_i - mean_group(r))``; not
    divided by a std. A group whose rewards are all equal gets exactly zero advantages.

    :param rewards: rewards, shape ``(K, G)`` with ``G >= 2``
    :return: advantages, shape ``(K, G)``
    """
    check_rewards(rewards)
    group = rewards.shape[1]
    if group < 2:
        raise ValueError(f"leave-one-out advantages need at least 2 completions per group, got G={group}.")
    dtype = rewards.dtype if rewards.is_floating_point() else th.get_default_dtype()
    wide = rewards.double()  # (K, G): a float32 sum of rewards near its range overflows
    others_mean = (wide.sum(dim=1, keepdim=True) - wide) / (group - 1)  # (K, G)
    uniform = uniform_group_mask(rewards).unsqueeze(1)  # (K, 1)
    return th.where(uniform, 0.0, wide - others_mean).to(dtype)  # (K, G)
