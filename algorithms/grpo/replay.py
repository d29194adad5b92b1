"""Mixing prioritized replay into GRPO's updates.

Where it sits in the data flow: before an update, :func:`draw` takes ``replay_ratio`` of the update's rows from
the :class:`~algorithms.common.replay.trajectory_buffer.PrioritizedTrajectoryBuffer` (with their sampling log-probs,
their group's advantage and an importance-sampling weight); the update measures how far the policy has moved from
each replayed row (:func:`drift`); after it, :func:`update_and_store` gives the replayed rows their new
priority ``|A| exp(-drift)`` and adds the fresh rollout to the buffer.
"""

from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger

from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.common.rollout.batch import RolloutBatch

#: added to every priority, so that no row's chance of being replayed again is exactly 0
PRIORITY_FLOOR = 1e-3


def draw(
    buffer: PrioritizedTrajectoryBuffer,
    n_fresh: int,
    ratio: float,
    iteration: int,
    max_age: int,
    device: th.device,
    logger: Logger | None = None,
) -> RolloutBatch | None:
    """Rows drawn from ``buffer`` so that they make ``ratio`` of an update with ``n_fresh`` fresh rows (None: too
    few in the buffer, or none wanted); rows collected more than ``max_age`` iterations before ``iteration`` are
    evicted first. Logged: ``replay/fraction``, ``replay/size``, ``replay/age_mean``."""
    buffer.evict_older_than(iteration - max_age)
    wanted = round(n_fresh * ratio / (1 - ratio))
    replayed, fraction, ages = None, 0.0, None
    if wanted and buffer.sampler.count >= wanted:
        drawn = buffer.sample_batch(wanted)
        arrays = {name: th.as_tensor(value, device=device) for name, value in drawn.rollout_arrays().items()}
        replayed = RolloutBatch(
            **arrays,
            weights=th.as_tensor(drawn.weights, dtype=th.float32, device=device),
            slots=th.as_tensor(drawn.indices, device=device),
        )
        fraction, ages = wanted / (wanted + n_fresh), iteration - drawn.iterations
    if logger is not None:
        logger.record("replay/fraction", fraction)
        logger.record("replay/size", len(buffer))
        if ages is not None:
            logger.record("replay/age_mean", float(np.mean(ages)))
    return replayed


def drift(log_probs: th.Tensor, minibatch: RolloutBatch) -> dict[int, float]:
    """Mean ``|log ratio|`` per token of each replayed row of ``minibatch``, by buffer slot."""
    mask = minibatch.completion_mask
    per_row = ((log_probs - minibatch.old_log_probs).abs() * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,)
    return {int(slot): float(d) for slot, d in zip(minibatch.slots, per_row, strict=True) if slot >= 0}


def update_and_store(
    buffer: PrioritizedTrajectoryBuffer,
    fresh: RolloutBatch,
    replayed: RolloutBatch | None,
    drifts: dict[int, float],
    iteration: int,
) -> None:
    """New priorities for the replayed rows (``|A| exp(-drift)``), then the fresh rows into the buffer (after:
    adding may overwrite the slots just updated)."""
    if replayed is not None and drifts:
        slots = np.array(list(drifts))
        advantage = {int(s): abs(float(a)) for s, a in zip(replayed.slots, replayed.advantages, strict=True)}
        buffer.update_priorities(slots, [advantage[s] * np.exp(-drifts[s]) + PRIORITY_FLOOR for s in slots])
    buffer.add_batch(
        fresh.prompt_ids.cpu().numpy(),
        fresh.prompt_mask.cpu().numpy(),
        fresh.completion_ids.cpu().numpy(),
        fresh.completion_mask.cpu().numpy(),
        fresh.old_log_probs.cpu().numpy(),
        rewards=fresh.returns.cpu().numpy(),
        group_ids=fresh.groups.cpu().numpy(),
        iteration=iteration,
        advantages=fresh.advantages.cpu().numpy(),
    )
