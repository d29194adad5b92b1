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
- **Masked** (``sampler_correction="mask"``): the same ``pi_old``, and each sequence weighted by its whole ratio
  ``prod_t pi_old / pi_sampler``, a sequence whose ratio exceeds ``cap`` left out (weight 0;
  :func:`~algorithms.common.losses.masked_sequence_weights`, TRL's ``"sequence_mask"``); the share of sequences
  left out is logged as ``train/sampler_masked_fraction``.

``"auto"`` (the default) turns TIS on exactly when the sampler is not the update's own computation: when the
sampling and update stages run in different precisions, or the rollouts run on an external engine
(``rollout_engine="hf"`` or ``"vllm"``: another implementation of the forward pass, whose log-probs match the
update's only up to its own rounding, and a vLLM server may lag a push behind).
"""

from __future__ import annotations

import dataclasses

import torch as th

from algorithms.common.losses import aggregate, kl_k3, masked_sequence_weights, truncated_importance_weights
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.runtime.precision import PrecisionChoice

#: the values of ``sampler_correction``: ``"auto"`` (TIS when the sampler is not the update's own computation),
#: ``"tis"``, ``"mask"``, None
SAMPLER_CORRECTIONS = ("auto", "tis", "mask", None)
#: the rollout engines whose log-probs are another computation than the update's (``rollout_engine=``)
EXTERNAL_ENGINES = ("hf", "vllm")


def resolve_sampler_correction(
    requested: str | None, precision: PrecisionChoice, rollout_engine: str = "builtin"
) -> str | None:
    """What ``sampler_correction=requested`` means under ``precision`` with ``rollout_engine``: ``"tis"``,
    ``"mask"`` or None (no correction)."""
    if requested == "auto":
        external = rollout_engine in EXTERNAL_ENGINES
        return "tis" if precision.mixes_sampling_and_update or external else None
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
