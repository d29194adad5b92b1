"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740; TRL's
``RLOOTrainer``), for language models on R1Zero-style envs.

The whole algorithm is its advantages and its loss; the loop (``learn``), the rollouts, the update step, saving,
loading and exact resume are :class:`~algorithms.common.base_class.LMBaseAlgorithm`'s:

- advantages (:meth:`RLOO._build_batch`): each of a problem's G completions is scored against the mean return of
  the other G - 1, ``A_i = R_i - mean_{j != i} R_j``
  (:func:`~algorithms.common.advantages.leave_one_out_advantages`);
- loss (:func:`rloo_loss`): the policy gradient ``-A_i log pi(token)``, averaged over the rollout's tokens (weighted
  by the sampler correction when it is on), plus ``beta`` times the k3 KL to a frozen reference; one epoch, one
  optimizer step per rollout, no clipping (the rollout is on-policy).
"""

from __future__ import annotations

from typing import Any

import torch as th

from algorithms.common.advantages import leave_one_out_advantages
from algorithms.common.arguments import MOST, Argument, integer, number
from algorithms.common.base_class import LMBaseAlgorithm
from algorithms.common.lm_arguments import LM_ARGUMENTS
from algorithms.common.losses import PolicyOutputs, aggregate, kl_k3
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.rollout.rows import Rows

#: RLOO's constructor arguments: the shared ones, with ``beta`` its own and G at least 2 (the baseline needs one other)
RLOO_ARGUMENTS = LM_ARGUMENTS.extended(
    "group_size",
    {"beta": Argument(0.0, number(low=0.0), "weight of the k3 KL to the frozen reference (0: none, no reference kept)",
                      "float")},
    group_size={"rule": integer(low=2, high=MOST), "doc": "G, completions per problem (at least 2: the baseline of "
                "each is the mean of the others)"},
    tensorboard_log={"doc": "the TensorBoard folder (runs go to ``<folder>/RLOO_<n>``)"},
)  # fmt: skip


def rloo_loss(batch: RolloutBatch, outputs: PolicyOutputs, beta: float = 0.0) -> tuple[th.Tensor, dict[str, Any]]:
    """``-A log pi`` per token (times the sampler correction's weights), averaged over the tokens, plus ``beta``
    times the k3 KL to the reference; the loss and its parts to log."""
    mask = batch.completion_mask
    per_token = -batch.advantages.unsqueeze(1) * outputs.log_probs  # (B, C)
    if batch.sampler_weights is not None:
        per_token = per_token * batch.sampler_weights
    policy_loss = aggregate(per_token, mask, "token")
    stats: dict[str, Any] = {"policy_loss": policy_loss.detach()}
    if beta == 0 or batch.ref_log_probs is None:
        return policy_loss, stats
    kl = aggregate(kl_k3(outputs.log_probs, batch.ref_log_probs), mask, "token")
    stats["kl"] = kl.detach()
    return policy_loss + beta * kl, stats


class RLOO(LMBaseAlgorithm):
    __doc__ = f"""REINFORCE with a leave-one-out baseline for language models (see the module's docstring).

    {RLOO_ARGUMENTS.docstring()}
    """

    algo_name, config_file = "rloo", "rloo.yml"
    arguments = RLOO_ARGUMENTS

    @RLOO_ARGUMENTS.constructor
    def __init__(self, policy: Any, env: Any, **kwargs: Any) -> None:
        super().__init__(policy, env, **RLOO_ARGUMENTS.values_in(kwargs))
        if kwargs["_init_setup_model"]:
            self._setup_model()

    def _needs_reference(self) -> bool:
        return self.beta > 0

    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """Every completion with its episode's leave-one-out advantage (and its return)."""
        returns = self._episode_returns(rows, generation_seconds)[:, 0]  # (E,) this process's episodes
        advantages = leave_one_out_advantages(returns.view(-1, self.group_size)).flatten()  # (E,)
        batch = self._rows_batch(rows, advantages, returns)
        if self.beta > 0:
            batch.ref_log_probs = self._reference_log_probs(batch)
        return batch

    def train(self) -> None:
        """One optimizer step on the whole rollout (:func:`rloo_loss`)."""
        self._update_policy(lambda batch, outputs: rloo_loss(batch, outputs, self.beta))
        self.logger.record("train/beta", self.beta)
