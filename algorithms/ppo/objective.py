"""PPO's pieces for language models as pure tensor functions: token rewards, GAE, whitening, the clipped value
loss and the assembled loss. Tensors in, tensors out, no state, no I/O.

Shapes: ``B`` completions of ``T`` tokens; masks are ``True`` on valid completion tokens (a prefix of each row:
completions are right-padded) and ``False`` on padding; masked positions never reach a value or a gradient.
Token ``t`` of a completion is action ``a_t`` taken in state ``s_t = prompt + completion[:t]``; ``values[:, t]`` is
``V(s_t)``, read from the hidden state at the position that predicts token ``t``. The episode ends after the last
valid token (the value after it is 0).

The KL to the frozen reference is, by default, a per-token reward penalty (InstructGPT, Ouyang et al. 2022,
arXiv 2203.02155; Ziegler et al. 2019): ``r_t = -kl_coef * (log pi_old(a_t|s_t) - log pi_ref(a_t|s_t))`` plus the
env's reward at the last token. GAE: Schulman et al. 2016 (arXiv 1506.02438). The surrogate, the k3 KL and the
aggregation are shared with GRPO (:mod:`algorithms.common.losses`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.common.losses import aggregate, check_shape, clipped_surrogate, kl_k3


def token_rewards(scores: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards: ``-kl_coef * kl_t`` at every valid token, plus the completion's score at its last one.

    :param scores: the env's reward of each completion, shape ``(B,)``
    :param mask: shape ``(B, T)``
    :param kl: the per-token KL estimate to the reference, ``log pi_old - log pi_ref`` (k1), shape ``(B, T)``, or
        ``None`` (no penalty)
    :param kl_coef: the penalty's weight, ``>= 0``
    :return: shape ``(B, T)``, 0 on padding (a row without a valid token drops its score)
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (a negative weight rewards leaving the reference), got {kl_coef}")
    mask = mask.bool()
    check_shape("scores", scores, mask.shape[:1])
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)  # (B, T)
    if kl is not None and kl_coef > 0:
        check_shape("kl", kl, mask.shape)
        rewards = torch.where(mask, -kl_coef * kl.to(rewards.dtype), 0.0)  # (B, T)
    lengths = mask.sum(dim=1)  # (B,)
    rows = (lengths > 0).nonzero().squeeze(1)
    rewards[rows, lengths[rows] - 1] += scores[rows]
    return rewards


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, gae_lambda: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over each completion's tokens.

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` (``V = 0`` after the last valid token),
    ``A_t = delta_t + gamma * lambda * A_{t+1}``, and the value target ``R_t = A_t + V(s_t)``.

    :param rewards: per-token rewards (:func:`token_rewards`), shape ``(B, T)``
    :param values: ``V(s_t)`` at sampling time, shape ``(B, T)``
    :param mask: shape ``(B, T)``
    :param gamma: discount per token in ``[0, 1]``
    :param gae_lambda: GAE's lambda in ``[0, 1]`` (1: Monte-Carlo returns minus V; 0: one-step TD)
    :return: advantages and returns, both ``(B, T)``, 0 on padding
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= gae_lambda <= 1.0):
        raise ValueError(f"gamma and gae_lambda must be in [0, 1], got {gamma} and {gae_lambda}.")
    check_shape("values", values, rewards.shape)
    check_shape("mask", mask, rewards.shape)
    valid = mask.to(rewards.dtype)  # (B, T)
    rewards, values = rewards * valid, torch.where(mask.bool(), values, 0.0).to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    next_value = next_advantage = rewards.new_zeros(rewards.shape[0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        advantages[:, t] = (delta + gamma * gae_lambda * next_advantage) * valid[:, t]
        next_value, next_advantage = values[:, t], advantages[:, t]  # 0 beyond a row's last valid token
    return advantages, (advantages + values) * valid


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(values - mean) / (std + eps)`` over the valid entries (SB3's ``normalize_advantage``), 0 on padding.

    The std is the population one; fewer than two valid entries: centred only.

    :param values: shape ``(B, T)``
    :param mask: shape ``(B, T)``
    """
    check_shape("mask", mask, values.shape)
    mask = mask.bool()
    picked = values[mask]  # (N,)
    if picked.numel() == 0:
        return torch.zeros_like(values)
    centred = values - picked.mean()
    if picked.numel() > 1:
        centred = centred / (picked.std(unbiased=False) + eps)
    return torch.where(mask, centred, 0.0)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_range_vf: float | None
) -> tuple[Tensor, Tensor]:
    """The value loss ``0.5 * mean_t max((V - R)^2, (V_clip - R)^2)``, ``V_clip = V_old + clip(V - V_old, -c, c)``
    (OpenAI baselines' PPO2, TRL's PPO), over the valid tokens; ``clip_range_vf=None``: ``0.5 * mean (V - R)^2``.

    :param values: the value head's current estimates, shape ``(B, T)``
    :param old_values: its estimates at sampling time, shape ``(B, T)``
    :param returns: GAE's value targets, shape ``(B, T)``
    :param mask: shape ``(B, T)``
    :param clip_range_vf: ``c``, or ``None``
    :return: the scalar loss and the fraction of valid tokens where the clipped term was the larger one
    """
    check_shape("old_values", old_values, values.shape)
    check_shape("returns", returns, values.shape)
    mask = mask.bool()
    values = torch.where(mask, values, 0.0)
    unclipped = (values - returns) ** 2  # (B, T)
    if clip_range_vf is None:
        return 0.5 * aggregate(unclipped, mask, "token"), values.new_zeros(())
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf)  # (B, T)
    clipped = (clipped_values - returns) ** 2  # (B, T)
    loss = 0.5 * aggregate(torch.maximum(unclipped, clipped), mask, "token")
    return loss, aggregate((clipped > unclipped).to(values.dtype), mask, "token").detach()


def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float,
    clip_range_vf: float | None,
    vf_coef: float,
    ent_coef: float = 0.0,
    entropy: Tensor | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    sampler_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``mean_t[-min(ratio A, clip(ratio) A)] + vf_coef * value_loss - ent_coef * H (+ kl_coef * k3)``, token means.

    The KL term is there only when ``ref_logp`` is given (``kl_placement="loss"``: GRPO's k3 in the loss instead
    of the reward penalty).

    :param logp: log-probs of the taken tokens under the current policy, ``(B, T)``
    :param old_logp: the same at sampling time, ``(B, T)``
    :param advantages: per-token advantages, ``(B, T)``
    :param values: current value estimates ``(B, T)``; ``old_values``, ``returns``: see :func:`clipped_value_loss`
    :param mask: ``(B, T)``
    :param clip_range: the ratio's clip epsilon
    :param clip_range_vf: the value clip, or ``None``
    :param vf_coef: the value loss's weight
    :param ent_coef: the entropy bonus's weight (needs ``entropy`` when non-zero)
    :param entropy: per-token entropy ``(B, T)`` or ``None``
    :param ref_logp: the reference's log-probs ``(B, T)`` for a KL term in the loss, or ``None``
    :param kl_coef: that term's weight
    :param sampler_weights: per-token weights of the surrogate ``(B, T)``, the sampler correction
        (:func:`~algorithms.common.sampler_correction.truncated_importance_weights`), or ``None``: 1
    :return: the loss and detached stats: ``policy_loss``, ``value_loss``, ``clip_fraction``, ``clip_fraction_vf``,
        ``approx_kl`` (``(ratio - 1) - log ratio``, SB3's), and ``entropy``, ``kl`` when computed
    """
    if ent_coef != 0 and entropy is None:
        raise ValueError(f"ent_coef={ent_coef} needs entropy; or set ent_coef=0.")
    check_shape("mask", mask, logp.shape)
    mask = mask.bool()
    logp, old_logp = torch.where(mask, logp, 0.0), torch.where(mask, old_logp, 0.0)  # (B, T)
    surrogate, ratio, clipped = clipped_surrogate(logp, old_logp, torch.where(mask, advantages, 0.0), clip_range)
    if sampler_weights is not None:
        check_shape("sampler_weights", sampler_weights, logp.shape)
        surrogate = surrogate * torch.where(mask, sampler_weights, 0.0)  # (B, T)
    policy_loss = aggregate(surrogate, mask, "token")
    value_loss, clip_fraction_vf = clipped_value_loss(values, old_values, returns, mask, clip_range_vf)
    loss = policy_loss + vf_coef * value_loss
    stats = {
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "clip_fraction": aggregate(clipped.to(logp.dtype), mask, "token").detach(),
        "clip_fraction_vf": clip_fraction_vf,
        "approx_kl": aggregate((ratio - 1) - (logp - old_logp), mask, "token").detach(),
    }
    if entropy is not None:
        mean_entropy = aggregate(entropy, mask, "token")
        loss = loss - ent_coef * mean_entropy
        stats["entropy"] = mean_entropy.detach()
    if ref_logp is not None:
        kl = aggregate(kl_k3(logp, torch.where(mask, ref_logp, 0.0)), mask, "token")
        loss = loss + kl_coef * kl
        stats["kl"] = kl.detach()
    return loss, stats
