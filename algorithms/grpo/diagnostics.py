"""The diagnostics (``controls_kwargs['diagnostics']=True``, one of the original design's controls): the update's
gradient accumulated one group at a time, each group's own gradient measured (per-group norms, their spread, the
groups' agreement) and logged under ``groups/``. :meth:`GRPO._step <algorithms.grpo.grpo.GRPO._step>` calls it instead
of the shared step's joint backward; the sum of the groups' gradients is the joint one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch as th
from stable_baselines3.common.logger import Logger

from algorithms.common.losses import PolicyOutputs, UpdateLoss
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch, loss_share
from algorithms.grpo import controls
from grpo_gym.validation import user_stacklevel


@dataclass(frozen=True)
class GroupDiagnostics:
    """The diagnostics: per-group gradient norms ``(K,)``, their relative spread, and the groups' agreement ("group
    stability")."""

    norms: th.Tensor
    spread: float
    stability: float


def backward_by_group(
    policy: TransformerPolicy,
    minibatch: RolloutBatch,
    spec: UpdateLoss,
    rank_share: float = 1.0,
    loss_scale: float = 1.0,
) -> tuple[th.Tensor, dict[str, th.Tensor], th.Tensor, GroupDiagnostics]:
    """The diagnostics: accumulate the minibatch's gradient one group at a time, each group's loss (``spec``)
    weighted by its share of the minibatch's aggregation (so the sum is the joint gradient), and measure each group's
    gradient.

    :param rank_share: this rank's share of the job's minibatch
        (:func:`~algorithms.common.rollout.batch.minibatches`)
    :param loss_scale: the fp16 gradient scaler's current scale (1 without one)
    :return: the minibatch's loss and stats (share-weighted sums), its ``(B, C)`` log-probs, the diagnostics
    """
    parameters = [p for p in policy.parameters() if p.requires_grad]
    policy.optimizer.zero_grad(set_to_none=True)
    previous = th.zeros(sum(p.numel() for p in parameters), device=minibatch.completion_mask.device)
    gradients, loss_sum, stats_sum = [], 0.0, {}
    log_probs = th.zeros_like(minibatch.old_log_probs)  # (B, C)
    for group in th.unique(minibatch.groups).tolist():
        rows = (minibatch.groups == group).nonzero().squeeze(1)
        part = minibatch.select(rows)
        share = loss_share(part, minibatch, spec.aggregation)
        args = (part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask)
        outputs = PolicyOutputs(*policy.log_probs(*args, with_entropy=spec.with_entropy))
        value, stats = spec.function(part, outputs)
        part_log_probs = outputs.log_probs
        (value * share * rank_share * loss_scale).backward()
        grads = [(p.grad if p.grad is not None else th.zeros_like(p)).flatten() for p in parameters]
        total = th.cat(grads) / loss_scale  # (P,) the gradient accumulated so far
        gradients.append((total - previous) / max(share * rank_share, 1e-12))  # this group's own gradient
        previous = total
        loss_sum = loss_sum + value.detach() * share
        for key, value in stats.items():
            stats_sum[key] = stats_sum.get(key, 0.0) + value.detach() * share
        log_probs[rows, : part_log_probs.shape[1]] = part_log_probs.detach()
    norms = th.stack([g.norm() for g in gradients])  # (K,)
    diagnostics = GroupDiagnostics(
        norms, controls.gradient_spread(norms), controls.group_stability(th.stack(gradients))
    )
    return loss_sum, stats_sum, log_probs, diagnostics


def log_group_gradients(logger: Logger, groups: GroupDiagnostics) -> None:
    """The diagnostics: per-group gradient norms, their spread (warning above 0.3) and the groups' agreement."""
    logger.record("groups/grad_norm_mean", float(groups.norms.mean()))
    logger.record("groups/grad_norm_spread", groups.spread)
    logger.record("groups/stability", groups.stability)
    if groups.spread > controls.GRAD_SPREAD_WARNING:
        warnings.warn(
            f"per-group gradient-norm spread {groups.spread:.2f} > {controls.GRAD_SPREAD_WARNING} (diagnostics)",
            stacklevel=user_stacklevel(),
        )
