"""GRPO: Group Relative Policy Optimization (Shao et al., 2024) with the Stable-Baselines3 API.

The class that wires the data flow and holds the SB3 surface; the steps themselves live in modules named for
them: rollouts in :mod:`algorithms.common.lm_algorithm` / :mod:`algorithms.common.rollout.rows`, dynamic sampling
in :mod:`algorithms.grpo.sampling`, advantages in :mod:`algorithms.grpo.advantages`, the seed's controls in
:mod:`algorithms.grpo.controls`, the update in :mod:`algorithms.grpo.update` (loss: :mod:`algorithms.grpo.objective`),
replay in :mod:`algorithms.grpo.replay`.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch as th
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common import sampler_correction as correction
from algorithms.common.arguments import ArgumentChecker
from algorithms.common.lm_algorithm import LMAlgorithm
from algorithms.common.policies import TransformerPolicy
from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.common.rollout.batch import RolloutBatch, rows_to_batch
from algorithms.common.rollout.prompt_pool import LearnabilityPool
from algorithms.common.rollout.rows import TEXT_ONLY, Rows, episode_returns, log_rollout
from algorithms.common.schedules import UpdateDecay
from algorithms.common.trl_names import with_trl_hints
from algorithms.grpo import advantages, controls, replay, trl_port, update
from algorithms.grpo.arguments import GRPO_RULES
from algorithms.grpo.sampling import RolloutSampling, truncated_rows


class GRPO(LMAlgorithm):
    """Group Relative Policy Optimization for language models on ``R1Zero-v0``-style envs.

    One iteration: ``n_groups`` (K) problems, ``group_size`` (G) completions each, all sampled in one batch
    whatever the number of envs; rewards from ``env.step``; advantages relative to each group
    (:func:`~algorithms.grpo.advantages.group_advantages`); the clipped surrogate with a k3 KL penalty to a frozen
    reference and an entropy bonus (:func:`~algorithms.grpo.objective.grpo_loss`); global gradient clipping; an
    optimizer step per minibatch.
    No value network: GRPO builds on :class:`~algorithms.common.lm_algorithm.LMAlgorithm` rather than SB3's
    ``OnPolicyAlgorithm``, whose ``RolloutBuffer`` and GAE do not fit completions scored per group.
    ``num_timesteps`` counts completions (one env step each). With a freshly initialised built-in model the first
    ``learn()`` runs the cold-start SFT stage (S20.1) before GRPO. The options' details are in the README.

    :param policy: ``"TransformerPolicy"`` or the class
    :param env: an env, a VecEnv or a registered id (``"R1Zero-v0"``); sequence action mode
    :param learning_rate: learning rate, constant or an SB3 schedule of the remaining progress
    :param n_groups: K, problems per rollout (S7: 4)
    :param group_size: G, completions per problem (8)
    :param n_epochs: passes over each rollout (1: every update on-policy, as the published GRPO default)
    :param batch_size: completions per minibatch (``None``: the whole rollout, one update per epoch)
    :param clip_range: the lower clip epsilon of the importance ratio (0.2), constant or schedule
    :param clip_range_high: the upper clip epsilon (``None``: same as ``clip_range``; DAPO's clip-higher: 0.28)
    :param beta: weight of the k3 KL penalty to the reference (DeepSeekMath: 0.04; TRL: 0): a frozen copy of the
        policy after the cold start, built only when ``beta > 0``; with LoRA the base model (adapters disabled)
    :param ent_coef: entropy bonus weight: a float, an SB3 schedule, or an :class:`UpdateDecay` (default S23:
        0.01 decaying to 0.001 over 10,000 updates)
    :param max_grad_norm: global gradient-norm clip (S13: 0.5)
    :param vf_coef: weight of the value head's MSE to the episode return, when the policy has one
        (``policy_kwargs={"value_head": True}``, S9's FP32 value network)
    :param gamma: discount over the turns of a multi-turn episode (S23: 0.99 generation, 0.95 dialogue)
    :param advantage_scale: ``"group"`` (divide by the group std: GRPO), ``"batch"`` (by the rollout std) or
        ``"none"`` (Dr. GRPO)
    :param loss_aggregation: ``"sequence"`` (GRPO paper), ``"token"`` (DAPO) or ``"constant"`` (Dr. GRPO)
    :param drop_uniform_groups: leave groups whose rewards are all equal out of the update (S29)
    :param importance_level: ``"token"`` (GRPO: a ratio per token) or ``"sequence"`` (GSPO, Zheng et al. 2025: the
        length-normalised sequence ratio ``exp(mean_t(log pi - log pi_old))`` at every token, clipped by the
        ``sequence_clip_range*`` arguments)
    :param sequence_clip_range: GSPO's lower clip epsilon of the sequence ratio (the paper's 3e-4)
    :param sequence_clip_range_high: GSPO's upper clip epsilon of the sequence ratio (the paper's 4e-4)
    :param dynamic_sampling: DAPO's dynamic sampling, refilling: groups whose rewards are all equal are replaced by
        groups of new problems until none is or ``max_resample_rounds`` rounds are spent (the rest are left out);
        needs ``group_size`` to be a multiple of the number of envs (:mod:`~algorithms.grpo.sampling`)
    :param max_resample_rounds: the most refill rounds per rollout (their completions count in ``num_timesteps``)
    :param mask_truncated: leave completions cut at ``max_new_tokens`` without EOS out of the loss (DAPO's overlong
        filtering); they still count in their group's advantages
    :param prompt_sampling: ``"uniform"`` (the env's stream) or ``"learnability"``: ``fresh_prompt_fraction`` of each
        rollout's problems fresh, the rest from a pool of recent ones with probability ``p (1 - p) + 0.01``
        (:class:`~algorithms.common.rollout.prompt_pool.LearnabilityPool`)
    :param prompt_pool_size: the problems the learnability pool holds
    :param fresh_prompt_fraction: the share of each rollout's problems drawn fresh under ``"learnability"``
    :param competition: competition between groups: ``None`` (off), ``"fixed"`` (S10: the winning group's
        advantages x ``competition_coef``, see :func:`~algorithms.grpo.controls.winning_groups`) or ``"adaptive"``
        (S11: the coefficient follows the between-group reward variance, in [0.8, 1.5])
    :param competition_coef: S10's coefficient (1.2)
    :param diversity_guard: S12: when the spread of per-group mean entropies exceeds ``diversity_threshold``,
        leave out the groups whose rewards carry no signal (all equal); logged as ``diversity/*``
    :param diversity_threshold: S12's spread (0.15)
    :param update_mode: ``"joint"`` (one step on all groups, as published) or ``"sequential"`` (S14: one step
        per group, in turn)
    :param advantage_baseline: ``"group"`` (the group's mean reward, GRPO), ``"value"`` (S9: the value head's
        estimate for the prompt; needs ``policy_kwargs={"value_head": True}``) or ``"leave_one_out"`` (RLOO)
    :param reward_ramp: S20.2: the reward-model (consistency) weight starts at 0 and rises by 0.05 every 1000
        timesteps up to the env's configured weight
    :param protected_rollouts: S20.3: the first rollouts are sampled by the frozen cold-start policy (the seed's
        "first 3 groups" read as the first 3 rollouts); the importance ratio corrects for it
    :param curriculum: S21: a :class:`~algorithms.common.callbacks.CurriculumCallback` sets the difficulty of
        every env from the rolling success rate (``curriculum/difficulty``)
    :param diagnostics: S24: per-group reward histograms, gradient norms and their spread, "group stability"
        (S18) and warnings; the update is then accumulated group by group (the same gradient)
    :param replay_ratio: fraction of each update's completions replayed from a prioritized trajectory buffer (S3,
        S5; :mod:`~algorithms.grpo.replay`): their sampling log-probs, their group's advantage times an
        importance weight; 0 (default) is published GRPO
    :param max_replay_age: completions collected more than this many iterations ago are evicted before sampling
    :param replay_buffer_kwargs: arguments of the buffer (``capacity``, ``max_tokens``, ``alpha``, ...)
    :param gradient_compression: with several processes (S17, :mod:`~algorithms.common.runtime.distributed`):
        ``None``, ``"fp16"``, ``"bf16"`` or ``"powersgd"`` (PyTorch's DDP communication hooks)
    :param sharding: with several processes: ``None`` (each holds a whole replica, DDP) or ``"fsdp"`` (FSDP2: the
        weights, gradients, optimizer state and reference sharded over the processes; the same weights trained,
        see :mod:`~algorithms.common.runtime.parallel`); on one process ``"fsdp"`` trains unsharded
    :param dist_timeout: seconds a rank waits for the others before the job fails (a hung rank ends the job)
    :param mixed_precision: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"no"`` (S15): forward passes under autocast,
        weights, optimizer and loss in float32 (:mod:`~algorithms.common.runtime.precision`; the choice of
        ``"auto"`` is in ``model.precision``); a step with non-finite gradients is skipped and counted
    :param sampler_correction: the sampler/trainer mismatch correction (:mod:`~algorithms.common.sampler_correction`):
        ``"tis"`` (truncated importance sampling: the ratio taken against the update's own log-probs of the fresh
        rollout, one extra forward pass, each token's loss weighted by ``min(pi_old / pi_sampler, cap)``), ``None``
        (off: the ratio against the sampler's log-probs; ``mixed_precision="auto"`` then samples and updates in one
        precision) or ``"auto"`` (``"tis"`` exactly when sampling and update run in different precisions). The
        mismatch is logged every update as ``train/sampler_kl``
    :param sampler_correction_cap: the truncation ``cap`` of the TIS weights (TRL's and verl's 2)
    :param cold_start: run the SFT stage before the first GRPO iteration: ``"auto"`` (only for a freshly
        initialised built-in model), ``True`` or ``False``
    :param sft_steps: SFT gradient steps (the seed preset: 5000)
    :param sft_batch_size: examples per SFT step
    :param sft_learning_rate: SFT learning rate
    :param sft_data: a JSONL file of ``{"prompt", "response"}`` rows to use instead of the task's gold solutions
    :param stats_window_size: episodes averaged in ``rollout/ep_rew_mean`` and ``rollout/success_rate``
    :param tensorboard_log: the TensorBoard folder (runs go to ``<folder>/GRPO_<n>``)
    :param policy_kwargs: :class:`TransformerPolicy` arguments (``model``, ``temperature``, ``top_p``, …)
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
        n_groups: int = 4,
        group_size: int = 8,
        n_epochs: int = 1,
        batch_size: int | None = None,
        clip_range: float | Schedule = 0.2,
        clip_range_high: float | Schedule | None = None,
        beta: float = 0.04,
        ent_coef: float | Schedule | UpdateDecay = UpdateDecay(0.01, 0.001, 10_000),  # noqa: B008
        max_grad_norm: float = 0.5,
        vf_coef: float = 0.5,
        gamma: float = 0.99,
        advantage_scale: str = "group",
        loss_aggregation: str = "sequence",
        drop_uniform_groups: bool = False,
        importance_level: str = "token",
        sequence_clip_range: float = 3e-4,
        sequence_clip_range_high: float = 4e-4,
        dynamic_sampling: bool = False,
        max_resample_rounds: int = 3,
        mask_truncated: bool = False,
        prompt_sampling: str = "uniform",
        prompt_pool_size: int = 256,
        fresh_prompt_fraction: float = 0.25,
        competition: str | None = None,
        competition_coef: float = controls.COMPETITION_COEF,
        diversity_guard: bool = False,
        diversity_threshold: float = controls.DIVERSITY_SPREAD,
        update_mode: str = "joint",
        advantage_baseline: str = "group",
        reward_ramp: bool = False,
        protected_rollouts: int = 0,
        curriculum: bool = False,
        diagnostics: bool = False,
        replay_ratio: float = 0.0,
        max_replay_age: int = 10,
        replay_buffer_kwargs: dict[str, Any] | None = None,
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
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
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
        check = ArgumentChecker(GRPO_RULES)  # GRPO's own arguments; the shared ones are checked by LMAlgorithm
        self.group_size = check("group_size", group_size)
        self.n_epochs = check("n_epochs", n_epochs)
        self.batch_size = check("batch_size", batch_size)
        self.clip_range = check("clip_range", clip_range)
        self.clip_range_high = check("clip_range_high", clip_range_high)
        self.beta = check("beta", beta)
        self.ent_coef = check("ent_coef", ent_coef)
        self.vf_coef = check("vf_coef", vf_coef)
        self.advantage_scale = check("advantage_scale", advantage_scale)
        self.loss_aggregation = check("loss_aggregation", loss_aggregation)
        self.drop_uniform_groups = check("drop_uniform_groups", drop_uniform_groups)
        self.importance_level = check("importance_level", importance_level)
        self.sequence_clip_range = check("sequence_clip_range", sequence_clip_range)
        self.sequence_clip_range_high = check("sequence_clip_range_high", sequence_clip_range_high)
        self.dynamic_sampling = check("dynamic_sampling", dynamic_sampling)
        self.max_resample_rounds = check("max_resample_rounds", max_resample_rounds)
        self.mask_truncated = check("mask_truncated", mask_truncated)
        self.prompt_sampling = check("prompt_sampling", prompt_sampling)
        self.prompt_pool_size = check("prompt_pool_size", prompt_pool_size)
        self.fresh_prompt_fraction = check("fresh_prompt_fraction", fresh_prompt_fraction)
        self.competition = check("competition", competition)
        self.competition_coef = check("competition_coef", competition_coef)
        self.diversity_guard = check("diversity_guard", diversity_guard)
        self.diversity_threshold = check("diversity_threshold", diversity_threshold)
        self.update_mode = check("update_mode", update_mode)
        self.advantage_baseline = check("advantage_baseline", advantage_baseline)
        self.reward_ramp = check("reward_ramp", reward_ramp)
        self.protected_rollouts = check("protected_rollouts", protected_rollouts)
        self.diagnostics = check("diagnostics", diagnostics)
        if self.diagnostics and self.sharding == "fsdp":  # backward_by_group reads whole per-group gradients
            raise ValueError(
                "diagnostics=True measures each group's whole gradient: not with sharding='fsdp'; "
                "pass diagnostics=False (or sharding=None)"
            )
        self.replay_ratio = check("replay_ratio", replay_ratio)
        self.max_replay_age = check("max_replay_age", max_replay_age)
        self.replay_buffer_kwargs = dict(check("replay_buffer_kwargs", replay_buffer_kwargs) or {})
        self._between_variance = 0.0  # running mean of the between-group reward variance (S11's reference)
        self._reward_model_target: float | None = None  # the configured weight that reward_ramp rises to
        self.replay_buffer: PrioritizedTrajectoryBuffer | None = None
        self._prompt_pool: LearnabilityPool | None = None
        self._groups_seen = 0
        if _init_setup_model:
            self._setup_model()

    state_attributes = (*LMAlgorithm.state_attributes, "_between_variance", "_reward_model_target", "_groups_seen")

    # ------------------------------------------------------------------ setup, save and load
    def _setup_model(self) -> None:
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_high is not None:
            self.clip_range_high = FloatSchedule(self.clip_range_high)
        if not isinstance(self.ent_coef, UpdateDecay):
            self.ent_coef = FloatSchedule(self.ent_coef)
        if self.advantage_baseline == "value" and self.policy.value_net is None:
            raise ValueError("advantage_baseline='value' needs a value head: policy_kwargs={'value_head': True}")
        if self.dynamic_sampling and self.env is not None and self.group_size % self.env.num_envs:
            raise ValueError(
                f"dynamic_sampling replaces whole groups: group_size ({self.group_size}) must be a multiple of the "
                f"number of envs ({self.env.num_envs})"
            )
        if self.prompt_sampling == "learnability":
            pool_seed = self._seeds.seed
            self._prompt_pool = LearnabilityPool(self.prompt_pool_size, self.fresh_prompt_fraction, seed=pool_seed)
        self._sampling = RolloutSampling(
            self.dynamic_sampling, self.max_resample_rounds, self._prompt_pool, self.group_size, self._local_groups,
            self.gamma, self._dist,
        )  # fmt: skip
        if self.replay_ratio > 0:
            kwargs = {"seed": self.seed, "pad_id": self.policy.pad_token_id, **self.replay_buffer_kwargs}
            self.replay_buffer = PrioritizedTrajectoryBuffer(**kwargs)

    def _needs_reference(self) -> bool:
        return self.beta > 0 or self.protected_rollouts > 0

    def get_run_state(self) -> tuple[dict[str, Any], dict[str, th.Tensor]]:
        """:meth:`~algorithms.common.base_class.LMBaseAlgorithm.get_run_state`, with the prompt pool (plain data)."""
        state, rng = super().get_run_state()
        state["_prompt_pool_state"] = None if self._prompt_pool is None else self._prompt_pool.get_state()
        return state, rng

    def set_run_state(self, state: dict[str, Any], rng: dict[str, th.Tensor]) -> None:
        super().set_run_state(state, rng)
        if state.get("_prompt_pool_state") is not None and self._prompt_pool is not None:
            self._prompt_pool.set_state(state["_prompt_pool_state"])

    @classmethod
    def from_trl(
        cls, model: Any, reward_funcs: Any, args: Any = None, train_dataset: Any = None, **kwargs: Any
    ) -> GRPO:
        """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, ...)`` as a GRPO model on ``R1Zero-v0``; then
        ``model.learn(total_timesteps)`` trains (timesteps count completions). Arguments, and what it builds:
        :func:`algorithms.grpo.trl_port.from_trl`."""
        return trl_port.from_trl(cls, model, reward_funcs, args, train_dataset, **kwargs)

    def save_replay_buffer(self, path: str | os.PathLike) -> None:
        """Write the replay buffer to ``path`` (one ``.npz``), like SB3's off-policy ``save_replay_buffer``."""
        if self.replay_buffer is None:
            raise ValueError("this model has no replay buffer (replay_ratio=0)")
        self.replay_buffer.save(path)

    def load_replay_buffer(self, path: str | os.PathLike) -> None:
        """Read a replay buffer written by :meth:`save_replay_buffer` into this model."""
        self.replay_buffer = PrioritizedTrajectoryBuffer.load(path, vocab_size=self.policy.vocab_size)

    # ------------------------------------------------------------------ rollouts
    def _before_rollout(self, env: VecEnv) -> None:
        """S20.2: set the consistency (reward-model) weight of every env to its value at ``num_timesteps``."""
        if not self.reward_ramp:
            return
        if self._reward_model_target is None:
            self._reward_model_target = env.get_attr("reward_fn", indices=[0])[0].weights["consistency"]
        weight = controls.reward_model_weight(self._reward_model_target, self.num_timesteps)
        env.env_method("set_reward_weights", {"consistency": weight})
        self.logger.record("train/reward_model_weight", weight)

    def _problem_keys(self, n: int) -> list[dict[str, Any]]:
        """The env's stream (``"uniform"``), or the prompt pool's choice plus fresh problems at the current level."""
        if self._prompt_pool is None:
            return super()._problem_keys(n)
        level = float(self.env.get_attr("difficulty", indices=[0])[0])

        def fresh(m: int) -> list[dict[str, Any]]:
            return [{**key, "difficulty": level} for key in self._seeds.problem_keys(m)]

        return [key for _, key in self._prompt_pool.draw(n, fresh)]

    def _samples_from_reference(self) -> bool:
        """S20.3: the frozen cold-start policy (the reference; with LoRA the base model) samples the first
        ``protected_rollouts`` rollouts."""
        if not self.protected_rollouts:
            return False
        protected = self._iteration < self.protected_rollouts
        self.logger.record("rollout/protected", float(protected))
        return protected

    def _after_play(self, env, callback, rows: Rows, finished: list, problems: list) -> float | None:
        """Dynamic sampling's refill rounds and the prompt pool's update
        (:class:`~algorithms.grpo.sampling.RolloutSampling`); each refill round is played by
        :meth:`~algorithms.common.lm_algorithm.LMAlgorithm._play_again`."""
        generator_state = self._seeds.generator.get_state()
        play = functools.partial(self._play_again, env, callback, finished, problems)
        seconds = self._sampling.after_play(rows, play, self.logger)
        self._seeds.generator.set_state(generator_state)  # the update's shuffling as without refills
        return seconds

    # ------------------------------------------------------------------ advantages
    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """Advantages from the episodes' discounted returns, grouped by problem; one row per kept completion.

        Statistics that cross groups (batch-scaled advantages, competition, the diversity guard, the logs) are
        computed on every rank's groups (all-gathered, K of them); this process keeps the rows of its own."""
        local, group = self._local_groups, self.group_size
        returns = episode_returns(rows, local * group, self.gamma).view(local, group)  # (K_local, G)
        returns = self._dist.gather(returns)  # (K, G): every rank's groups, in rank order
        mine = slice(self._dist.rank * local, (self._dist.rank + 1) * local)
        scores = self._advantages(rows, returns)  # (K, G)
        uniform = advantages.uniform_group_mask(returns)  # (K,)
        left_out = self._left_out_groups(rows, returns, uniform)[mine].tolist()
        cut = truncated_rows(rows, [self.policy.eos_token_id]) if self.mask_truncated else [False] * len(rows.infos)
        keep = [i for i, e in enumerate(rows.episodes) if not left_out[e // group] and not cut[i]]
        self._placeholder = not keep  # this rank's groups all left out: one row with no weight keeps ranks in step
        keep = keep or [0]
        log_rollout(self.logger, self._dist, returns, [rows.masks[i] for i in keep], rows.infos, generation_seconds)
        self.logger.record("rollout/frac_uniform_groups", uniform.float().mean().item())
        if self.mask_truncated:
            self.logger.record("rollout/truncated_fraction", self._dist.sum(sum(cut)) / self._dist.sum(len(cut)))
        if self.diagnostics:  # S24: one reward histogram per group
            for k, group_returns in enumerate(returns.cpu().numpy()):
                self.logger.record(f"groups/rewards_{k}", group_returns, exclude=TEXT_ONLY)
        first_group = self._groups_seen + self._dist.rank * local  # group ids across rollouts and ranks
        self._groups_seen += self.n_groups
        groups = first_group + th.arange(local * group) // group  # (K_local*G,)
        return rows_to_batch(
            rows, keep, scores[mine].flatten(), returns[mine].flatten(), groups, self.policy.pad_token_id, self.device
        )

    def _advantages(self, rows: Rows, returns: th.Tensor) -> th.Tensor:
        """``(K, G)`` advantages of the ``(K, G)`` returns: relative to the group (or S9's value baseline, or RLOO's
        leave-one-out mean), then S10/S11's competition between groups."""
        baseline = None
        if self.advantage_baseline == "value":  # S9: the value head's estimate of each group's prompt
            baseline = self._dist.gather(advantages.value_baseline(self.policy, rows, self.group_size))  # (K, G)
            self.logger.record("train/value_baseline", baseline.mean().item())
        loo = self.advantage_baseline == "leave_one_out"  # RLOO
        scores = advantages.relative_advantages(returns, self.advantage_scale, baseline, loo)  # (K, G)
        if self.competition is None:
            return scores
        result = controls.competition(returns, self.competition, self.competition_coef, self._between_variance)
        self._between_variance = result.between_variance
        self.logger.record("train/competition_coef", result.coef)
        self.logger.record("train/winning_groups", int((result.scale != 1).sum()))
        return scores * result.scale[:, None]  # (K, G)

    def _left_out_groups(self, rows: Rows, returns: th.Tensor, uniform: th.Tensor) -> th.Tensor:
        """``(K,)`` the groups the update leaves out: uniform ones (``drop_uniform_groups``, and what dynamic
        sampling could not fix) and S12's diversity guard's."""
        dropped = None
        if self.diversity_guard:
            entropies = controls.first_turn_entropies(rows, self.group_size, self._local_groups)  # (K_local,)
            entropies = self._dist.gather(entropies)  # (K,)
            dropped, spread = controls.diversity_left_out(entropies, returns, self.diversity_threshold)
            self.logger.record("diversity/entropy_spread", spread)
            self.logger.record("diversity/triggered", float(spread > self.diversity_threshold))
            self.logger.record("diversity/dropped_groups", int(dropped.sum()))
        drop_uniform = self.drop_uniform_groups or self.dynamic_sampling
        return advantages.left_out_groups(uniform, drop_uniform, dropped)

    # ------------------------------------------------------------------ update
    def train(self) -> None:
        """GRPO update on the last rollout: ``n_epochs`` passes in minibatches of ``batch_size`` completions."""
        assert self._rollout is not None, "collect_rollouts() must run before train()"
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        settings = self._loss_settings()
        self._start_gradient_sync()
        fresh = batch = self._rollout
        sampler_kl = None  # measured before the first step: on the whole fresh rollout, or on the first minibatch
        if self._sampler_correction == "tis":
            fresh, sampler_kl = correction.correct_fresh_rollout(self.policy, fresh, self.sampler_correction_cap)
            batch = fresh
        drawn = None
        if self.replay_buffer is not None:
            args = (self.replay_buffer, len(fresh), self.replay_ratio, self._iteration, self.max_replay_age)
            drawn = replay.draw(*args, self.device, self.logger)
        if drawn is not None:
            batch = fresh.concat(drawn)
        if self.beta > 0:
            batch.ref_log_probs = self._reference_log_probs(batch)
        history: dict[str, list[float]] = {}
        drifts: dict[int, float] = {}  # replayed slot -> mean |log ratio| per token, from its last minibatch
        for _ in range(self.n_epochs):
            parts = update.minibatches(
                batch,
                self.batch_size,
                self.update_mode == "sequential",
                self.loss_aggregation,
                self._seeds.generator,
                self._dist,
                self._placeholder,
            )
            for minibatch, share in parts:
                loss, stats, log_probs = self._step(minibatch, settings, share)
                if sampler_kl is None:  # no correction: the first minibatch's forward ran before any step
                    sampler_kl = correction.minibatch_sampler_kl(minibatch, log_probs)
                if minibatch.slots is not None:
                    drifts.update(replay.drift(log_probs.detach(), minibatch))
                for key, value in {"loss": loss, **stats}.items():
                    history.setdefault(key, []).append(float(value.detach()) if th.is_tensor(value) else float(value))
        if self.replay_buffer is not None:
            replay.update_and_store(self.replay_buffer, fresh, drawn, drifts, self._iteration)
        history["sampler_kl"] = [float(sampler_kl)]
        update.log_train(self.logger, history, settings, self._skipped_steps, self._n_updates, self.diagnostics)

    def _loss_settings(self) -> update.LossSettings:
        """The loss's coefficients at the current progress (and update count, for :class:`UpdateDecay`)."""
        progress = self._current_progress_remaining
        clip_low = self.clip_range(progress)
        clip_high = self.clip_range_high(progress) if self.clip_range_high is not None else clip_low
        ent_coef = self.ent_coef(self._n_updates) if isinstance(self.ent_coef, UpdateDecay) else self.ent_coef(progress)
        if self.importance_level == "sequence":  # GSPO clips the sequence ratio, with its own (much smaller) range
            clip_low, clip_high = self.sequence_clip_range, self.sequence_clip_range_high
        return update.LossSettings(
            clip_low, clip_high, ent_coef, self.beta, self.loss_aggregation, self.vf_coef, self.importance_level
        )

    def _step(self, minibatch: RolloutBatch, settings: update.LossSettings, share: float):
        """One optimizer step on a minibatch (group by group with the diagnostics); its loss, stats, log-probs."""
        if self.diagnostics:
            scale = 1.0 if self._scaler is None else float(self._scaler.get_scale())
            loss, stats, log_probs, groups = update.backward_by_group(self.policy, minibatch, settings, share, scale)
            update.log_group_gradients(self.logger, groups)
            grad_norm = self._optimizer_step(None)
        else:
            loss, stats, log_probs = update.minibatch_loss(self.policy, minibatch, settings)
            grad_norm = self._optimizer_step(loss * share)
        if "entropy" not in stats:  # no entropy bonus: estimate it from the sampled tokens, -E[log p]
            stats["entropy"] = -minibatch.old_log_probs[minibatch.completion_mask].mean()
        if th.isfinite(grad_norm):  # a skipped step's norm (inf or NaN) is counted, not averaged
            stats["grad_norm"] = grad_norm
        return loss, stats, log_probs
