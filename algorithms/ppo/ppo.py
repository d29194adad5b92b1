"""LMPPO: Proximal Policy Optimization for language models (the RLHF recipe: Ziegler et al. 2019, InstructGPT)
with the Stable-Baselines3 API, on the same policy, sampler, rollouts and SB3 surface as GRPO.

Named ``LMPPO`` so that ``from algorithms import LMPPO`` never shadows ``stable_baselines3.PPO``. The pure
functions (token rewards, GAE, whitening, the clipped value loss, the loss) are in :mod:`algorithms.ppo.objective`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.utils import explained_variance

from algorithms.common import sampler_correction as correction
from algorithms.common.base_class import LMBaseAlgorithm
from algorithms.common.losses import PolicyOutputs, sampler_kl
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.rollout.rows import Rows
from algorithms.ppo import objective
from algorithms.ppo.arguments import LMPPO_ARGUMENTS


class LMPPO(LMBaseAlgorithm):
    __doc__ = f"""PPO with a per-token value head for language models on ``R1Zero-v0``-style envs.

    One iteration: ``n_groups`` (K) prompts, ``group_size`` completions each (1 by default: PPO needs no group),
    sampled in one batch; the env's reward of each completion sits on its last token, and the KL to the frozen
    reference is a per-token reward penalty ``-kl_coef * (log pi_old - log pi_ref)`` (InstructGPT; or a k3 term in
    the loss, ``kl_placement="loss"``); a value head (a ``Linear`` on the policy's last hidden state, float32, part
    of the policy: saved, loaded and checkpointed with it) estimates ``V(s_t)`` for every token, read from the same
    forward pass as the log-probs; token-level GAE gives the advantages and value targets; then ``n_epochs`` passes
    of minibatches of the clipped surrogate plus ``vf_coef`` x the clipped value loss, each a guarded optimizer step
    (as SB3's ``PPO``: ``target_kl`` stops the update early). ``num_timesteps`` counts completions.

    What it shares with :class:`~algorithms.grpo.GRPO` (:class:`~algorithms.common.base_class.LMBaseAlgorithm`): the
    cold start, rollouts, sampler, mixed precision, several processes, save/load and exact resume, callbacks and
    the ``rollout/``, ``time/``, ``train/`` TensorBoard tags; PPO adds ``train/value_loss``,
    ``train/explained_variance``, ``train/clip_fraction_vf``, ``rollout/kl`` and ``rollout/values``. Under
    ``mixed_precision`` the value head and the losses stay float32; with ``sampler_correction`` the update's own
    log-probs of the rollout come from the forward pass that computes its values, at no extra cost.

    The arguments (declared once, with their defaults and rules: :mod:`algorithms.ppo.arguments`):

    {LMPPO_ARGUMENTS.docstring()}
    """

    policy: TransformerPolicy
    algo_name, config_file = "ppo", "lmppo.yml"
    schedules = ("clip_range", "clip_range_vf", "ent_coef")
    arguments = LMPPO_ARGUMENTS

    @LMPPO_ARGUMENTS.constructor  # the table's signature; beta=... names ours (kl_coef)
    def __init__(self, policy: str | type[TransformerPolicy], env: GymEnv | str | None, **kwargs: Any) -> None:
        setup = kwargs["_init_setup_model"]
        kwargs = LMPPO_ARGUMENTS.values_in(kwargs)
        policy_kwargs = {} if kwargs["policy_kwargs"] is None else kwargs["policy_kwargs"]
        if isinstance(policy_kwargs, dict):  # anything else: the argument's rule names the fix
            if policy_kwargs.get("value_head", True) is not True:
                raise ValueError("LMPPO trains a value head: leave policy_kwargs['value_head'] out (or set it True)")
            kwargs["policy_kwargs"] = {**policy_kwargs, "value_head": True}
        super().__init__(policy, env, **kwargs)  # every argument checked once, by its rule, and stored by name
        self._explained_variance = float("nan")
        self._sampler_kl = float("nan")  # train/sampler_kl of the last rollout
        self._sampler_clipped = float("nan")  # train/sampler_clipped_fraction of the last rollout (with TIS)
        if setup:
            self._setup_model()

    def _needs_reference(self) -> bool:
        return self.kl_coef > 0

    # ------------------------------------------------------------------ advantages
    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """Every completion of the rollout, with its per-token values at sampling time, GAE advantages and targets.

        Each row's score is its turn's return to the end of the episode (one turn: the env's reward); the per-token
        KL penalty and the score make the token rewards (:func:`objective.token_rewards`)."""
        to_go = self._episode_returns(rows, generation_seconds)  # (E, U): each turn's return to the episode's end
        zeros = th.zeros(len(to_go))
        batch = self._rows_batch(rows, zeros, zeros)
        mask = batch.completion_mask
        with th.no_grad():
            args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)
            update_log_probs, _, batch.values = self.policy.log_probs(*args, with_values=True)  # (N, C) each
            ref_log_probs = self._reference_log_probs(batch) if self.kl_coef > 0 else None  # (N, C)
        self._sampler_kl = float(sampler_kl(update_log_probs, batch.old_log_probs, mask))
        if self._sampler_correction is not None:  # the ratio against the update's own log-probs, tokens weighted
            cap, mode = self.sampler_correction_cap, self._sampler_correction
            if mode == "tis":
                self._sampler_clipped = float(
                    correction.truncated_fraction(update_log_probs, batch.old_log_probs, mask, cap)
                )
            batch = correction.corrected(batch, update_log_probs, cap, mode)
            if mode == "mask":
                self.logger.record("train/sampler_masked_fraction", correction.masked_fraction(batch))
        kl = None if ref_log_probs is None else th.where(mask, batch.old_log_probs - ref_log_probs, 0.0)  # (N, C) k1
        in_reward = self.kl_placement == "reward"
        rewards = objective.token_rewards(
            to_go[rows.episodes, rows.turns].to(self.device), mask, kl, self.kl_coef if in_reward else 0.0
        )
        advantages, batch.returns = objective.gae(rewards, batch.values, mask, self.gamma, self.gae_lambda)
        batch.advantages = objective.whiten(advantages, mask) if self.normalize_advantage else advantages
        batch.ref_log_probs = None if in_reward else ref_log_probs
        self._explained_variance = float(explained_variance(batch.values[mask].cpu().numpy(),
                                                            batch.returns[mask].cpu().numpy()))  # fmt: skip
        self.logger.record("rollout/values", batch.values[mask].mean().item())
        if kl is not None:
            self.logger.record("rollout/kl", kl[mask].mean().item())
        return batch

    # ------------------------------------------------------------------ update
    def train(self) -> None:
        """``n_epochs`` passes over the rollout in minibatches of ``batch_size`` completions; each minibatch one
        optimizer step on the clipped surrogate + ``vf_coef`` x the value loss (SB3's ``target_kl`` stop), through
        the shared update step (:meth:`~algorithms.common.base_class.LMBaseAlgorithm._update_policy`)."""
        progress = self._current_progress_remaining
        clip_range, ent_coef = self.clip_range(progress), self.ent_coef(progress)
        clip_range_vf = self.clip_range_vf(progress) if self.clip_range_vf is not None else None

        def loss(minibatch: RolloutBatch, outputs: PolicyOutputs) -> tuple[th.Tensor, dict[str, th.Tensor]]:
            assert minibatch.values is not None
            return objective.ppo_loss(
                outputs.log_probs, minibatch.old_log_probs, minibatch.advantages, outputs.values, minibatch.values,
                minibatch.returns, minibatch.completion_mask, clip_range=clip_range, clip_range_vf=clip_range_vf,
                vf_coef=self.vf_coef, ent_coef=ent_coef, entropy=outputs.entropy, ref_logp=minibatch.ref_log_probs,
                kl_coef=self.kl_coef, sampler_weights=minibatch.sampler_weights,
            )  # fmt: skip

        stopped = []

        def too_far(stats: dict[str, th.Tensor]) -> bool:  # SB3: stop before this step; every rank sees the same mean
            approx_kl = self._dist.sum(float(stats["approx_kl"])) / self._dist.world_size
            stopped.append(self.target_kl is not None and approx_kl > 1.5 * self.target_kl)
            return stopped[-1]

        self._update_policy(loss, self.n_epochs, self.batch_size, "token", ent_coef != 0, True, too_far)
        self._log_train(clip_range, clip_range_vf, any(stopped))

    def _log_train(self, clip_range: float, clip_range_vf: float | None, stopped: bool) -> None:
        """What LMPPO logs beside the shared update's ``train/*``."""
        self.logger.record("train/explained_variance", self._explained_variance)
        self.logger.record("train/sampler_kl", self._sampler_kl)  # measured on the whole rollout, before the update
        if self._sampler_correction == "tis":
            self.logger.record("train/sampler_clipped_fraction", self._sampler_clipped)
        self.logger.record("train/early_stop", float(stopped))
        self.logger.record("train/kl_coef", self.kl_coef)
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
