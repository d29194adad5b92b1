"""One update of the policy on a rollout, the same for every algorithm that gives only its loss: the minibatches
(this process's rows, each weighted by its share of every process's loss), the sampler correction, the gradient sync,
the guarded optimizer step (clipping, non-finite steps skipped and counted) and the ``train/*`` logs.

An algorithm's loss is a pure function of a minibatch and the policy's outputs on it (:class:`PolicyOutputs`),
returning the loss and what to log: :func:`update_policy` runs it ``n_epochs`` times over the rollout. LMPPO
(:mod:`algorithms.ppo.ppo`) and RLOO (:mod:`algorithms.rloo.rloo`) train through it; GRPO's update adds replay, the
sampler correction from its own forward pass and the diagnostics' group-by-group steps
(:mod:`algorithms.grpo.update`) and shares the optimizer step and the minibatches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th

from algorithms.common import sampler_correction as correction
from algorithms.common.losses import sampler_kl
from algorithms.common.rollout.batch import RolloutBatch, minibatches


@dataclass(frozen=True)
class PolicyOutputs:
    """The policy's forward pass on a minibatch: per-token log-probs ``(B, C)``, entropies ``(B, C)`` when asked,
    the value head's estimates ``(B, C)`` when asked."""

    log_probs: th.Tensor
    entropy: th.Tensor | None = None
    values: th.Tensor | None = None


#: an algorithm's loss: ``(minibatch, outputs) -> (loss, what to log)``
LossFunction = Callable[[RolloutBatch, PolicyOutputs], tuple[th.Tensor, dict[str, Any]]]


def update_policy(
    algorithm: Any,
    loss: LossFunction,
    n_epochs: int = 1,
    batch_size: int | None = None,
    aggregation: str = "token",
    with_entropy: bool = False,
    with_values: bool = False,
    stop: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, list[float]]:
    """Update ``algorithm``'s policy on its last rollout: ``n_epochs`` passes in minibatches of ``batch_size`` rows
    (``None``: the whole rollout), an optimizer step on ``loss`` each; the ``train/*`` logs (each stat's mean, the
    sampler KL, the steps skipped and taken). Returns each stat's values per step.

    :param algorithm: an :class:`~algorithms.common.base_class.LMBaseAlgorithm` after ``collect_rollouts``
    :param loss: the algorithm's loss (:data:`LossFunction`)
    :param aggregation: how the loss reduces its tokens (``"token"``: the minibatches weighted by tokens, else rows)
    :param with_entropy: the outputs carry the entropies (an entropy bonus)
    :param with_values: the outputs carry the value head's estimates
    :param stop: called with a minibatch's stats before its step; True ends the update there (SB3's ``target_kl``)
    """
    policy, batch = algorithm.policy, algorithm._rollout
    assert batch is not None, "collect_rollouts() must run before train()"
    policy.set_training_mode(True)
    algorithm._update_learning_rate(policy.optimizer)
    algorithm._start_gradient_sync()
    measured = None
    if algorithm._sampler_correction is not None and batch.sampler_weights is None:  # against the update's weights
        cap, mode = algorithm.sampler_correction_cap, algorithm._sampler_correction
        batch, measured = correction.correct_fresh_rollout(policy, batch, cap, mode)
    history: dict[str, list[float]] = {}
    for _ in range(n_epochs):
        parts = minibatches(batch, batch_size, False, aggregation, algorithm._minibatch_generator, algorithm._dist)
        for minibatch, share in parts:
            mask = minibatch.completion_mask
            args = (minibatch.prompt_ids, minibatch.prompt_mask, minibatch.completion_ids, mask)
            outputs = PolicyOutputs(*policy.log_probs(*args, with_entropy=with_entropy, with_values=with_values))
            if measured is None:  # before any step: the update's weights are the sampler's
                measured = sampler_kl(outputs.log_probs.detach(), minibatch.old_log_probs, mask)
            value, stats = loss(minibatch, outputs)
            if stop is not None and stop(stats):
                return _logged(algorithm, history, measured)
            grad_norm = algorithm._optimizer_step(value * share)
            if th.isfinite(grad_norm):  # a skipped step's norm (inf or NaN) is counted, not averaged
                stats["grad_norm"] = grad_norm
            if "entropy" not in stats:  # no entropy bonus: estimated from the sampled tokens, -E[log p]
                stats["entropy"] = -minibatch.old_log_probs[mask].mean()
            for key, item in {"loss": value, **stats}.items():
                history.setdefault(key, []).append(float(item.detach()) if th.is_tensor(item) else float(item))
    return _logged(algorithm, history, measured)


def _logged(algorithm: Any, history: dict[str, list[float]], measured: th.Tensor | None) -> dict[str, list[float]]:
    logger = algorithm.logger
    for key, values in history.items():
        logger.record(f"train/{key}", float(np.mean(values)))
    if measured is not None:
        logger.record("train/sampler_kl", float(measured))
    logger.record("train/skipped_steps", algorithm._skipped_steps)
    logger.record("train/optimizer_steps", len(history.get("loss", [])))
    logger.record("train/n_updates", algorithm._n_updates, exclude="tensorboard")
    return history
