"""The sampler/trainer mismatch: measured on every fresh rollout, and corrected by truncated importance sampling.

The tokens of a rollout are drawn by the sampler (the KV-cache decoder, in the ``"sampling"`` stage's precision)
and trained on by the update's forward pass (in the ``"update"`` stage's precision). When the two compute
different distributions (float32 sampling and a bf16 update, asked for with a per-stage ``mixed_precision``;
later an external generation engine) the rollout is slightly off-policy before the first
step, and the surrogate's ratio ``pi / pi_sampler`` is not 1 on a fresh rollout: clipping then drops the
gradient of some tokens and lets others through unclipped, in a direction set by rounding, not by the reward.

- **Measured** (``train/sampler_kl``): the mean over the fresh rollout's tokens of Schulman's k3 estimate of
  ``KL(pi_sampler || pi_update)`` (:func:`~algorithms.common.losses.kl_k3` with ``r = pi_update / pi_sampler`` at
  each sampled token: unbiased, since the tokens are the sampler's draws; not the exact sum over the vocabulary,
  which would need the sampler's whole distribution at every step). ``pi_update`` is the update's distribution
  before its first optimizer step. 0 (up to float rounding, about 1e-12) when both run in float32.
- **Corrected** (``sampler_correction="tis"``): the update's own log-probs of the fresh rollout are computed once,
  without gradient, before the first step (``pi_old``, one extra forward pass); the surrogate's ratio becomes
  ``pi / pi_old`` (exactly 1 at the first step, as TRL and verl have it) and each token's loss is weighted by
  ``min(pi_old / pi_sampler, cap)`` (:func:`~algorithms.common.losses.truncated_importance_weights`).
  ``"auto"`` (the default) turns it on exactly when the sampling and update stages run in different precisions,
  or when older weights sample (``max_staleness >= 1``, :mod:`~algorithms.common.rollout.staleness`): ``pi_old``
  is then the proximal policy (the weights at the update's start) and the weights correct the staleness too. The
  share of tokens whose weight the cap truncates is logged as ``train/sampler_clipped_fraction``
  (:func:`~algorithms.common.losses.truncated_fraction`).
"""

from __future__ import annotations

import dataclasses

import torch as th

from algorithms.common.losses import aggregate, kl_k3, truncated_importance_weights
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.runtime.precision import PrecisionChoice

#: the values of ``sampler_correction``: ``"auto"`` (TIS when sampling and update precisions differ), ``"tis"``, None
SAMPLER_CORRECTIONS = ("auto", "tis", None)


def resolve_sampler_correction(requested: str | None, precision: PrecisionChoice, max_staleness: int = 0) -> str | None:
    """What ``sampler_correction=requested`` means under ``precision`` and ``max_staleness``: ``"tis"`` or None (no
    correction). ``"auto"`` corrects when the sampler's distribution is not the update's: other precisions, or
    older weights (``max_staleness >= 1``)."""
    if requested == "auto":
        return "tis" if precision.mixes_sampling_and_update or max_staleness > 0 else None
    return requested


def sampler_kl(update_logp: th.Tensor, sampler_logp: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """The mean over valid tokens of the k3 estimate of ``KL(pi_sampler || pi_update)`` at the sampled tokens
    (scalar, no gradient); ``update_logp`` and ``sampler_logp`` are ``(B, T)``, ``mask`` True on valid tokens."""
    per_token = kl_k3(sampler_logp.detach(), update_logp.detach())  # (B, T): r - 1 - log r, r = update / sampler
    return aggregate(per_token, mask, "token")


def minibatch_sampler_kl(minibatch: RolloutBatch, log_probs: th.Tensor) -> th.Tensor:
    """:func:`sampler_kl` of a minibatch's fresh rows from the update's ``(B, C)`` log-probs of it, taken before any
    step (the first minibatch of an update: what is measured when there is no correction, at no extra cost)."""
    mask = minibatch.completion_mask  # (B, C)
    if minibatch.slots is not None:  # replayed rows were sampled by older weights: not the sampler's mismatch
        mask = mask & (minibatch.slots < 0).unsqueeze(1)
    return sampler_kl(log_probs, minibatch.old_log_probs, mask)


def corrected(batch: RolloutBatch, update_logp: th.Tensor, cap: float) -> RolloutBatch:
    """The fresh rollout ``batch`` with ``update_logp`` (``(N, C)``, the update's own log-probs of it before the first
    step) as ``old_log_probs`` and the TIS weights ``min(pi_old / pi_sampler, cap)`` as ``sampler_weights``."""
    weights = truncated_importance_weights(update_logp, batch.old_log_probs, batch.completion_mask, cap)  # (N, C)
    return dataclasses.replace(batch, old_log_probs=update_logp.detach(), sampler_weights=weights)


def correct_fresh_rollout(policy, batch: RolloutBatch, cap: float) -> tuple[RolloutBatch, th.Tensor]:
    """:func:`corrected` ``batch``, its update log-probs from one forward pass of the
    :class:`~algorithms.common.policies.TransformerPolicy` (no gradient), and the sampler KL measured on it."""
    mask = batch.completion_mask
    with th.no_grad():
        old = policy.log_probs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)[0]  # (N, C)
    return corrected(batch, old, cap), sampler_kl(old, batch.old_log_probs, mask)
