"""GRPO's update: its loss (:func:`grpo_loss`, a pure tensor function), GRPO's loss function for the shared update
step (:func:`outputs_loss`: :func:`grpo_loss` on the policy's outputs, the sampler correction taken from the pass, the
value head's MSE; :func:`minibatch_loss` runs the forward pass first), whether zero-advantage rows may be left out
(:func:`prunable`) and the update's own logs (:func:`log_train`). The diagnostics' group-by-group backward:
:mod:`algorithms.grpo.diagnostics`.

Where it sits in the data flow: the rollout's rewards ``(K, G)`` became advantages before
(:mod:`algorithms.grpo.advantages`); :meth:`GRPO.train <algorithms.grpo.grpo.GRPO.train>` gives :func:`outputs_loss`
to the update step every algorithm shares (:meth:`~algorithms.common.base_class.LMBaseAlgorithm._update_policy`:
the minibatches, the policy's forward pass, the guarded optimizer step, the ``train/*`` logs).

The loss's shapes: ``B`` sequences (``K*G`` or a minibatch of them) of ``T`` completion tokens; masks are ``True`` on
valid completion tokens and ``False`` on padding and after EOS; masked positions never contribute to a value or a
gradient, even when they hold NaN or inf. The terms every policy-gradient method shares (surrogate, k3 KL,
aggregation) are in :mod:`algorithms.common.losses`. Sources: GRPO, Shao et al. 2024 (DeepSeekMath, arXiv
2402.03300), Eq. 3; DAPO, Yu et al. 2025 (arXiv 2503.14476), clip-higher and the token-level loss; Dr. GRPO, Liu et
al. 2025 (arXiv 2503.20783), a constant normaliser.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger

from algorithms.common import sampler_correction
from algorithms.common.losses import (
    IMPORTANCE_LEVELS,
    PolicyOutputs,
    aggregate,
    check_shape,
    clipped_surrogate,
    gspo_token_log_ratio,
    kl_k3,
)
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.grpo import controls
from grpo_gym.validation import check_choice


@dataclass(frozen=True)
class LossSettings:
    """The loss's coefficients at this update (schedules evaluated)."""

    clip_low: float
    clip_high: float
    ent_coef: float
    beta: float
    aggregation: str
    vf_coef: float
    importance_level: str = "token"


def prunable(settings: LossSettings, value_head: bool) -> bool:
    """Whether a row with a zero advantage adds exactly zero to the loss and its gradient (no KL, entropy or value
    term), so the update may leave it out (:func:`~algorithms.common.rollout.batch.rows_with_gradient`)."""
    return settings.beta == 0 and settings.ent_coef == 0 and not value_head


def minibatch_loss(
    policy: TransformerPolicy,
    minibatch: RolloutBatch,
    settings: LossSettings,
    correction: tuple[str, float] | None = None,
) -> tuple[th.Tensor, dict[str, th.Tensor], th.Tensor]:
    """:func:`outputs_loss` after the policy's forward pass on the minibatch; with the ``(B, C)`` log-probs under the
    current weights."""
    log_probs, entropy = policy.log_probs(
        minibatch.prompt_ids,
        minibatch.prompt_mask,
        minibatch.completion_ids,
        minibatch.completion_mask,
        with_entropy=settings.ent_coef != 0,
    )
    loss, stats = outputs_loss(policy, minibatch, PolicyOutputs(log_probs, entropy), settings, correction)
    return loss, stats, log_probs


def outputs_loss(
    policy: TransformerPolicy,
    minibatch: RolloutBatch,
    outputs: PolicyOutputs,
    settings: LossSettings,
    correction: tuple[str, float] | None = None,
) -> tuple[th.Tensor, dict[str, th.Tensor]]:
    """The GRPO loss of a minibatch from the policy's ``outputs`` on it (+ the value head's MSE to the return) and
    its stats: GRPO's loss function for the shared update step
    (:meth:`~algorithms.common.base_class.LMBaseAlgorithm._update_policy`).

    ``correction`` (``(mode, cap)``): the sampler correction taken from this forward pass, for an update that is one
    step on the whole fresh rollout (one epoch, one minibatch): ``pi_old`` is then the weights before that step, i.e.
    this pass's own log-probs, detached, and the extra pass of
    :func:`~algorithms.common.sampler_correction.correct_fresh_rollout` is not needed (TRL does the same when it
    generates for one step only)."""
    log_probs, entropy = outputs.log_probs, outputs.entropy
    corrected_stats = {}
    if correction is not None:
        mode, cap = correction
        sampled = minibatch.old_log_probs
        minibatch = sampler_correction.corrected(minibatch, log_probs.detach(), cap, mode)
        if mode == "tis":
            fraction = sampler_correction.truncated_fraction(
                minibatch.old_log_probs, sampled, minibatch.completion_mask, cap
            )
            corrected_stats["sampler_clipped_fraction"] = th.as_tensor(fraction)
        else:
            corrected_stats["sampler_masked_fraction"] = th.as_tensor(sampler_correction.masked_fraction(minibatch))
    advantages = minibatch.advantages if minibatch.weights is None else minibatch.advantages * minibatch.weights
    loss, stats = grpo_loss(
        log_probs,
        minibatch.old_log_probs,
        minibatch.ref_log_probs,
        advantages,  # (B,): replayed rows weighted by their importance-sampling weight
        minibatch.completion_mask,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        beta=settings.beta,
        ent_coef=settings.ent_coef,
        entropy=entropy,
        aggregation=settings.aggregation,
        max_tokens=policy.max_new_tokens,
        importance_level=settings.importance_level,
        sampler_weights=minibatch.sampler_weights,  # (B, C) the sampler correction, or None
    )
    if policy.value_net is not None:  # the value baseline: the FP32 value head learns the episode return
        values = policy.predict_values(minibatch.prompt_ids, minibatch.prompt_mask)  # (B,)
        stats["value_loss"] = th.nn.functional.mse_loss(values, minibatch.returns)
        loss = loss + settings.vf_coef * stats["value_loss"]
    return loss, {**stats, **corrected_stats}


def grpo_loss(
    logp: th.Tensor,
    old_logp: th.Tensor,
    ref_logp: th.Tensor | None,
    advantages: th.Tensor,
    mask: th.Tensor,
    *,
    clip_low: float,
    clip_high: float | None = None,
    beta: float = 0.0,
    ent_coef: float = 0.0,
    entropy: th.Tensor | None = None,
    aggregation: str = "sequence",
    max_tokens: int | None = None,
    importance_level: str = "token",
    sampler_weights: th.Tensor | None = None,
) -> tuple[th.Tensor, dict[str, th.Tensor]]:
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
        (:func:`~algorithms.common.sampler_correction.truncated_importance_weights`); ``None``: 1 (``old_logp`` is
        then the sampler's own)
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
    logp, old_logp = th.where(mask, logp, 0.0), th.where(mask, old_logp, 0.0)  # (B, T)
    if importance_level == "sequence":  # GSPO: clip s_i, the same value at every token of sequence i
        log_ratio = gspo_token_log_ratio(logp, old_logp, mask)  # (B, T)
        zero = th.zeros_like(log_ratio)  # (B, T): the ratio is exp(log_ratio - 0)
        policy_loss, _, clipped = clipped_surrogate(log_ratio, zero, advantages, clip_low, clip_high)  # (B, T)
        clipped = clipped & mask.any(dim=-1, keepdim=True)  # (B, T): one flag per sequence, repeated
        clip_fraction = clipped[:, 0].to(logp.dtype).sum() / mask.any(dim=-1).sum().clamp(min=1)
    else:
        policy_loss, _, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)  # (B, T)
        clip_fraction = aggregate(clipped.to(logp.dtype), mask, "token")
    ratio = th.exp(logp - old_logp)  # (B, T): the token ratios, for approx_kl
    if sampler_weights is not None:
        check_shape("sampler_weights", sampler_weights, logp.shape)
        policy_loss = policy_loss * th.where(mask, sampler_weights, 0.0)  # (B, T)
    per_token = policy_loss  # (B, T)
    stats = {"kl": logp.new_zeros(())}
    if beta > 0:
        kl = kl_k3(logp, th.where(mask, ref_logp, 0.0))  # (B, T)
        per_token = per_token + beta * kl  # (B, T)
        stats["kl"] = aggregate(kl, mask, "token").detach()
    if entropy is not None:
        entropy = th.where(mask, entropy, 0.0)  # (B, T)
        per_token = per_token - ent_coef * entropy  # (B, T)
        stats["entropy"] = aggregate(entropy, mask, "token").detach()
    loss = aggregate(per_token, mask, aggregation, max_tokens)
    stats["policy_loss"] = aggregate(policy_loss, mask, aggregation, max_tokens).detach()
    stats["clip_fraction"] = clip_fraction.detach()
    stats["approx_kl"] = aggregate((ratio - 1) - (logp - old_logp), mask, "token").detach()
    return loss, stats


def log_train(logger: Logger, history: dict[str, list[float]], settings: LossSettings, diagnostics: bool) -> None:
    """Record what GRPO's update logs beside the shared ``train/*`` (its coefficients); with the diagnostics, warn
    when the policy's entropy fell below 0.5."""
    if diagnostics and np.mean(history["entropy"]) < controls.ENTROPY_WARNING:
        warnings.warn(
            f"policy entropy {np.mean(history['entropy']):.3f} < {controls.ENTROPY_WARNING}: too little exploration "
            "(diagnostics)",
            stacklevel=3,
        )
    logger.record("train/ent_coef", settings.ent_coef)
    logger.record("train/clip_range", settings.clip_low)
