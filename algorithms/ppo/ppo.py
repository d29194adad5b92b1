"""LMPPO: Proximal Policy Optimization for language models (the RLHF recipe: Ziegler et al. 2019, InstructGPT)
with the Stable-Baselines3 API, on the same policy, sampler, rollouts and SB3 surface as GRPO.

Named ``LMPPO`` so that ``from algorithms import LMPPO`` never shadows ``stable_baselines3.PPO``. The pure
functions (token rewards, GAE, whitening, the clipped value loss, the loss) are in :mod:`algorithms.ppo.objective`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule, explained_variance

from algorithms.common import sampler_correction as correction
from algorithms.common.arguments import ArgumentChecker
from algorithms.common.lm_algorithm import LMAlgorithm
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch, minibatches, rows_to_batch
from algorithms.common.rollout.rows import Rows, episode_returns, log_rollout
from algorithms.common.trl_names import with_trl_hints
from algorithms.ppo import objective
from algorithms.ppo.arguments import PPO_RULES


class LMPPO(LMAlgorithm):
    """PPO with a per-token value head for language models on ``R1Zero-v0``-style envs.

    One iteration: ``n_groups`` (K) prompts, ``group_size`` completions each (1 by default: PPO needs no group),
    sampled in one batch; the env's reward of each completion sits on its last token, and the KL to the frozen
    reference is a per-token reward penalty ``-kl_coef * (log pi_old - log pi_ref)`` (InstructGPT; or a k3 term in
    the loss, ``kl_placement="loss"``); a value head (a ``Linear`` on the policy's last hidden state, float32, part
    of the policy: saved, loaded and checkpointed with it) estimates ``V(s_t)`` for every token, read from the same
    forward pass as the log-probs; token-level GAE gives the advantages and value targets; then ``n_epochs`` passes
    of minibatches of the clipped surrogate plus ``vf_coef`` x the clipped value loss, each a guarded optimizer step
    (as SB3's ``PPO``: ``target_kl`` stops the update early). ``num_timesteps`` counts completions.

    What it shares with :class:`~algorithms.grpo.GRPO` (:class:`~algorithms.common.lm_algorithm.LMAlgorithm`): the
    cold start, rollouts, sampler, mixed precision, several processes, save/load and exact resume, callbacks and
    the ``rollout/``, ``time/``, ``train/`` TensorBoard tags; PPO adds ``train/value_loss``,
    ``train/explained_variance``, ``train/clip_fraction_vf``, ``rollout/kl`` and ``rollout/values``.

    :param policy: ``"TransformerPolicy"`` or the class
    :param env: an env, a VecEnv or a registered id (``"R1Zero-v0"``); sequence action mode
    :param learning_rate: learning rate, constant or an SB3 schedule of the remaining progress
    :param n_groups: K, prompts per rollout
    :param group_size: completions per prompt (1: one per prompt, the usual PPO; more samples a prompt several times)
    :param n_epochs: passes over each rollout (TRL's ``ppo_epochs``: 4)
    :param batch_size: completions per minibatch (``None``: the whole rollout, one step per epoch)
    :param clip_range: the importance ratio's clip epsilon (0.2), constant or schedule
    :param clip_range_vf: the value clip around the sampling-time estimate (TRL's ``cliprange_value``: 0.2), constant
        or schedule; ``None`` (SB3's default) for an unclipped value loss
    :param ent_coef: entropy bonus weight, constant or schedule (0: none, as TRL's PPO)
    :param vf_coef: weight of the value loss ``0.5 * mean max((V - R)^2, (V_clip - R)^2)`` (TRL: 0.1; the value
        head shares the policy's network, so a large weight pulls the policy with it)
    :param max_grad_norm: global gradient-norm clip
    :param gamma: discount per token and per turn of a multi-turn episode (1.0: the usual for LMs)
    :param gae_lambda: GAE's lambda (TRL: 0.95)
    :param normalize_advantage: whiten the advantages over the rollout's tokens (SB3's name; TRL whitens too)
    :param kl_coef: weight of the KL to the frozen reference (TRL: 0.05); the reference (a copy of the policy after
        the cold start; with LoRA the base model) is only kept when ``kl_coef > 0``
    :param kl_placement: ``"reward"`` (a per-token reward penalty with the k1 estimate, InstructGPT) or ``"loss"``
        (GRPO's k3 term in the loss, weighted by ``kl_coef``)
    :param target_kl: stop the rollout's update when a minibatch's approximate KL to the sampling policy exceeds
        ``1.5 * target_kl`` (SB3's rule); ``None``: never
    :param gradient_compression: with several processes: ``None``, ``"fp16"``, ``"bf16"`` or ``"powersgd"``
    :param sharding: with several processes: ``None`` (each holds a whole replica, DDP) or ``"fsdp"`` (FSDP2: the
        weights, gradients, optimizer state and reference sharded over the processes; the same weights trained,
        see :mod:`~algorithms.common.runtime.parallel`); on one process ``"fsdp"`` trains unsharded
    :param dist_timeout: seconds a rank waits for the others before the job fails
    :param mixed_precision: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"no"`` (see :class:`~algorithms.grpo.GRPO`); the
        value head and the losses stay float32
    :param sampler_correction: ``"auto"``, ``"tis"`` or ``None`` (see :class:`~algorithms.grpo.GRPO`); the update's own
        log-probs of the rollout come from the forward pass that computes its values, at no extra cost
    :param sampler_correction_cap: the truncation cap of the TIS weights
    :param cold_start: run the SFT stage before the first iteration: ``"auto"`` (a fresh built-in model), ``True``,
        ``False``
    :param sft_steps: SFT gradient steps
    :param sft_batch_size: examples per SFT step
    :param sft_learning_rate: SFT learning rate
    :param sft_data: a JSONL file of ``{"prompt", "response"}`` rows instead of the task's gold solutions
    :param curriculum: S21's :class:`~algorithms.common.callbacks.CurriculumCallback`
    :param stats_window_size: episodes averaged in ``rollout/ep_rew_mean`` and ``rollout/success_rate``
    :param tensorboard_log: the TensorBoard folder (runs go to ``<folder>/LMPPO_<n>``)
    :param policy_kwargs: :class:`TransformerPolicy` arguments (``model``, ``temperature``, …); ``value_head`` is
        always on
    :param verbose: 0 silent, 1 progress and logs
    :param seed: seeds the model's initialisation, the sampler, the problems and the minibatch order
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``
    :param _init_setup_model: build the policy now (``load()`` passes ``False``)
    """

    policy: TransformerPolicy

    @with_trl_hints  # a TRL name (num_generations=...) raises a TypeError naming ours
    def __init__(
        self,
        policy: str | type[TransformerPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-5,
        n_groups: int = 32,
        group_size: int = 1,
        n_epochs: int = 4,
        batch_size: int | None = None,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = 0.2,
        ent_coef: float | Schedule = 0.0,
        vf_coef: float = 0.1,
        max_grad_norm: float = 0.5,
        gamma: float = 1.0,
        gae_lambda: float = 0.95,
        normalize_advantage: bool = True,
        kl_coef: float = 0.05,
        kl_placement: str = "reward",
        target_kl: float | None = None,
        gradient_compression: str | None = None,
        sharding: str | None = None,
        dist_timeout: float = 300.0,
        mixed_precision: str = "auto",
        sampler_correction: str | None = "auto",
        sampler_correction_cap: float = 2.0,
        cold_start: bool | str = "auto",
        sft_steps: int = 300,
        sft_batch_size: int = 32,
        sft_learning_rate: float = 1e-3,
        sft_data: str | None = None,
        curriculum: bool = False,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
        policy_kwargs = {} if policy_kwargs is None else policy_kwargs
        if isinstance(policy_kwargs, dict):  # anything else: LMAlgorithm's check names the fix
            if policy_kwargs.get("value_head", True) is not True:
                raise ValueError("LMPPO trains a value head: leave policy_kwargs['value_head'] out (or set it True)")
            policy_kwargs = {**policy_kwargs, "value_head": True}
        super().__init__(
            policy,
            env,
            learning_rate,
            n_groups=n_groups,
            group_size=group_size,
            max_grad_norm=max_grad_norm,
            gamma=gamma,
            gradient_compression=gradient_compression,
            sharding=sharding,
            dist_timeout=dist_timeout,
            mixed_precision=mixed_precision,
            sampler_correction=sampler_correction,
            sampler_correction_cap=sampler_correction_cap,
            cold_start=cold_start,
            sft_steps=sft_steps,
            sft_batch_size=sft_batch_size,
            sft_learning_rate=sft_learning_rate,
            sft_data=sft_data,
            curriculum=curriculum,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
        )
        check = ArgumentChecker(PPO_RULES)  # LMPPO's own arguments; the shared ones are checked by LMAlgorithm
        self.n_epochs = check("n_epochs", n_epochs)
        self.batch_size = check("batch_size", batch_size)
        self.clip_range = check("clip_range", clip_range)
        self.clip_range_vf = check("clip_range_vf", clip_range_vf)
        self.ent_coef = check("ent_coef", ent_coef)
        self.vf_coef = check("vf_coef", vf_coef)
        self.gae_lambda = check("gae_lambda", gae_lambda)
        self.normalize_advantage = check("normalize_advantage", normalize_advantage)
        self.kl_coef = check("kl_coef", kl_coef)
        self.kl_placement = check("kl_placement", kl_placement)
        self.target_kl = check("target_kl", target_kl)
        self._explained_variance = float("nan")
        self._sampler_kl = float("nan")  # train/sampler_kl of the last rollout
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)
        self.ent_coef = FloatSchedule(self.ent_coef)

    def _needs_reference(self) -> bool:
        return self.kl_coef > 0

    # ------------------------------------------------------------------ advantages
    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """Every completion of the rollout, with its per-token values at sampling time, GAE advantages and targets.

        Each row's score is its turn's return to the end of the episode (one turn: the env's reward); the per-token
        KL penalty and the score make the token rewards (:func:`objective.token_rewards`)."""
        n_episodes = self._local_groups * self.group_size
        episodes = episode_returns(rows, n_episodes, self.gamma)  # (E,) for the logs
        log_rollout(self.logger, self._dist, self._dist.gather(episodes).view(-1, self.group_size), rows.masks,
                    rows.infos, generation_seconds)  # fmt: skip
        zeros = th.zeros(n_episodes)
        groups = self._dist.rank * self._local_groups + th.arange(n_episodes) // self.group_size  # (E,)
        batch = rows_to_batch(rows, list(range(len(rows.episodes))), zeros, zeros, groups, self.policy.pad_token_id,
                              self.device)  # fmt: skip
        mask = batch.completion_mask
        with th.no_grad():
            args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)
            update_log_probs, _, batch.values = self.policy.log_probs_and_values(*args)  # (N, C) each
            ref_log_probs = self._reference_log_probs(batch) if self.kl_coef > 0 else None  # (N, C)
        self._sampler_kl = float(correction.sampler_kl(update_log_probs, batch.old_log_probs, mask))
        if self._sampler_correction == "tis":  # the ratio against the update's own log-probs, tokens weighted
            batch = correction.corrected(batch, update_log_probs, self.sampler_correction_cap)
        kl = None if ref_log_probs is None else th.where(mask, batch.old_log_probs - ref_log_probs, 0.0)  # (N, C) k1
        in_reward = self.kl_placement == "reward"
        rewards = objective.token_rewards(self._row_scores(rows), mask, kl, self.kl_coef if in_reward else 0.0)
        advantages, batch.returns = objective.gae(rewards, batch.values, mask, self.gamma, self.gae_lambda)
        batch.advantages = objective.whiten(advantages, mask) if self.normalize_advantage else advantages
        batch.ref_log_probs = None if in_reward else ref_log_probs
        self._explained_variance = float(explained_variance(batch.values[mask].cpu().numpy(),
                                                            batch.returns[mask].cpu().numpy()))  # fmt: skip
        self.logger.record("rollout/values", batch.values[mask].mean().item())
        if kl is not None:
            self.logger.record("rollout/kl", kl[mask].mean().item())
        return batch

    def _row_scores(self, rows: Rows) -> th.Tensor:
        """``(N,)`` each row's return from its turn to the end of its episode (turn ``t`` discounted by gamma)."""
        n_episodes = self._local_groups * self.group_size
        turn_rewards = th.zeros((n_episodes, max(rows.turns) + 1))  # (E, U)
        played = th.zeros_like(turn_rewards, dtype=th.bool)
        turn_rewards[rows.episodes, rows.turns] = th.as_tensor(rows.rewards, dtype=th.float32)
        played[rows.episodes, rows.turns] = True
        to_go = objective.returns_to_go(turn_rewards, self.gamma, played)  # (E, U)
        return to_go[rows.episodes, rows.turns].to(self.device)  # (N,)

    # ------------------------------------------------------------------ update
    def train(self) -> None:
        """``n_epochs`` passes over the rollout in minibatches of ``batch_size`` completions; each minibatch one
        optimizer step on the clipped surrogate + ``vf_coef`` x the value loss (SB3's ``target_kl`` stop)."""
        assert self._rollout is not None, "collect_rollouts() must run before train()"
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        progress = self._current_progress_remaining
        clip_range, ent_coef = self.clip_range(progress), self.ent_coef(progress)
        clip_range_vf = self.clip_range_vf(progress) if self.clip_range_vf is not None else None
        self._start_gradient_sync()
        history: dict[str, list[float]] = {}
        stopped = False
        for _ in range(self.n_epochs):
            parts = minibatches(self._rollout, self.batch_size, False, "token", self._seeds.generator, self._dist)
            for minibatch, share in parts:
                loss, stats = self._loss(minibatch, clip_range, clip_range_vf, ent_coef)
                approx_kl = self._dist.sum(float(stats["approx_kl"])) / self._dist.world_size
                if self.target_kl is not None and approx_kl > 1.5 * self.target_kl:
                    stopped = True  # SB3: stop before this step; every rank sees the same mean and stops with it
                    break
                grad_norm = self._optimizer_step(loss * share)
                if th.isfinite(grad_norm):
                    stats["grad_norm"] = grad_norm
                for key, value in {"loss": loss, **stats}.items():
                    history.setdefault(key, []).append(float(value.detach()))
            if stopped:
                break
        self._log_train(history, clip_range, clip_range_vf, stopped)

    def _loss(self, minibatch: RolloutBatch, clip_range: float, clip_range_vf: float | None, ent_coef: float):
        """The minibatch's loss and stats under the current weights (one forward: log-probs and values)."""
        args = (minibatch.prompt_ids, minibatch.prompt_mask, minibatch.completion_ids, minibatch.completion_mask)
        log_probs, entropy, values = self.policy.log_probs_and_values(*args, with_entropy=ent_coef != 0)
        assert minibatch.values is not None
        loss, stats = objective.ppo_loss(
            log_probs,
            minibatch.old_log_probs,
            minibatch.advantages,  # (B, C)
            values,
            minibatch.values,
            minibatch.returns,  # (B, C)
            minibatch.completion_mask,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            vf_coef=self.vf_coef,
            ent_coef=ent_coef,
            entropy=entropy,
            ref_logp=minibatch.ref_log_probs,
            kl_coef=self.kl_coef,
            sampler_weights=minibatch.sampler_weights,
        )
        if "entropy" not in stats:  # no entropy bonus: estimate it from the sampled tokens, -E[log p]
            stats["entropy"] = -minibatch.old_log_probs[minibatch.completion_mask].mean()
        return loss, stats

    def _log_train(
        self, history: dict[str, list[float]], clip_range: float, clip_range_vf: float | None, stopped: bool
    ) -> None:
        for key, value in history.items():
            self.logger.record(f"train/{key}", float(np.mean(value)))
        self.logger.record("train/explained_variance", self._explained_variance)
        self.logger.record("train/sampler_kl", self._sampler_kl)
        self.logger.record("train/skipped_steps", self._skipped_steps)
        self.logger.record("train/optimizer_steps", len(history.get("loss", [])))
        self.logger.record("train/early_stop", float(stopped))
        self.logger.record("train/kl_coef", self.kl_coef)
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
