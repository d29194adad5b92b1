"""GRPO: Group Relative Policy Optimization (Shao et al., 2024) with the Stable-Baselines3 API.

One iteration, as ``learn`` (:meth:`LMBaseAlgorithm.learn <algorithms.common.base_class.LMBaseAlgorithm.learn>`)
runs it, each step in the module that does it: collect a rollout
(:mod:`algorithms.common.rollout_collection`; dynamic sampling and the other sampling options:
:mod:`algorithms.grpo.sampling`), score it (:mod:`algorithms.grpo.advantages`: returns, group-relative advantages,
the rows kept), update the policy (:mod:`algorithms.grpo.update`, the loss :func:`~algorithms.grpo.update.grpo_loss`;
replay: :mod:`algorithms.grpo.replay`), log. The original design's controls: :mod:`algorithms.grpo.controls`.
"""

from __future__ import annotations

import os
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import GymEnv

from algorithms.common.base_class import LMBaseAlgorithm, Step, step_stats
from algorithms.common.losses import PolicyOutputs, UpdateLoss
from algorithms.common.policies import TransformerPolicy
from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.common.rollout.prompt_pool import LearnabilityPool
from algorithms.common.rollout.rows import Rows
from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import diagnostics, replay, trl_port, update
from algorithms.grpo.advantages import GroupScoring
from algorithms.grpo.arguments import GRPO_ARGUMENTS
from algorithms.grpo.sampling import GRPOSampling


class GRPO(LMBaseAlgorithm):
    __doc__ = f"""Group Relative Policy Optimization for language models on ``R1Zero-v0``-style envs.

    One iteration: ``n_groups`` (K) problems, ``group_size`` (G) completions each, all sampled in one batch
    whatever the number of envs; rewards from ``env.step``; advantages relative to each group
    (:func:`~algorithms.common.advantages.group_advantages`); the clipped surrogate with a k3 KL penalty to a frozen
    reference and an entropy bonus (:func:`~algorithms.grpo.update.grpo_loss`); global gradient clipping; an
    optimizer step per minibatch. No value network: GRPO builds on
    :class:`~algorithms.common.base_class.LMBaseAlgorithm` rather than SB3's ``OnPolicyAlgorithm``, whose
    ``RolloutBuffer`` and GAE do not fit completions scored per group. ``num_timesteps`` counts completions (one
    env step each). With a freshly initialised built-in model the first ``learn()`` runs the cold-start SFT stage
    before GRPO. The options' details are in the docs (docs/algorithms.md).

    The arguments (declared once, with their defaults and rules: :mod:`algorithms.grpo.arguments`):

    {GRPO_ARGUMENTS.docstring()}
    """

    policy: TransformerPolicy
    algo_name, config_file = "grpo", "grpo.yml"
    schedules = ("clip_range", "clip_range_high", "ent_coef")
    arguments = GRPO_ARGUMENTS
    _replayed: tuple[RolloutBatch, RolloutBatch | None, dict[int, float]] | None = None  # the update's replay, if any
    #: the run state's entries of the advantages step, the reward ramp and the prompt pool (:meth:`get_run_state`)
    run_state_keys = (*LMBaseAlgorithm.run_state_keys, "_between_variance", "_groups_seen", "_reward_model_target",
                      "_prompt_pool_state")  # fmt: skip

    @GRPO_ARGUMENTS.constructor  # the table's signature; num_generations=... names ours
    def __init__(self, policy: str | type[TransformerPolicy], env: GymEnv | str | None, **kwargs: Any) -> None:
        # every argument checked once, by its rule, and stored by name
        super().__init__(policy, env, **GRPO_ARGUMENTS.values_in(kwargs))
        #: the advantages step, rows to the batch the update trains on: see :mod:`algorithms.grpo.advantages`
        self.scoring = GroupScoring(
            group_size=self.group_size,  # as its rule read it (8.0 is 8)
            n_groups=self.n_groups,
            dist=self._dist,
            gamma=self.gamma,
            advantage_scale=self.advantage_scale,
            advantage_baseline=self.advantage_baseline,
            drop_uniform=self.dynamic_sampling,
            mask_truncated=self.mask_truncated,
            turn_credit=self.turn_credit,
            competition=self.competition,
            competition_coef=self.competition_coef,
            diversity_guard=self.diversity_guard,
            diversity_threshold=self.diversity_threshold,
            diagnostics=self.diagnostics,
        )
        self.replay_buffer: PrioritizedTrajectoryBuffer | None = None
        self._prompt_pool: LearnabilityPool | None = None
        if kwargs["_init_setup_model"]:
            self._setup_model()

    # ------------------------------------------------------------------ setup, save and load
    def _setup_model(self) -> None:
        super()._setup_model()
        if self.advantage_baseline == "value" and self.policy.value_net is None:
            raise ValueError("advantage_baseline='value' needs a value head: policy_kwargs={'value_head': True}")
        refills = self.dynamic_sampling and self.max_resample_rounds > 0
        if refills and self.env is not None and self.group_size % self.env.num_envs:
            raise ValueError(
                f"dynamic_sampling replaces whole groups: group_size ({self.group_size}) must be a multiple of the "
                f"number of envs ({self.env.num_envs}), or max_resample_rounds=0 (uniform groups left out, none "
                "replaced)"
            )
        if self.prompt_sampling == "learnability":
            pool_seed = self._seeds.seed
            self._prompt_pool = LearnabilityPool(self.prompt_pool_size, self.fresh_prompt_fraction, seed=pool_seed)
        if self.dynamic_sampling or self._prompt_pool is not None or self.reward_ramp or self.protected_rollouts:
            self._sampling = GRPOSampling(  # else the env's stream, as LMBaseAlgorithm's RolloutSampling draws it
                self.dynamic_sampling, self.max_resample_rounds, self._prompt_pool, self.group_size,
                self._local_groups, self.gamma, self._dist, self.reward_ramp, self.protected_rollouts,
            )  # fmt: skip
        if self.replay_ratio > 0:
            kwargs = {"seed": self.seed, "pad_id": self.policy.pad_token_id, **self.replay_buffer_kwargs}
            self.replay_buffer = PrioritizedTrajectoryBuffer(**kwargs)

    def _setup_learn(self, *args: Any, **kwargs: Any) -> tuple[int, BaseCallback]:
        """:meth:`LMBaseAlgorithm._setup_learn
        <algorithms.common.base_class.LMBaseAlgorithm._setup_learn>`, once the advantages step is known to group the
        rollouts this model collects (K and G are fixed at construction: a part is built from them)."""
        built = (self.scoring.n_groups, self.scoring.group_size)
        if (self.n_groups, self.group_size) != built:
            raise ValueError(
                f"n_groups, group_size = {self.n_groups}, {self.group_size}, but this model was built with {built[0]}, "
                f"{built[1]} (its advantages step groups the rollouts by them): pass them to GRPO(...), or to "
                "GRPO.load(path, n_groups=..., group_size=...), instead of setting them on a built model"
            )
        return super()._setup_learn(*args, **kwargs)

    def _needs_reference(self) -> bool:
        return self.beta > 0 or self.protected_rollouts > 0

    def get_run_state(self) -> tuple[dict[str, Any], dict[str, th.Tensor]]:
        """:meth:`~algorithms.common.base_class.LMBaseAlgorithm.get_run_state`, with the advantages step's state, the
        reward ramp's target and the prompt pool (plain data)."""
        state, rng = super().get_run_state()
        state["_between_variance"] = float(self.scoring.between_variance)
        state["_groups_seen"] = int(self.scoring.groups_seen)
        sampling = self._sampling
        state["_reward_model_target"] = sampling.reward_model_target if isinstance(sampling, GRPOSampling) else None
        state["_prompt_pool_state"] = None if self._prompt_pool is None else self._prompt_pool.get_state()
        return state, rng

    def set_run_state(self, state: dict[str, Any], rng: dict[str, th.Tensor]) -> None:
        super().set_run_state(state, rng)
        self.scoring.between_variance = state.get("_between_variance", self.scoring.between_variance)
        self.scoring.groups_seen = state.get("_groups_seen", self.scoring.groups_seen)
        if isinstance(self._sampling, GRPOSampling):
            self._sampling.reward_model_target = state.get("_reward_model_target")
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
            raise ValueError("this model has no replay buffer (controls_kwargs['replay_ratio'] is 0)")
        self.replay_buffer.save(path)

    def load_replay_buffer(self, path: str | os.PathLike) -> None:
        """Read a replay buffer written by :meth:`save_replay_buffer` into this model."""
        self.replay_buffer = PrioritizedTrajectoryBuffer.load(path, vocab_size=self.policy.vocab_size)

    # ------------------------------------------------------------------ one iteration (LMBaseAlgorithm.learn)
    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """The rollout's rows as the batch the update trains on: :meth:`GroupScoring.batch
        <algorithms.grpo.advantages.GroupScoring.batch>` (returns, advantages relative to each group, the kept rows)."""
        batch, self._placeholder = self.scoring.batch(rows, generation_seconds, self.policy, self.logger, self.device)
        return batch

    # ------------------------------------------------------------------ update
    def train(self) -> None:
        """GRPO update on the last rollout (and replayed rows): ``n_epochs`` passes in minibatches of ``batch_size``
        completions, each one step on the clipped surrogate (:func:`~algorithms.grpo.update.outputs_loss`) through
        the shared update step (:meth:`~algorithms.common.base_class.LMBaseAlgorithm._update_policy`)."""
        settings = self._loss_settings()
        in_pass = (self._sampler_correction, self.sampler_correction_cap) if self._corrects_in_pass() else None
        prune = update.prunable(settings, self.policy.value_net is not None) and not self.diagnostics

        def loss(minibatch: RolloutBatch, outputs: PolicyOutputs) -> tuple[th.Tensor, dict[str, th.Tensor]]:
            return update.outputs_loss(self.policy, minibatch, outputs, settings, in_pass)

        sequential = self.update_mode == "sequential"
        history = self._update_policy(loss, self.n_epochs, self.batch_size, self.loss_aggregation,
                                      settings.ent_coef != 0, False, None, sequential, prune)  # fmt: skip
        if self.replay_buffer is not None:
            replay.update_and_store(self.replay_buffer, *self._replayed, self._iteration)
            self._replayed = None  # the update's rows are not kept past it
        update.log_train(self.logger, history, settings, self.diagnostics)

    def _extend_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """The fresh rollout plus rows drawn from the replay buffer (``replay_ratio`` of the update), and the
        reference's log-probs when ``beta > 0``."""
        drawn = None
        if self.replay_buffer is not None:
            args = (self.replay_buffer, len(batch), self.replay_ratio, self._iteration, self.max_replay_age)
            drawn = replay.draw(*args, self.device, self.logger)
            self._replayed = (batch, drawn, {})  # the fresh rows, the replayed ones, their drift by slot
        extended = batch if drawn is None else batch.concat(drawn)
        if self.beta > 0:
            extended.ref_log_probs = self._reference_log_probs(extended)
        return extended

    def _step(self, minibatch: RolloutBatch, ran: RolloutBatch, share: float, spec: UpdateLoss) -> Step:
        """The shared step, or with the diagnostics the gradient accumulated one group at a time (each group's
        measured and logged, :mod:`~algorithms.grpo.diagnostics`); a replayed row's drift is kept for its priority."""
        if not self.diagnostics:
            step = super()._step(minibatch, ran, share, spec)
        else:
            scale = 1.0 if self._scaler is None else float(self._scaler.get_scale())
            value, stats, log_probs, groups = diagnostics.backward_by_group(self.policy, minibatch, spec, share, scale)
            diagnostics.log_group_gradients(self.logger, groups)
            step = Step(value, step_stats(minibatch, stats, self._optimizer_step(None)), log_probs)
        if ran.slots is not None:
            self._replayed[2].update(replay.drift(step.log_probs.detach(), ran))
        return step

    def _loss_settings(self) -> update.LossSettings:
        """The loss's coefficients at the current progress (and update count, for :class:`UpdateDecay`)."""
        progress = self._current_progress_remaining
        clip_low = self.clip_range(progress)
        clip_high = self.clip_range_high(progress) if self.clip_range_high is not None else clip_low
        ent_coef = self.ent_coef(self._n_updates) if isinstance(self.ent_coef, UpdateDecay) else self.ent_coef(progress)
        return update.LossSettings(
            clip_low, clip_high, ent_coef, self.beta, self.loss_aggregation, self.vf_coef, self.importance_level
        )

    def _corrects_in_pass(self) -> bool:
        """Whether the sampler correction comes from the update's own forward pass (:func:`update.minibatch_loss`):
        when the update is one optimizer step on the whole fresh rollout (one epoch, one minibatch, nothing replayed,
        no group-by-group steps), whose weights before the step are ``pi_old``."""
        return (
            self._sampler_correction is not None
            and self.n_epochs == 1
            and self.batch_size is None  # the same on every rank: a sharded forward is a collective
            and self.replay_buffer is None
            and self.update_mode == "joint"
            and not self.diagnostics
        )
