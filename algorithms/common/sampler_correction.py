"""The sampler/trainer mismatch: measured on every fresh rollout, and corrected by truncated importance sampling.

The tokens of a rollout are drawn by the sampler (the KV-cache decoder, in the ``"sampling"`` stage's precision)
and trained on by the update's forward pass (in the ``"update"`` stage's precision). When the two compute
different distributions (float32 sampling and a bf16 update, asked for with a per-stage ``mixed_precision``;
later an external generation engine) the rollout is slightly off-policy before the first
step, and the surrogate's ratio ``pi / pi_sampler`` is not 1 on a fresh rollout: clipping then drops the
gradient of some tokens and lets others through unclipped, in a direction set by rounding, not by the reward.

- **Measured** (``train/sampler_kl``): the mean over the fresh rollout's tokens of Schulman's k3 estimate of
  ``KL(pi_sampler || pi_update)`` (:func:`~algorithms.common.losses.sampler_kl`, with ``r = pi_update / pi_sampler``
  at each sampled token: unbiased, since the tokens are the sampler's draws; not the exact sum over the vocabulary,
  which would need the sampler's whole distribution at every step). ``pi_update`` is the update's distribution
  before its first optimizer step. 0 (up to float rounding, about 1e-12) when both run in float32.
- **Corrected** (``sampler_correction="tis"``): the update's own log-probs of the fresh rollout are computed once,
  without gradient, before the first step (``pi_old``, one extra forward pass); the surrogate's ratio becomes
  ``pi / pi_old`` (exactly 1 at the first step, as TRL and verl have it) and each token's loss is weighted by
  ``min(pi_old / pi_sampler, cap)`` (:func:`truncated_importance_weights`).
- **Masked** (``sampler_correction="mask"``): the same ``pi_old``, and each sequence weighted by its whole ratio
  ``prod_t pi_old / pi_sampler``, a sequence whose ratio exceeds ``cap`` left out (weight 0;
  :func:`masked_sequence_weights`, TRL's ``"sequence_mask"``); the share of sequences
  left out is logged as ``train/sampler_masked_fraction``.

``"auto"`` (the default) turns TIS on exactly when the sampler is not the update's own computation: when the
sampling and update stages run in different precisions, or the rollouts run on an external engine
(``rollout_engine="hf"`` or ``"vllm"``: another implementation of the forward pass, whose log-probs match the
update's only up to its own rounding, and a vLLM server may lag a push behind), or older weights sample
(``max_staleness >= 1``, :mod:`~algorithms.common.rollout.staleness`): ``pi_old`` is then the proximal policy (the
weights at the update's start), and the weights correct the staleness too. The share of tokens whose TIS weight
the cap truncates is logged as ``train/sampler_clipped_fraction``
(:func:`truncated_fraction`).
"""

from __future__ import annotations

import dataclasses
import math

import torch as th
from torch import Tensor

from algorithms.common.losses import check_shape, sampler_kl
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.runtime.precision import PrecisionChoice

#: the values of ``sampler_correction``: ``"auto"`` (TIS when the sampler is not the update's own computation),
#: ``"tis"``, ``"mask"``, None
SAMPLER_CORRECTIONS = ("auto", "tis", "mask", None)
#: the rollout engines whose log-probs are another computation than the update's (``rollout_engine=``)
EXTERNAL_ENGINES = ("hf", "vllm")


def truncated_importance_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Truncated importance sampling (TIS) per token: ``w = min(pi_old / pi_sampler, cap)``, no gradient.

    Corrects for a sampler whose token distribution is not the update's own (a different precision, an
    external generation engine): the surrogate is built on ``pi / pi_old`` with ``pi_old`` the update's
    distribution before its first step, and each token's loss is weighted by ``w``, capped so that a token the
    sampler found much less likely than the update does cannot dominate (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"; TRL's ``vllm_importance_sampling_mode="token_truncate"``,
    verl's rollout importance sampling). Tokens where the sampler was the more confident get ``w < 1``.

    :param old_logp: log-probs of the sampled tokens under the update's forward pass, before any step, ``(B, T)``
    :param sampler_logp: the same as the sampler computed them, ``(B, T)``
    :param mask: ``True`` on valid completion tokens, ``(B, T)``
    :param cap: the largest weight ``C`` (``> 0``)
    :return: ``(B, T)`` weights, 0 at masked positions
    """
    if not cap > 0:
        raise ValueError(f"the truncation cap must be > 0, got {cap}.")
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    log_ratio = th.where(mask.bool(), old_logp - sampler_logp, 0.0).detach()  # (B, T)
    return th.where(mask.bool(), th.exp(log_ratio).clamp(max=cap), 0.0)  # (B, T)


def masked_sequence_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Masked sequence-level importance sampling: each sequence's ratio ``r_i = prod_t pi_old / pi_sampler`` over its
    valid tokens weights all its tokens, and a sequence whose ratio exceeds ``cap`` is left out (weight 0), no
    gradient.

    The masked variant of :func:`truncated_importance_weights` (TRL's ``vllm_importance_sampling_mode=
    "sequence_mask"`` with ``clip_max=cap`` and no lower bound): a sequence the sampler drew far more often than the
    update would (its whole-sequence mismatch beyond the threshold) says more about the engine than about the
    policy, and is dropped rather than down-weighted. A sequence with no valid token gets 0.

    :param old_logp: log-probs of the sampled tokens under the update's forward pass, before any step, ``(B, T)``
    :param sampler_logp: the same as the sampler computed them, ``(B, T)``
    :param mask: ``True`` on valid completion tokens, ``(B, T)``
    :param cap: the largest sequence ratio kept (``> 0``)
    :return: ``(B, T)`` weights: ``r_i`` on the valid tokens of a kept sequence, 0 elsewhere
    """
    if not cap > 0:
        raise ValueError(f"the mask threshold (cap) must be > 0, got {cap}.")
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    valid = mask.bool()
    log_ratio = th.where(valid, old_logp - sampler_logp, 0.0).detach().sum(dim=-1, keepdim=True)  # (B, 1)
    ratio = th.exp(log_ratio)  # (B, 1): the sequence's importance ratio
    kept = (ratio <= cap) & valid.any(dim=-1, keepdim=True)  # (B, 1)
    return th.where(valid & kept, ratio, 0.0)  # (B, T)


def truncated_fraction(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """The share of valid tokens whose TIS weight the cap truncates: ``pi_old / pi_sampler > cap`` (scalar, no
    gradient; 0 without valid tokens). Arguments as :func:`truncated_importance_weights`'s."""
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    valid = mask.bool()
    truncated = (old_logp.detach() - sampler_logp.detach() > math.log(cap)) & valid  # (B, T)
    return truncated.sum() / valid.sum().clamp(min=1)


def resolve_sampler_correction(
    requested: str | None, precision: PrecisionChoice, rollout_engine: str = "builtin", max_staleness: int = 0
) -> str | None:
    """What ``sampler_correction=requested`` means under ``precision`` with ``rollout_engine`` and ``max_staleness``:
    ``"tis"``, ``"mask"`` or None (no correction)."""
    if requested == "auto":
        external = rollout_engine in EXTERNAL_ENGINES
        return "tis" if precision.mixes_sampling_and_update or external or max_staleness > 0 else None
    return requested


def corrected(batch: RolloutBatch, update_logp: th.Tensor, cap: float, mode: str = "tis") -> RolloutBatch:
    """The fresh rollout ``batch`` with ``update_logp`` (``(N, C)``, the update's own log-probs of it before the first
    step) as ``old_log_probs`` and the correction's per-token weights as ``sampler_weights``: ``mode="tis"``
    ``min(pi_old / pi_sampler, cap)``, ``mode="mask"`` each sequence's ratio, 0 for one above ``cap``."""
    weigh = {"tis": truncated_importance_weights, "mask": masked_sequence_weights}[mode]
    weights = weigh(update_logp, batch.old_log_probs, batch.completion_mask, cap)  # (N, C)
    return dataclasses.replace(batch, old_log_probs=update_logp.detach(), sampler_weights=weights)


def masked_fraction(batch: RolloutBatch) -> float:
    """The share of the batch's sequences (those with a valid token) that the correction left out (all weights 0)."""
    if batch.sampler_weights is None:
        return 0.0
    mask = batch.completion_mask.bool()  # (N, C)
    valid = mask.any(dim=-1)  # (N,)
    left_out = valid & ~(th.where(mask, batch.sampler_weights, 0.0) > 0).any(dim=-1)  # (N,)
    return float(left_out.sum()) / max(int(valid.sum()), 1)


def correct_fresh_rollout(policy, batch: RolloutBatch, cap: float, mode: str = "tis") -> tuple[RolloutBatch, th.Tensor]:
    """:func:`corrected` ``batch`` (``mode``: ``"tis"`` or ``"mask"``), its update log-probs from one forward pass of
    the :class:`~algorithms.common.policies.TransformerPolicy` (no gradient), and the sampler KL measured on it."""
    mask = batch.completion_mask
    with th.no_grad():
        old = policy.log_probs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)[0]  # (N, C)
    return corrected(batch, old, cap, mode), sampler_kl(old, batch.old_log_probs, mask)
