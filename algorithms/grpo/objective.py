"""GRPO's loss as a pure tensor function: tensors in, tensors out, no state, no I/O.

Shapes: ``K`` groups (prompts) of ``G`` completions each; ``B`` sequences (``K*G`` or a minibatch of them)
of ``T`` completion tokens. Masks are ``True`` on valid completion tokens and ``False`` on padding and after
EOS; masked positions never contribute to a value or a gradient, even when they hold NaN or inf. The terms
every policy-gradient method shares (surrogate, k3 KL, aggregation) are in :mod:`algorithms.common.losses`.

Where it sits in the data flow: the rollout's rewards ``(K, G)`` became advantages before
(:mod:`algorithms.grpo.advantages`, every formula of them); the update assembles its loss with :func:`grpo_loss`
(:mod:`algorithms.grpo.update`).

Sources: GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), Eq. 3; DAPO, Yu et al. 2025
(arXiv 2503.14476), clip-higher and the token-level loss; Dr. GRPO, Liu et al. 2025 (arXiv 2503.20783), a constant
normaliser.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algorithms.common.losses import (
    IMPORTANCE_LEVELS,
    aggregate,
    check_shape,
    clipped_surrogate,
    gspo_token_log_ratio,
    kl_k3,
)
from grpo_gym.validation import check_choice


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float | None = None,
    beta: float = 0.0,
    ent_coef: float = 0.0,
    entropy: Tensor | None = None,
    aggregation: str = "sequence",
    max_tokens: int | None = None,
    importance_level: str = "token",
    sampler_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO loss ``aggregate(-w min(ratio A, clip(ratio) A) + beta * k3 - ent_coef * H)``.

    DeepSeekMath Eq. 3 (the KL sits in the loss, not the reward), with DAPO clip-higher and the
    aggregation modes of :func:`aggregate`. Inputs at masked positions are replaced by 0 before any
    arithmetic, so garbage there reaches neither the loss nor the gradient.

    :param logp: log-probs of the taken tokens under the current policy, shape ``(B, T)``
    :param old_logp: the same under the sampling policy, shape ``(B, T)``
    :param ref_logp: the same under the reference model, ``(B, T)``, or ``None`` (needs ``beta == 0``)
    :param advantages: shape ``(B,)`` (or ``(B, T)``)
    :param mask: ``True`` on valid completion tokens, shape ``(B, T)``
    :param clip_low: lower clip epsilon (0.2)
    :param clip_high: upper clip epsilon (DAPO: 0.28); ``None`` means ``clip_low``
    :param beta: KL coefficient, ``>= 0``
    :param ent_coef: entropy bonus coefficient (needs ``entropy`` when non-zero)
    :param entropy: per-token policy entropy ``(B, T)``, or ``None``
    :param aggregation: ``"sequence"``, ``"token"`` or ``"constant"``
    :param max_tokens: the constant of ``"constant"`` aggregation
    :param importance_level: ``"token"`` (GRPO: one ratio per token) or ``"sequence"`` (GSPO, Zheng et al. 2025:
        the sequence's length-normalised ratio ``s_i`` at every token, in GSPO-token form, see
        :func:`~algorithms.common.losses.gspo_token_log_ratio`; with ``"sequence"`` aggregation this is GSPO's
        objective exactly). ``clip_low``/``clip_high`` then clip ``s_i`` (GSPO uses 3e-4 / 4e-4)
    :param sampler_weights: per-token weights ``w`` of the surrogate ``(B, T)``, the sampler correction
        (:func:`~algorithms.common.losses.truncated_importance_weights`); ``None``: 1 (``old_logp`` is then the
        sampler's own)
    :return: the scalar loss and detached scalar stats: ``policy_loss`` (aggregated like the loss),
        and, as means over valid tokens, ``kl`` (k3 to the reference; 0 when ``beta == 0`` or no
        reference), ``entropy`` (only when ``entropy`` is given), ``clip_fraction`` (with ``"sequence"``: the
        fraction of sequences clipped) and ``approx_kl`` (``(r - 1) - log r`` of the token ratios ``r``: drift
        from the sampling policy, as SB3's PPO logs it)
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0 (a negative KL weight pushes away from the reference), got {beta}.")
    if beta > 0 and ref_logp is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logp (reference log-probs); pass them or set beta=0.")
    if ent_coef != 0 and entropy is None:
        raise ValueError(
            f"ent_coef={ent_coef} needs entropy (policy.log_probs(..., with_entropy=True)); or set ent_coef=0."
        )
    check_choice("importance_level", importance_level, IMPORTANCE_LEVELS)
    check_shape("mask", mask, logp.shape)
    mask = mask.bool()
    logp, old_logp = torch.where(mask, logp, 0.0), torch.where(mask, old_logp, 0.0)  # (B, T)
    if importance_level == "sequence":  # GSPO: clip s_i, the same value at every token of sequence i
        log_ratio = gspo_token_log_ratio(logp, old_logp, mask)  # (B, T)
        zero = torch.zeros_like(log_ratio)  # (B, T): the ratio is exp(log_ratio - 0)
        policy_loss, _, clipped = clipped_surrogate(log_ratio, zero, advantages, clip_low, clip_high)  # (B, T)
        clipped = clipped & mask.any(dim=-1, keepdim=True)  # (B, T): one flag per sequence, repeated
        clip_fraction = clipped[:, 0].to(logp.dtype).sum() / mask.any(dim=-1).sum().clamp(min=1)
    else:
        policy_loss, _, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)  # (B, T)
        clip_fraction = aggregate(clipped.to(logp.dtype), mask, "token")
    ratio = torch.exp(logp - old_logp)  # (B, T): the token ratios, for approx_kl
    if sampler_weights is not None:
        check_shape("sampler_weights", sampler_weights, logp.shape)
        policy_loss = policy_loss * torch.where(mask, sampler_weights, 0.0)  # (B, T)
    per_token = policy_loss  # (B, T)
    stats = {"kl": logp.new_zeros(())}
    if beta > 0:
        kl = kl_k3(logp, torch.where(mask, ref_logp, 0.0))  # (B, T)
        per_token = per_token + beta * kl  # (B, T)
        stats["kl"] = aggregate(kl, mask, "token").detach()
    if entropy is not None:
        entropy = torch.where(mask, entropy, 0.0)  # (B, T)
        per_token = per_token - ent_coef * entropy  # (B, T)
        stats["entropy"] = aggregate(entropy, mask, "token").detach()
    loss = aggregate(per_token, mask, aggregation, max_tokens)
    stats["policy_loss"] = aggregate(policy_loss, mask, aggregation, max_tokens).detach()
    stats["clip_fraction"] = clip_fraction.detach()
    stats["approx_kl"] = aggregate((ratio - 1) - (logp - old_logp), mask, "token").detach()
    return loss, stats
