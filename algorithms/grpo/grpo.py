"""GRPO: Group Relative Policy Optimization (Shao et al., 2024) with the Stable-Baselines3 API."""

from __future__ import annotations

import copy
import itertools
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, configure_logger, safe_mean
from stable_baselines3.common.vec_env import VecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0, so GRPO("TransformerPolicy", "R1Zero-v0") works)
from algorithms.common.buffers import PrioritizedTrajectoryBuffer
from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.cold_start import supervised_finetune
from algorithms.common.distributed import COMPRESSIONS, Distributed, GradientSync
from algorithms.common.generation import Completions, completion_log_probs
from algorithms.common.precision import DTYPES, resolve_precision
from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import controls, objective
from algorithms.grpo.policies import TransformerPolicy
from algorithms.grpo.rollout import RolloutBatch, left_pad

SelfGRPO = TypeVar("SelfGRPO", bound="GRPO")
ADVANTAGE_SCALES = ("group", "batch", "none")
AGGREGATIONS = ("sequence", "token", "constant")


@dataclass
class _Rows:
    """What one rollout collected, one entry per completion (per turn in multi-turn episodes)."""

    episodes: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    contexts: list[th.Tensor] = field(default_factory=list)
    tokens: list[th.Tensor] = field(default_factory=list)
    masks: list[th.Tensor] = field(default_factory=list)
    log_probs: list[th.Tensor] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    def add(self, episodes, turn, contexts, completions, log_probs, rewards, infos) -> None:
        """Record the completions the envs of one step scored (row ``i`` is episode ``episodes[i]``)."""
        tokens, masks = completions
        for i, episode in enumerate(episodes):
            self.episodes.append(episode)
            self.turns.append(turn)
            self.contexts.append(contexts[i])
            self.tokens.append(tokens[i])
            self.masks.append(masks[i])
            self.log_probs.append(log_probs[i])
            self.rewards.append(float(rewards[i]))
            self.infos.append(infos[i])


class GRPO(BaseAlgorithm):
    """Group Relative Policy Optimization for language models on ``R1Zero-v0``-style envs.

    One iteration: ``n_groups`` (K) problems, ``group_size`` (G) completions each, all sampled in one batch
    whatever the number of envs; rewards from ``env.step``; advantages relative to each group
    (:func:`objective.group_advantages`); the clipped surrogate with a k3 KL penalty to a frozen reference and
    an entropy bonus (:func:`objective.grpo_loss`); global gradient clipping; an optimizer step per minibatch.
    No value network: like ARS in sb3-contrib, GRPO subclasses ``BaseAlgorithm`` directly, because SB3's
    on-policy machinery (``RolloutBuffer``, GAE, ``policy(obs) -> (actions, values, log_probs)``) does not fit
    completions scored per group. ``num_timesteps`` counts completions (one env step each).

    With a freshly initialised built-in model the first ``learn()`` runs the cold-start SFT stage (S20.1) on
    the task's gold solutions (or ``sft_data``) before GRPO; ``cold_start=False`` skips it.

    :param policy: ``"TransformerPolicy"`` or the class
    :param env: an env, a VecEnv or a registered id (``"R1Zero-v0"``); sequence action mode
    :param learning_rate: learning rate, constant or an SB3 schedule of the remaining progress
    :param n_groups: K, problems per rollout (S7: 4)
    :param group_size: G, completions per problem (8)
    :param n_epochs: passes over each rollout (1: every update on-policy, as the published GRPO default)
    :param batch_size: completions per minibatch (``None``: the whole rollout, one update per epoch)
    :param clip_range: the lower clip epsilon of the importance ratio (0.2), constant or schedule
    :param clip_range_high: the upper clip epsilon (``None``: same as ``clip_range``; DAPO's clip-higher: 0.28)
    :param beta: weight of the k3 KL penalty to the reference model (DeepSeekMath: 0.04; TRL defaults to 0).
        The reference (a frozen copy of the policy after the cold start) is only built when ``beta > 0``
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
    :param competition: competition between groups: ``None`` (off), ``"fixed"`` (S10: the winning group's
        advantages x ``competition_coef``, see :func:`~algorithms.grpo.controls.winning_groups`) or ``"adaptive"``
        (S11: the coefficient follows the between-group reward variance, in [0.8, 1.5])
    :param competition_coef: S10's coefficient (1.2)
    :param diversity_guard: S12: when the spread of per-group mean entropies exceeds ``diversity_threshold``,
        leave out the groups whose rewards carry no signal (all equal); logged as ``diversity/*``
    :param diversity_threshold: S12's spread (0.15)
    :param update_mode: ``"joint"`` (one step on all groups, as published) or ``"sequential"`` (S14: one step
        per group, in turn)
    :param advantage_baseline: ``"group"`` (the group's mean reward, GRPO) or ``"value"`` (S9: the FP32 value
        head's estimate for the prompt; needs ``policy_kwargs={"value_head": True}``)
    :param reward_ramp: S20.2: the reward-model (consistency) weight starts at 0 and rises by 0.05 every 1000
        timesteps up to the env's configured weight
    :param protected_rollouts: S20.3: the first rollouts are sampled by the frozen cold-start policy (the seed
        says "the first 3 groups"; read as the first 3 rollouts, since the first rollout's groups come from the
        cold-start weights anyway); their sampling log-probs are the frozen policy's, so the importance ratio
        corrects for it
    :param curriculum: S21: a :class:`~algorithms.common.callbacks.CurriculumCallback` sets the difficulty of
        every env from the rolling success rate (``curriculum/difficulty``)
    :param diagnostics: S24: per-group reward histograms, per-group gradient norms and their spread (warning
        above 0.3), "group stability" (S18, :func:`~algorithms.grpo.controls.group_stability`) and an entropy
        warning below 0.5; the update is then accumulated group by group (same gradient, K smaller passes)
    :param replay_ratio: fraction of each update's completions replayed from a prioritized trajectory buffer
        (S3, S5; :class:`~algorithms.common.buffers.PrioritizedTrajectoryBuffer`); 0 (default) is published GRPO.
        Replayed completions keep their sampling log-probs (the importance ratio is clipped as usual), their
        group-relative advantage (computed from their own group's rewards when collected) times their
        importance-sampling weight; after the update their priority becomes ``|advantage| * exp(-drift)``, the
        drift being their mean ``|log ratio|`` per token (how far the policy has moved since they were sampled)
    :param max_replay_age: completions collected more than this many iterations ago are evicted before sampling
    :param replay_buffer_kwargs: arguments of the buffer (``capacity``, ``max_tokens``, ``alpha``, ...)
    :param gradient_compression: with several processes (S17, :mod:`~algorithms.common.distributed`):
        ``None``, ``"fp16"``, ``"bf16"`` or ``"powersgd"`` (PyTorch's DDP communication hooks)
    :param dist_timeout: seconds a rank waits for the others before the job fails (a hung rank ends the job)
    :param mixed_precision: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"no"`` (S15): the model's forward passes
        (sampling, update, reference) run under autocast; weights, optimizer, value head and loss stay float32;
        fp16 adds a gradient scaler. A step whose gradients are not finite is skipped and counted
        (``train/skipped_steps``). ``"auto"``: see :mod:`~algorithms.common.precision` (float32 on a CPU
        without native bf16)
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

    policy_aliases: ClassVar[dict[str, type[TransformerPolicy]]] = {"TransformerPolicy": TransformerPolicy}
    policy: TransformerPolicy

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
        dist_timeout: float = 300.0,
        mixed_precision: str = "auto",
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
        if isinstance(env, str):  # SB3 would ask for render_mode="rgb_array", which a text env does not have
            env = gym.make(env)
        self._dist = Distributed(timeout=dist_timeout)
        device = self._dist.device(device)
        if not self._dist.is_main:  # S17: only rank 0 logs and prints
            tensorboard_log, verbose = None, 0
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            support_multi_env=True,
            seed=seed,
        )
        if advantage_scale not in ADVANTAGE_SCALES:
            raise ValueError(f"advantage_scale must be one of {ADVANTAGE_SCALES}, got {advantage_scale!r}")
        if loss_aggregation not in AGGREGATIONS:
            raise ValueError(f"loss_aggregation must be one of {AGGREGATIONS}, got {loss_aggregation!r}")
        if group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group needs a baseline), got {group_size}")
        if n_groups < 1 or n_epochs < 1 or (batch_size is not None and batch_size < 1):
            raise ValueError("n_groups, n_epochs and batch_size must be positive")
        if sft_data is not None and not os.path.isfile(sft_data):
            raise ValueError(f"sft_data {sft_data!r} is not a file; pass a JSONL file of prompt/response rows")
        if beta < 0 or max_grad_norm <= 0 or not 0 < gamma <= 1:
            raise ValueError(f"need beta >= 0, max_grad_norm > 0, 0 < gamma <= 1; got {beta}, {max_grad_norm}, {gamma}")
        self.n_groups, self.group_size, self.n_epochs, self.batch_size = n_groups, group_size, n_epochs, batch_size
        self.clip_range, self.clip_range_high = clip_range, clip_range_high
        self.beta, self.ent_coef, self.max_grad_norm, self.gamma = beta, ent_coef, max_grad_norm, gamma
        self.vf_coef = vf_coef
        self.advantage_scale, self.loss_aggregation = advantage_scale, loss_aggregation
        self.drop_uniform_groups = drop_uniform_groups
        if not 0 <= replay_ratio < 1 or max_replay_age < 0:
            raise ValueError(f"need 0 <= replay_ratio < 1, max_replay_age >= 0; got {replay_ratio}, {max_replay_age}")
        for name, value, valid in (
            ("competition", competition, (None, "fixed", "adaptive")),
            ("update_mode", update_mode, ("joint", "sequential")),
            ("advantage_baseline", advantage_baseline, ("group", "value")),
        ):
            if value not in valid:
                raise ValueError(f"{name} must be one of {valid}, got {value!r}")
        self.competition, self.competition_coef = competition, competition_coef
        self.diversity_guard, self.diversity_threshold = diversity_guard, diversity_threshold
        self.update_mode, self.advantage_baseline = update_mode, advantage_baseline
        self.reward_ramp, self.protected_rollouts = reward_ramp, protected_rollouts
        self.curriculum, self.diagnostics = curriculum, diagnostics
        self._between_variance = 0.0  # running mean of the between-group reward variance (S11's reference)
        self._reward_model_target: float | None = None  # the configured weight that reward_ramp rises to
        self.replay_ratio, self.max_replay_age = replay_ratio, max_replay_age
        self.replay_buffer_kwargs = dict(replay_buffer_kwargs or {})
        self.replay_buffer: PrioritizedTrajectoryBuffer | None = None
        self._groups_seen = 0
        if gradient_compression not in COMPRESSIONS:
            raise ValueError(f"gradient_compression must be one of {COMPRESSIONS}, got {gradient_compression!r}")
        self.gradient_compression, self.dist_timeout = gradient_compression, dist_timeout
        self._sync: GradientSync | None = None
        self._placeholder = False
        self.mixed_precision = mixed_precision
        resolve_precision(mixed_precision, self.device)  # a bad value fails here, not at the first update
        self._skipped_steps = 0
        self.cold_start, self.sft_steps, self.sft_batch_size = cold_start, sft_steps, sft_batch_size
        self.sft_learning_rate, self.sft_data = sft_learning_rate, sft_data
        self.ref_model: th.nn.Module | None = None
        self._n_updates = 0
        self._iteration = 0
        self._cold_start_done = False
        self._token_info: dict[str, int] = {}
        self._rollout: RolloutBatch | None = None
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ setup, save and load
    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        # one seed for the whole job (every rank draws the same numbers): the problems and the sampling noise of
        # group k at iteration t do not depend on the number of processes (see collect_rollouts)
        seed = self.seed if self.seed is not None else int(self._dist.gather_objects(int(th.randint(2**62, (1,))))[0])
        self._sampling_seed = seed
        self._generator = th.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self._problem_rng = np.random.default_rng(seed)
        if self.env is not None:
            self._check_env(self.env)
        kwargs = {"seed": self.seed, **self._token_info, **self.policy_kwargs}
        self.policy = self.policy_class(self.observation_space, self.action_space, self.lr_schedule, **kwargs)
        self.policy = self.policy.to(self.device)
        precision = resolve_precision(self.mixed_precision, self.device)
        self.policy.autocast_dtype = DTYPES.get(precision)
        self._scaler = th.amp.GradScaler(self.device.type) if precision == "fp16" else None
        # the architecture, so load() rebuilds it offline (a copy: the caller's dict stays as it was)
        self.policy_kwargs = {**self.policy_kwargs, "model_config": self.policy.model.config.to_dict()}
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_high is not None:
            self.clip_range_high = FloatSchedule(self.clip_range_high)
        if not isinstance(self.ent_coef, UpdateDecay):
            self.ent_coef = FloatSchedule(self.ent_coef)
        if self.advantage_baseline == "value" and self.policy.value_net is None:
            raise ValueError("advantage_baseline='value' needs a value head: policy_kwargs={'value_head': True}")
        if self.beta > 0 or self.protected_rollouts > 0:
            self.ref_model = self._frozen_copy()
        if self.replay_ratio > 0:
            kwargs = {"seed": self.seed, "pad_id": self.policy.pad_token_id, **self.replay_buffer_kwargs}
            self.replay_buffer = PrioritizedTrajectoryBuffer(**kwargs)

    def _check_env(self, env: VecEnv) -> None:
        """Read the token ids the policy needs from the env, and reject what GRPO cannot train on."""
        if not isinstance(env.action_space, spaces.MultiDiscrete):
            raise ValueError("GRPO trains on whole completions: make the env with action_mode='sequence'")
        if self.n_groups % self._dist.world_size:
            raise ValueError(
                f"n_groups ({self.n_groups}) must be a multiple of the number of processes ({self._dist.world_size}): "
                "each process trains whole groups"
            )
        if (self._local_groups * self.group_size) % env.num_envs:
            raise ValueError(
                f"n_groups / processes * group_size ({self._local_groups * self.group_size}) must be a multiple of the "
                "number of "
                f"envs ({env.num_envs})"
            )
        if env.num_envs > 1 and env.get_attr("max_turns", indices=[0])[0] > 1:
            raise ValueError("multi-turn episodes (max_turns > 1) are collected with one env: pass n_envs=1")
        codec = env.get_attr("codec", indices=[0])[0]
        self._token_info = {"eos_token_id": codec.eos_id, "pad_token_id": codec.pad_id}

    def _frozen_copy(self) -> th.nn.Module:
        reference = copy.deepcopy(self.policy.model).eval()
        reference.requires_grad_(False)
        return reference

    @property
    def _local_groups(self) -> int:
        """The groups this process trains: K / world size."""
        return self.n_groups // self._dist.world_size

    def _excluded_save_params(self) -> list[str]:
        excluded = ["ref_model", "_generator", "_problem_rng", "_rollout", "_scaler", "replay_buffer", "_dist", "_sync"]
        excluded.append("_curriculum")  # a callback holds the model: not pickled
        return [*super()._excluded_save_params(), *excluded]

    def save(self, path, exclude=None, include=None) -> None:
        """SB3's ``save``; with several processes only rank 0 writes (the others return)."""
        if self._dist.is_main:
            super().save(path, exclude, include)

    def save_replay_buffer(self, path: str | os.PathLike) -> None:
        """Write the replay buffer to ``path`` (one ``.npz``), like SB3's off-policy ``save_replay_buffer``."""
        if self.replay_buffer is None:
            raise ValueError("this model has no replay buffer (replay_ratio=0)")
        self.replay_buffer.save(path)

    def load_replay_buffer(self, path: str | os.PathLike) -> None:
        """Read a replay buffer written by :meth:`save_replay_buffer` into this model."""
        self.replay_buffer = PrioritizedTrajectoryBuffer.load(path)

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"] + (["ref_model"] if self.ref_model is not None else [])
        return state_dicts, []

    def set_parameters(self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device="auto") -> None:
        """SB3's ``set_parameters``, tolerant of a changed ``beta``: a saved reference is dropped when ``beta``
        is now 0, and a missing one is rebuilt from the loaded policy when ``beta`` is now > 0."""
        if not isinstance(load_path_or_dict, dict):
            return super().set_parameters(load_path_or_dict, exact_match, device)
        params = dict(load_path_or_dict)
        saved_reference = params.pop("ref_model", None)
        wants_reference = self.ref_model is not None
        self.ref_model = None  # load the policy and optimizer alone, then deal with the reference
        super().set_parameters(params, exact_match, device)
        if wants_reference:
            self.ref_model = self._frozen_copy()
            if saved_reference is not None:
                self.ref_model.load_state_dict(saved_reference)

    def save_pretrained(self, directory: str) -> None:
        """Export the policy as a standard Hugging Face folder (model + the env's tokenizer)."""
        tokenizer = self.env.get_attr("tokenizer", indices=[0])[0] if self.env is not None else None
        self.policy.save_pretrained(directory, tokenizer=tokenizer)

    # ------------------------------------------------------------------ learning loop
    def learn(
        self: SelfGRPO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "GRPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGRPO:
        """Train for at least ``total_timesteps`` completions (rounded up to whole iterations of K x G)."""
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.curriculum:  # one curriculum per model: its level carries over from one learn() to the next
            self._curriculum = getattr(self, "_curriculum", None) or CurriculumCallback()
            callback = CallbackList([callback, self._curriculum])
            callback.init_callback(self)
        if self._needs_cold_start():
            self.run_cold_start()
        callback.on_training_start(locals(), globals())
        assert self.env is not None
        while self.num_timesteps < total_timesteps:
            if not self.collect_rollouts(self.env, callback):
                break
            self._iteration += 1
            self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
            self.train()
            if log_interval is not None and self._iteration % log_interval == 0:
                self.dump_logs()
        callback.on_training_end()
        return self

    def _needs_cold_start(self) -> bool:
        if self._cold_start_done or self.sft_steps <= 0:
            return False
        return bool(self.policy.is_builtin) if self.cold_start == "auto" else bool(self.cold_start)

    def run_cold_start(self) -> dict[str, float]:
        """The cold-start SFT stage (S20.1); rebuilds the reference from its result. Logged under ``sft/``."""
        assert self.env is not None
        if getattr(self, "_logger", None) is None:  # called before learn(): log to stdout (verbose) only
            self._logger = configure_logger(self.verbose, None, "GRPO", True)
        stats = supervised_finetune(
            self.policy,
            self.env,
            steps=self.sft_steps,
            batch_size=self.sft_batch_size,
            learning_rate=self.sft_learning_rate,
            data=self.sft_data,
            generator=self._generator,
            logger=self.logger,
            verbose=self.verbose,
        )
        self._cold_start_done = True
        if self.ref_model is not None:
            self.ref_model = self._frozen_copy()
        return stats

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback) -> bool:
        """Sample K problems, G completions each in one batch, step them through the env, store the batch.

        Episode ``e`` plays problem ``e // G``. The first turn of every episode is sampled in one batch; the
        episodes are then stepped ``n_envs`` at a time (reset with the pinned problem, step the completion).
        Multi-turn episodes (one env) answer again from the env's new context until they end.
        """
        callback.on_rollout_start()
        self.policy.set_training_mode(False)
        if self.reward_ramp:
            self._ramp_reward_model_weight(env)
        n_envs, group = env.num_envs, self.group_size
        # every rank draws the seeds of all K groups and plays its own K / world: the same groups whatever the
        # number of processes; the sampler is reseeded per iteration for the same reason
        seeds = self._problem_rng.integers(2**63 - 1, size=self.n_groups)
        mine = seeds[self._dist.rank * self._local_groups : (self._dist.rank + 1) * self._local_groups]
        problems = [env.env_method("sample_problem", seed=int(s), indices=[k % n_envs])[0] for k, s in enumerate(mine)]
        self._generator.manual_seed(self._sampling_seed + 1 + self._iteration)
        episode_problems = [p for p in problems for _ in range(group)]
        chunks = [range(start, start + n_envs) for start in range(0, len(episode_problems), n_envs)]

        prompts: list[th.Tensor] = []
        for chunk in chunks:
            env.set_options([{"problem": episode_problems[e]} for e in chunk])
            prompts.extend(self._contexts(env.reset()))
        timer = time.perf_counter()
        first = self._sample(prompts, noise_offset=self._dist.rank * len(prompts), noise_rows=self.n_groups * group)
        generation_seconds = time.perf_counter() - timer

        rows = _Rows()
        finished: list[tuple[Any, Any]] = []  # (Monitor episode, is_success) of the episodes that ended
        for chunk in chunks:
            env.set_options([{"problem": episode_problems[e]} for e in chunk])
            env.reset()
            contexts = [prompts[e] for e in chunk]
            completions = first.tokens[chunk.start : chunk.stop], first.mask[chunk.start : chunk.stop]
            log_probs = first.log_probs[chunk.start : chunk.stop]
            for turn in itertools.count():
                new_obs, rewards, dones, infos = env.step(completions[0].cpu().numpy())
                self.num_timesteps += n_envs * self._dist.world_size  # completions of the whole job
                callback.update_locals(locals())
                if not callback.on_step():
                    return False
                self._update_info_buffer(infos, dones)
                ended = [info for info, done in zip(infos, dones, strict=True) if done]
                finished.extend((info.get("episode"), info.get("is_success")) for info in ended)
                rows.add(chunk, turn, contexts, completions, log_probs, rewards, infos)
                if dones.all():
                    break
                contexts = self._contexts(new_obs)  # multi-turn (one env): answer again from the new context
                timer = time.perf_counter()
                answer = self._sample(contexts)
                generation_seconds += time.perf_counter() - timer
                completions, log_probs = (answer.tokens, answer.mask), answer.log_probs
        self._merge_episode_infos(finished)
        self._rollout = self._build_batch(rows, generation_seconds)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _contexts(self, obs: dict[str, np.ndarray]) -> list[th.Tensor]:
        """The unpadded context of each env's observation, cut to the policy's memory (S4)."""
        limit = self.policy.context_limit
        pairs = zip(obs["input_ids"], obs["attention_mask"], strict=True)
        return [th.as_tensor(ids[mask == 1][-limit:]) for ids, mask in pairs]

    def _sample(self, prompts: list[th.Tensor], noise_offset: int = 0, noise_rows: int | None = None) -> Completions:
        ids, mask = left_pad(prompts, self.policy.pad_token_id)
        protected = self._iteration < self.protected_rollouts  # S20.3: the frozen cold-start policy samples
        if self.protected_rollouts:
            self.logger.record("rollout/protected", float(protected))
        return self.policy.generate(
            ids.to(self.device),
            mask.to(self.device),
            generator=self._generator,
            model=self.ref_model if protected else None,
            noise_offset=noise_offset,
            noise_rows=noise_rows,
        )

    def _merge_episode_infos(self, finished: list[tuple[Any, Any]]) -> None:
        """S17: rank 0's episode statistics (``rollout/ep_rew_mean``, ``success_rate``) cover every rank."""
        if not self._dist.enabled:
            return
        for rank, episodes in enumerate(self._dist.gather_objects(finished)):
            if rank == self._dist.rank:
                continue
            for episode, success in episodes:
                if episode is not None:
                    self.ep_info_buffer.extend([episode])
                if success is not None:
                    self.ep_success_buffer.append(success)

    def _ramp_reward_model_weight(self, env: VecEnv) -> None:
        """S20.2: set the consistency (reward-model) weight of every env to its value at ``num_timesteps``."""
        if self._reward_model_target is None:
            self._reward_model_target = env.get_attr("reward_fn", indices=[0])[0].weights["consistency"]
        weight = controls.reward_model_weight(self._reward_model_target, self.num_timesteps)
        env.env_method("set_reward_weights", {"consistency": weight})
        self.logger.record("train/reward_model_weight", weight)

    def _build_batch(self, rows: _Rows, generation_seconds: float) -> RolloutBatch:
        """Advantages from the episodes' discounted returns, grouped by problem; one row per completion.

        Statistics that cross groups (batch-scaled advantages, competition, the diversity guard, the logs) are
        computed on every rank's groups (all-gathered, K of them); this process keeps the rows of its own."""
        local = self._local_groups
        turn_rewards = th.zeros((local * self.group_size, max(rows.turns) + 1))  # (K_local*G, turns)
        played = th.zeros_like(turn_rewards, dtype=th.bool)
        turn_rewards[rows.episodes, rows.turns] = th.as_tensor(rows.rewards, dtype=th.float32)
        played[rows.episodes, rows.turns] = True
        returns = objective.discounted_returns(turn_rewards, self.gamma, played).view(local, -1)  # (K_local, G)
        returns = self._dist.gather(returns)  # (K, G): every rank's groups, in rank order
        mine = slice(self._dist.rank * local, (self._dist.rank + 1) * local)
        advantages = self._advantages(returns, rows)[mine].flatten()  # (K_local*G,)
        uniform = objective.uniform_group_mask(returns)  # (K,)
        dropped = uniform if self.drop_uniform_groups else th.zeros_like(uniform)
        if self.diversity_guard:
            dropped = dropped | self._diversity_guard(returns, rows)
        if bool(dropped.all()):  # all groups left out: a zero-advantage update, not none
            dropped = th.zeros_like(dropped)
        left_out = dropped[mine].tolist()  # this rank's groups
        keep = [i for i, e in enumerate(rows.episodes) if not left_out[e // self.group_size]]
        self._placeholder = not keep  # this rank's groups all left out: one row with no weight keeps ranks in step
        keep = keep or [0]
        prompt_ids, prompt_mask = left_pad([rows.contexts[i] for i in keep], self.policy.pad_token_id)
        masks = th.stack([rows.masks[i] for i in keep])
        self._log_rollout(returns, uniform, masks, rows.infos, generation_seconds)
        first_group = self._groups_seen + self._dist.rank * local  # group ids across rollouts and ranks
        self._groups_seen += self.n_groups
        return RolloutBatch(
            prompt_ids=prompt_ids.to(self.device),
            prompt_mask=prompt_mask.to(self.device),
            completion_ids=th.stack([rows.tokens[i] for i in keep]),
            completion_mask=masks,
            old_log_probs=th.stack([rows.log_probs[i] for i in keep]),
            advantages=advantages[[rows.episodes[i] for i in keep]].to(self.device),
            returns=returns[mine].flatten()[[rows.episodes[i] for i in keep]].to(self.device),
            groups=th.as_tensor([first_group + rows.episodes[i] // self.group_size for i in keep], device=self.device),
        )

    def _advantages(self, returns: th.Tensor, rows: _Rows) -> th.Tensor:
        """``(K, G)`` advantages: group- (or value-) relative, then scaled by the competition between groups."""
        if self.advantage_baseline == "value":  # S9: the value head's estimate of each first-turn prompt
            first = [i for i, turn in enumerate(rows.turns) if turn == 0]
            ids, mask = left_pad([rows.contexts[i] for i in first], self.policy.pad_token_id)
            with th.no_grad():
                values = self.policy.predict_values(ids.to(self.device), mask.to(self.device)).cpu()
            episodes = th.as_tensor([rows.episodes[i] for i in first])
            baseline = th.zeros(len(episodes)).index_copy_(0, episodes, values).view(-1, self.group_size)
            baseline = self._dist.gather(baseline)  # (K, G): a group shares its prompt, so its baseline
            self.logger.record("train/value_baseline", baseline.mean().item())
            advantages = returns - baseline
        else:
            advantages = objective.group_advantages(returns, scale=self.advantage_scale)
        if self.competition is None:
            return advantages
        coef = self.competition_coef
        if self.competition == "adaptive":  # S11: relative to the running between-group variance
            between = float(returns.mean(1).var(unbiased=False))
            coef = controls.adaptive_competition_coef(between, self._between_variance, base=self.competition_coef)
            self._between_variance = 0.9 * self._between_variance + 0.1 * between if self._between_variance else between
        scale = controls.competition_scale(returns, coef)  # (K,)
        self.logger.record("train/competition_coef", coef)
        self.logger.record("train/winning_groups", int((scale != 1).sum()))
        return advantages * scale[:, None]

    def _diversity_guard(self, returns: th.Tensor, rows: _Rows) -> th.Tensor:
        """S12: ``(K,)`` groups to leave out: the signal-free ones, when the per-group entropy spread is too wide."""
        first = [i for i, turn in enumerate(rows.turns) if turn == 0]
        log_probs, masks = th.stack([rows.log_probs[i] for i in first]), th.stack([rows.masks[i] for i in first])
        groups = th.as_tensor([rows.episodes[i] // self.group_size for i in first])
        entropies = self._dist.gather(controls.group_entropies(log_probs, masks, groups, self._local_groups))  # (K,)
        spread = controls.diversity_spread(entropies)
        triggered = spread > self.diversity_threshold
        dropped = controls.signal_free_groups(returns) if triggered else th.zeros(self.n_groups, dtype=th.bool)
        self.logger.record("diversity/entropy_spread", spread)
        self.logger.record("diversity/triggered", float(triggered))
        self.logger.record("diversity/dropped_groups", int(dropped.sum()))
        return dropped

    def _log_rollout(self, returns, uniform, masks, infos, generation_seconds) -> None:
        lengths = self._dist.gather(masks.sum(dim=1).float())  # every rank's completions
        self.logger.record("rollout/completion_length", lengths.mean().item())
        self.logger.record("rollout/frac_uniform_groups", uniform.float().mean().item())
        self.logger.record("rollout/reward_mean", returns.mean().item())
        components = {
            name: [i["reward_components"][name] for i in infos] for name in infos[0].get("reward_components", {})
        }
        if self._dist.enabled:  # every rank's completions
            merged: dict[str, list[float]] = {name: [] for name in components}
            for rank_components in self._dist.gather_objects(components):
                for name, values in rank_components.items():
                    merged[name].extend(values)
            components = merged
        for name, values in components.items():
            self.logger.record(f"rollout/reward_{name}", safe_mean(values))
        self.logger.record("time/tokens_per_second", lengths.sum().item() / max(generation_seconds, 1e-9))
        self.logger.record("rollout/rewards", returns.flatten().cpu().numpy(), exclude=("stdout", "log", "json", "csv"))
        if self.diagnostics:  # S24: one reward histogram per group
            for k, group_returns in enumerate(returns.cpu().numpy()):
                self.logger.record(f"groups/rewards_{k}", group_returns, exclude=("stdout", "log", "json", "csv"))
        sample = infos[0]
        text = f"reward {sample.get('reward_components')}\n\n{sample.get('completion', '')}"
        self.logger.record("samples/completion", text, exclude=("stdout", "log", "json", "csv"))

    # ------------------------------------------------------------------ update
    def train(self) -> None:
        """GRPO update on the last rollout: ``n_epochs`` passes in minibatches of ``batch_size`` completions."""
        assert self._rollout is not None, "collect_rollouts() must run before train()"
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        progress = self._current_progress_remaining
        clip_low = self.clip_range(progress)
        clip_high = self.clip_range_high(progress) if self.clip_range_high is not None else clip_low
        ent_coef = self.ent_coef(self._n_updates) if isinstance(self.ent_coef, UpdateDecay) else self.ent_coef(progress)
        if self._dist.enabled and self._sync is None:  # after the cold start: rank 0's weights everywhere
            self._dist.broadcast_module(self.policy)
            if self.ref_model is not None:
                self._dist.broadcast_module(self.ref_model)
            trainable = [p for p in self.policy.parameters() if p.requires_grad]
            self._sync = GradientSync(trainable, self._dist.world_size, self.gradient_compression)
        fresh = batch = self._rollout
        replayed = self._replay(len(fresh))
        if replayed is not None:
            batch = fresh.concat(replayed)
        if self.beta > 0:
            batch.ref_log_probs = self._reference_log_probs(batch)
        history: dict[str, list[float]] = {}
        drift: dict[int, float] = {}  # replayed slot -> mean |log ratio| per token, from its last minibatch
        settings = {"clip_low": clip_low, "clip_high": clip_high, "ent_coef": ent_coef}
        for _ in range(self.n_epochs):
            for minibatch, share in self._minibatches(batch):
                if self.diagnostics:
                    loss, stats, log_probs = self._backward_by_group(minibatch, settings, share)
                    grad_norm = self._optimizer_step(None)
                else:
                    loss, stats, log_probs = self._loss(minibatch, **settings)
                    grad_norm = self._optimizer_step(loss * share)
                if minibatch.slots is not None:
                    drift.update(_drift(log_probs.detach(), minibatch))
                if "entropy" not in stats:  # no entropy bonus: estimate it from the sampled tokens, -E[log p]
                    stats["entropy"] = -minibatch.old_log_probs[minibatch.completion_mask].mean()
                if th.isfinite(grad_norm):  # a skipped step's norm (inf or NaN) is counted, not averaged
                    stats["grad_norm"] = grad_norm
                for key, value in {"loss": loss, **stats}.items():
                    history.setdefault(key, []).append(float(value.detach()) if th.is_tensor(value) else float(value))
        if self.diagnostics and np.mean(history["entropy"]) < controls.ENTROPY_WARNING:
            warnings.warn(
                f"policy entropy {np.mean(history['entropy']):.3f} < {controls.ENTROPY_WARNING} (S24)", stacklevel=2
            )
        for key, values in history.items():
            self.logger.record(f"train/{key}", float(np.mean(values)))
        if self.replay_buffer is not None:
            self._after_replay(fresh, replayed, drift)
        self.logger.record("train/skipped_steps", self._skipped_steps)
        self.logger.record("train/optimizer_steps", len(history.get("loss", [])))  # per rollout: groups when sequential
        self.logger.record("train/ent_coef", ent_coef)
        self.logger.record("train/clip_range", clip_low)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def _minibatches(self, batch: RolloutBatch) -> Iterator[RolloutBatch]:
        """Shuffled minibatches of ``batch_size`` (joint), or one group after the other (sequential, S14).

        Each yields with its ``share``: the part of the whole job's minibatch (all ranks) it holds, by rows, or by
        tokens with ``loss_aggregation="token"``; the loss is weighted by it, so the gradients summed over the
        ranks are those of the job's minibatch. Every rank yields the same number of minibatches."""
        if self.update_mode == "sequential":
            groups = sorted(set().union(*self._dist.gather_objects(set(th.unique(batch.groups).tolist()))))
            parts = [(batch.groups == group).nonzero().squeeze(1) for group in groups]
        else:
            size = self.batch_size or len(batch)
            count = int(self._dist.sum(-(-len(batch) // size)) // self._dist.world_size) if self._dist.enabled else None
            order = th.randperm(len(batch), generator=self._generator).to(batch.prompt_ids.device)
            parts = list(order.split(size)) if count is None else list(order.tensor_split(max(count, 1)))
        for rows in parts:
            part = batch.select(rows) if len(rows) else batch.select(th.zeros(1, dtype=th.long, device=rows.device))
            amount = (
                0.0
                if not len(rows) or self._placeholder
                else float(part.completion_mask.sum() if self.loss_aggregation == "token" else len(rows))
            )
            yield part, amount / max(self._dist.sum(amount), 1e-12)

    def _loss(self, minibatch: RolloutBatch, clip_low: float, clip_high: float, ent_coef: float):
        """The GRPO loss of a minibatch (+ the value head's), its stats and the current log-probs."""
        log_probs, entropy = self.policy.log_probs(
            minibatch.prompt_ids,
            minibatch.prompt_mask,
            minibatch.completion_ids,
            minibatch.completion_mask,
            with_entropy=ent_coef != 0,
        )
        loss, stats = objective.grpo_loss(
            log_probs,
            minibatch.old_log_probs,
            minibatch.ref_log_probs,
            minibatch.advantages if minibatch.weights is None else minibatch.advantages * minibatch.weights,
            minibatch.completion_mask,
            clip_low=clip_low,
            clip_high=clip_high,
            beta=self.beta,
            ent_coef=ent_coef,
            entropy=entropy,
            aggregation=self.loss_aggregation,
            max_tokens=self.policy.max_new_tokens,
        )
        if self.policy.value_net is not None:  # S9: the FP32 value head learns the episode return
            values = self.policy.predict_values(minibatch.prompt_ids, minibatch.prompt_mask)  # (B,)
            stats["value_loss"] = th.nn.functional.mse_loss(values, minibatch.returns)
            loss = loss + self.vf_coef * stats["value_loss"]
        return loss, stats, log_probs

    def _backward_by_group(self, minibatch: RolloutBatch, settings: dict[str, float], rank_share: float = 1.0):
        """S24 diagnostics: accumulate the minibatch's gradient one group at a time (each group's loss weighted
        by its share of the minibatch's aggregation, so the sum is the joint gradient) and log the per-group
        gradient norms, their spread and the groups' agreement ("group stability")."""
        optimizer, parameters = self.policy.optimizer, [p for p in self.policy.parameters() if p.requires_grad]
        optimizer.zero_grad(set_to_none=True)
        tokens = minibatch.completion_mask.sum()
        previous = th.zeros(sum(p.numel() for p in parameters), device=self.device)
        gradients, loss_sum, stats_sum, log_probs = [], 0.0, {}, th.zeros_like(minibatch.old_log_probs)
        for group in th.unique(minibatch.groups).tolist():
            rows = (minibatch.groups == group).nonzero().squeeze(1)
            part = minibatch.select(rows)
            share = (
                part.completion_mask.sum() / tokens if self.loss_aggregation == "token" else len(rows) / len(minibatch)
            )
            loss, stats, part_log_probs = self._loss(part, **settings)
            scale = 1.0 if self._scaler is None else float(self._scaler.get_scale())
            (loss * share * rank_share * scale).backward()
            grads = [(p.grad if p.grad is not None else th.zeros_like(p)).flatten() for p in parameters]
            total = th.cat(grads) / scale
            gradients.append((total - previous) / max(share * rank_share, 1e-12))
            previous = total
            loss_sum = loss_sum + loss.detach() * share
            for key, value in stats.items():
                stats_sum[key] = stats_sum.get(key, 0.0) + value.detach() * share
            log_probs[rows, : part_log_probs.shape[1]] = part_log_probs.detach()
        norms = th.stack([g.norm() for g in gradients])
        spread = controls.gradient_spread(norms)
        self.logger.record("groups/grad_norm_mean", float(norms.mean()))
        self.logger.record("groups/grad_norm_spread", spread)
        self.logger.record("groups/stability", controls.group_stability(th.stack(gradients)))
        if spread > controls.GRAD_SPREAD_WARNING:
            warnings.warn(
                f"per-group gradient-norm spread {spread:.2f} > {controls.GRAD_SPREAD_WARNING} (S24)", stacklevel=3
            )
        return loss_sum, stats_sum, log_probs

    # ------------------------------------------------------------------ prioritized replay (S3, S5)
    def _replay(self, n_fresh: int) -> RolloutBatch | None:
        """Rows drawn from the buffer so that they make ``replay_ratio`` of the update (None: none this time)."""
        buffer = self.replay_buffer
        if buffer is None:
            return None
        buffer.evict_older_than(self._iteration - self.max_replay_age)
        wanted = round(n_fresh * self.replay_ratio / (1 - self.replay_ratio))
        if wanted == 0 or buffer.sampler.count < wanted:
            self._log_replay(0, n_fresh, None)
            return None
        drawn = buffer.sample_batch(wanted)
        arrays = {name: th.as_tensor(value, device=self.device) for name, value in drawn.rollout_arrays().items()}
        replayed = RolloutBatch(
            **arrays,
            weights=th.as_tensor(drawn.weights, dtype=th.float32, device=self.device),
            slots=th.as_tensor(drawn.indices, device=self.device),
        )
        self._log_replay(wanted, n_fresh, self._iteration - drawn.iterations)
        return replayed

    def _log_replay(self, n_replayed: int, n_fresh: int, ages: np.ndarray | None) -> None:
        self.logger.record("replay/fraction", n_replayed / (n_replayed + n_fresh))
        self.logger.record("replay/size", len(self.replay_buffer))
        if ages is not None:
            self.logger.record("replay/age_mean", float(np.mean(ages)))

    def _after_replay(self, fresh: RolloutBatch, replayed: RolloutBatch | None, drift: dict[int, float]) -> None:
        """New priorities for the replayed rows (``|A| exp(-drift)``), then this rollout's rows into the buffer
        (after: adding may overwrite the slots just updated)."""
        buffer = self.replay_buffer
        if replayed is not None and drift:
            slots = np.array(list(drift))
            advantage = {int(s): abs(float(a)) for s, a in zip(replayed.slots, replayed.advantages, strict=True)}
            buffer.update_priorities(slots, [advantage[s] * np.exp(-drift[s]) + 1e-3 for s in slots])
        buffer.add_batch(
            fresh.prompt_ids.cpu().numpy(),
            fresh.prompt_mask.cpu().numpy(),
            fresh.completion_ids.cpu().numpy(),
            fresh.completion_mask.cpu().numpy(),
            fresh.old_log_probs.cpu().numpy(),
            rewards=fresh.returns.cpu().numpy(),
            group_ids=fresh.groups.cpu().numpy(),
            iteration=self._iteration,
            advantages=fresh.advantages.cpu().numpy(),
        )

    def _optimizer_step(self, loss: th.Tensor | None) -> th.Tensor:
        """Backward (unless ``loss`` is None: the gradients are there already), unscale (fp16), clip and step;
        a step with non-finite gradients is skipped and counted."""
        optimizer = self.policy.optimizer
        if loss is not None:
            optimizer.zero_grad(set_to_none=True)
            (loss if self._scaler is None else self._scaler.scale(loss)).backward()
        if self._sync is not None:  # S17: the sum of every rank's (share-weighted) gradient
            self._sync.sync()
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        finite = bool(th.isfinite(grad_norm))
        if self._scaler is not None:
            self._scaler.step(optimizer)  # skips the step itself when the unscaled gradients hold inf or NaN
            self._scaler.update()
        elif finite:
            optimizer.step()
        if finite:
            self._n_updates += 1
        else:
            self._skipped_steps += 1
            optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _reference_log_probs(self, batch: RolloutBatch) -> th.Tensor:
        with th.no_grad(), self.policy.autocast():
            log_probs, _ = completion_log_probs(
                self.ref_model,
                batch.prompt_ids,
                batch.prompt_mask,
                batch.completion_ids,
                batch.completion_mask,
                temperature=self.policy.temperature,
                vocab_size=self.policy.vocab_size,
                pad_id=self.policy.pad_token_id,
            )
        return log_probs

    def dump_logs(self) -> None:
        """Write the recorded values (SB3's ``rollout/``, ``time/`` keys plus GRPO's) at ``num_timesteps``."""
        elapsed = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        self.logger.record("time/iterations", self._iteration, exclude="tensorboard")
        if self.ep_info_buffer:
            self.logger.record("rollout/ep_rew_mean", safe_mean([info["r"] for info in self.ep_info_buffer]))
            self.logger.record("rollout/ep_len_mean", safe_mean([info["l"] for info in self.ep_info_buffer]))
        if self.ep_success_buffer:
            self.logger.record("rollout/success_rate", safe_mean(self.ep_success_buffer))
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(step=self.num_timesteps)


def _drift(log_probs: th.Tensor, minibatch: RolloutBatch) -> dict[int, float]:
    """Mean ``|log ratio|`` per token of each replayed row of ``minibatch``, by buffer slot."""
    mask = minibatch.completion_mask
    per_row = ((log_probs - minibatch.old_log_probs).abs() * mask).sum(1) / mask.sum(1).clamp(min=1)
    return {int(slot): float(d) for slot, d in zip(minibatch.slots, per_row, strict=True) if slot >= 0}
