"""GRPO's advantages: group-relative (or value-relative) scores, and which groups an update leaves out. Pure
functions over tensors (the seed's competition and diversity guard, which change them, are in
:mod:`algorithms.grpo.controls`).

Where it sits in the data flow: after the rollout, the episodes' returns ``(K, G)`` (all ranks' groups) come
here; :class:`~algorithms.grpo.grpo.GRPO` keeps the rows of the groups that are not left out, with their
advantages, in the :class:`~algorithms.common.rollout.batch.RolloutBatch` the update trains on.
"""

from __future__ import annotations

import torch as th
from torch import Tensor

from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import left_pad
from algorithms.common.rollout.rows import Rows
from algorithms.grpo import controls, objective


def relative_advantages(
    returns: Tensor, scale: str = "group", baseline: Tensor | None = None, leave_one_out: bool = False
) -> Tensor:
    """``(K, G)`` advantages: ``returns - baseline`` (S9's value baseline, ``(K, G)``) when a baseline is given,
    RLOO's when ``leave_one_out`` (:func:`~algorithms.grpo.objective.leave_one_out_advantages`, not scaled), else
    GRPO's group-relative ones (:func:`~algorithms.grpo.objective.group_advantages`, scaled by ``scale``)."""
    if leave_one_out:
        return objective.leave_one_out_advantages(returns)  # (K, G)
    if baseline is not None:
        return returns - baseline  # (K, G)
    return objective.group_advantages(returns, scale=scale)  # (K, G)


def value_baseline(policy: TransformerPolicy, rows: Rows, group_size: int) -> Tensor:
    """S9: ``(K_local, G)`` the value head's estimate of each episode's first prompt (a group shares its prompt)."""
    first = rows.first_turns()
    ids, mask = left_pad([rows.contexts[i] for i in first], policy.pad_token_id)
    with th.no_grad():
        values = policy.predict_values(ids.to(policy.device), mask.to(policy.device)).cpu()  # (E,)
    episodes = th.as_tensor([rows.episodes[i] for i in first])
    return th.zeros(len(episodes)).index_copy_(0, episodes, values).view(-1, group_size)  # (K_local, G)


def group_entropies(rows: Rows, group_size: int, n_groups: int) -> Tensor:
    """S12: ``(K_local,)`` each group's mean policy entropy, estimated from its first turns' sampled tokens."""
    first = rows.first_turns()
    log_probs, masks = th.stack([rows.log_probs[i] for i in first]), th.stack([rows.masks[i] for i in first])
    groups = th.as_tensor([rows.episodes[i] // group_size for i in first])
    return controls.group_entropies(log_probs, masks, groups, n_groups)


def left_out_groups(uniform: Tensor, drop_uniform: bool, diversity: Tensor | None = None) -> Tensor:
    """``(K,)`` groups the update leaves out: the uniform ones when ``drop_uniform`` (S29), and those the
    diversity guard names; when that would be every group, none (a zero-advantage update, not no update)."""
    dropped = uniform if drop_uniform else th.zeros_like(uniform)  # (K,)
    if diversity is not None:
        dropped = dropped | diversity
    if bool(dropped.all()):
        dropped = th.zeros_like(dropped)
    return dropped
