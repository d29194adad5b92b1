"""``LMAlgorithm``: the learning loop and rollout collection every on-policy algorithm for language models on
R1Zero-style envs shares.

The role SB3's ``OnPolicyAlgorithm`` plays for PPO and A2C (what it builds on, construction, the policy, the
reference, the run state and save/load, is :class:`~algorithms.common.base_class.LMBaseAlgorithm`).

One iteration, top-down, in the order it runs (``self._sampling`` is the algorithm's
:class:`~algorithms.common.rollout.sampling.RolloutSampling`, GRPO's adds its options there; the two methods a
subclass writes are marked *subclass*)::

    learn
    ├─ collect_rollouts                       (callbacks' on_rollout_start: the checkpoint at the boundary)
    │  ├─ _sampling.before_rollout            the env's settings for the rollout (GRPO: the reward ramp)
    │  ├─ _draw_problems                      K problems: _sampling.problem_keys (the stream, or GRPO's pool)
    │  ├─ _play                               sample the K x G first turns in one batch (_sample: the policy, or
    │  │  │                                   the reference when _sampling.from_reference), score them ahead,
    │  │  │                                   step them through the env(s) n_envs at a time
    │  │  └─ play_later_turns, _record_step   multi-turn episodes (rollout/turns.py: each later turn from the KV
    │  │                                      cache of the last); every step counted, its rows kept (Rows)
    │  ├─ _sampling.after_play                play groups again (GRPO: DAPO's refills, through _play_again)
    │  ├─ log_turns                           tool-call rate, turns per episode, ... (multi-turn episodes only)
    │  └─ _build_batch            *subclass*  returns, advantages, the kept rows as a RolloutBatch
    ├─ _engine.sleep                          a GPU vLLM engine frees its memory (vllm_enable_sleep_mode)
    ├─ _guard_restored                        the collapse guard (when on) judges the rollout's success; after a
    │                                         restore the update is skipped
    ├─ train                      *subclass*  minibatches, loss, _optimizer_step (clip, guarded step)
    ├─ check_finite_state                     a NaN or inf in a weight or optimizer moment stops the run here,
    │                                         naming the iteration, before any checkpoint or save is written
    ├─ push_weights                           the rollout engine gets the new weights (time/weight_sync_seconds)
    └─ dump_logs                              rollout/, time/, train/ at num_timesteps

The rollout's steps (``collect_rollouts`` to ``_build_batch``) are
:class:`~algorithms.common.rollout_collection.RolloutCollection`'s; the loop, the guard's glue, the cold start and
the logs are here. The cold start (:meth:`LMAlgorithm.run_cold_start`) runs before the first rollout. With
``max_staleness >= 1`` the loop is :class:`~algorithms.common.overlapped_learning.OverlappedLearning`'s: the same
steps, the first turns sampled on a producer thread while the update runs on the rollout before.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, TypeVar

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import configure_logger, safe_mean, update_learning_rate

from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.cold_start import check_pretrained, supervised_finetune
from algorithms.common.overlapped_learning import OverlappedLearning
from algorithms.common.rollout.rows import TEXT_ONLY
from algorithms.common.runtime.determinism import deterministic_on_cpu
from algorithms.common.saving import checks

SelfLMAlgorithm = TypeVar("SelfLMAlgorithm", bound="LMAlgorithm")


class LMAlgorithm(OverlappedLearning):
    """Base class of the language-model algorithms (GRPO, the PPO baseline): see the module docstring.

    The constructor arguments are documented on the subclasses, which pass them through.
    """

    # ------------------------------------------------------------------ rollouts
    def gathered_policy(self) -> contextlib.AbstractContextManager:
        """The policy's whole weights on every rank for the block, so that one rank may sample alone (e.g. rank 0
        evaluating); with ``sharding="fsdp"`` they are gathered, a collective every rank enters."""
        return self._parallel.gathered(self.policy.model)

    def predict(
        self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False
    ) -> tuple[Any, Any]:
        """SB3's ``predict``; with ``sharding="fsdp"`` on several processes a collective (every rank calls it)."""
        with self.gathered_policy():
            return super().predict(observation, state, episode_start, deterministic)

    # ------------------------------------------------------------------ what the subclass adds
    def train(self) -> None:
        """Update the policy on the last rollout (the subclass's loss)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ learning loop
    def learn(
        self: SelfLMAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfLMAlgorithm:
        """Train for at least ``total_timesteps`` completions (rounded up to whole iterations of K x G)."""
        tb_log_name = tb_log_name or type(self).__name__
        self._check_has_env()
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.curriculum:  # one curriculum per model: its level carries over from one learn() to the next
            self._curriculum = self._curriculum or CurriculumCallback()
            callback = CallbackList([callback, self._curriculum])
            callback.init_callback(self)
        self.logger.record("precision/choice", self._precision_text(), exclude=TEXT_ONLY)  # with the next dump
        if self.needs_cold_start():
            self.run_cold_start(progress_bar)
        callback.on_training_start(locals(), globals())
        assert self.env is not None
        if self.max_staleness > 0:
            self._learn_overlapped(total_timesteps, callback, log_interval)
            callback.on_training_end()
            return self
        self.push_weights()  # whatever changed the weights since the engine last got them
        while self.num_timesteps < total_timesteps:
            from_reference = self._sampling.from_reference(self._iteration, self.logger)
            sampling = [self.policy.model, self.ref_model if from_reference else None]
            with self._parallel.gathered(*sampling):  # FSDP2: the whole weights for the rollout's sampler
                collected = self.collect_rollouts(self.env, callback)
            if not collected:
                break
            self._engine.sleep()  # until the push
            self._iteration += 1
            self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
            if self._guard is not None and self._guard_restored(callback):
                self.push_weights()  # the restored weights
                self.dump_logs()  # the restore's figures; no update on the rollout the fallen policy sampled
                continue
            with deterministic_on_cpu(self.device):
                self.train()
            self.check_finite_state(f"training stopped at iteration {self._iteration}", agreed=True)
            self.push_weights()
            if log_interval is not None and self._iteration % log_interval == 0:
                self.dump_logs()
        callback.on_training_end()
        return self

    # ------------------------------------------------------------------ collapse guard
    def _guard_restored(self, callback: BaseCallback) -> bool:
        """Let the collapse guard judge this iteration; True when it put the best snapshot back (logged)."""
        guard = self._guard
        assert guard is not None
        figure = self._guard_figure(callback)
        restored = guard.check(figure, self._iteration, self.policy, self.policy.optimizer)
        self.logger.record("guard/restores", guard.restores)
        self.logger.record("guard/lr_scale", guard.lr_scale)
        if guard.best is not None:
            self.logger.record("guard/best_success", guard.best)
        if guard.recent:
            self.logger.record("guard/success", float(np.mean(guard.recent)))
        if restored and self.verbose >= 1:
            print(guard.describe_last_event(self.lr_schedule(self._current_progress_remaining) * guard.lr_scale))
        return restored

    def _guard_figure(self, callback: BaseCallback) -> float | None:
        """This iteration's figure for the collapse guard (:meth:`CollapseGuard.figure`)."""
        assert self._guard is not None
        return self._guard.figure(self._iteration, self.env, self.policy, self._rollout_successes, callback, self._dist)

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's, with the collapse guard's scale: the schedule's rate times ``lr_scale`` (1 without a restore)."""
        scale = self._guard.lr_scale if self._guard is not None else 1.0
        rate = self.lr_schedule(self._current_progress_remaining) * scale
        self.logger.record("train/learning_rate", rate)
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            update_learning_rate(optimizer, rate)

    def _check_has_env(self) -> None:
        """A clear error when there is no env to train on (e.g. a loaded model whose recorded env was not rebuilt)."""
        if self.env is None:
            why = self._env_missing or "it was made or loaded without one"
            raise ValueError(
                f"{type(self).__name__}.learn needs an env: {why}. Pass one with model.set_env(env), or load with "
                f"{type(self).__name__}.load(path, env=...) or load(path, env_objects={{...}})"
            )

    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        """SB3's ``_setup_learn`` (which resets the envs), then the env states of a loaded run put back."""
        result = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        if self._pending_env_states is not None and self.env is not None:
            checks.check_env_states(self._pending_env_states, self.env, self._loaded_from)  # applies each state
            self._pending_env_states = None
        return result

    def start_run(self, tb_log_name: str | None = None) -> None:
        """Set up what :meth:`learn` sets up first (SB3's ``_setup_learn``: the counters and episode statistics, the
        envs reset, the logger on a new TensorBoard run ``<tensorboard_log>/<tb_log_name>_<n>``) for a stage run
        before it: the cold start called alone (:meth:`run_cold_start`), as ``grpo-gym train`` and ``sft`` do. A
        later ``learn(..., reset_num_timesteps=False)`` continues that run and logs to the same folder."""
        self._setup_learn(0, None, True, tb_log_name or type(self).__name__, False)

    def needs_cold_start(self) -> bool:
        """Whether the next :meth:`learn` runs the cold-start SFT stage first (``cold_start``, ``sft_steps``, and
        for ``"auto"`` whether the policy is a freshly initialised built-in model; warns when a pretrained model
        looks untrained)."""
        if self._cold_start_done or self.sft_steps <= 0:
            return False
        if self.cold_start == "auto" and not self.policy.is_builtin and self.env is not None and self._dist.is_main:
            check_pretrained(self.policy, self.env, self.sft_steps, self.verbose)  # warns if it looks untrained
        return bool(self.policy.is_builtin) if self.cold_start == "auto" else bool(self.cold_start)

    def run_cold_start(self, progress_bar: bool = False) -> dict[str, float]:
        """The cold-start SFT stage; rebuilds the reference from its result. Logged under ``sft/``;
        ``progress_bar`` shows its steps (a bar on a terminal, a line per tenth otherwise)."""
        assert self.env is not None
        if getattr(self, "_logger", None) is None:  # called before learn(): log to stdout (verbose) only
            self._logger = configure_logger(self.verbose, None, type(self).__name__, True)
        if self._last_obs is None:  # called before learn(): a reset applies the env's seed before problems are drawn
            self._last_obs = self.env.reset()
        with deterministic_on_cpu(self.device):
            stats = supervised_finetune(
                self.policy,
                self.env,
                steps=self.sft_steps,
                batch_size=self.sft_batch_size,
                learning_rate=self.sft_learning_rate,
                data=self.sft_data,
                generator=self._seeds.generator,
                logger=self.logger,
                verbose=self.verbose,
                progress_bar=progress_bar,
                loss_weight=self._parallel.sft_loss_weight,
            )
        self.check_finite_state("the cold start stopped", agreed=True)
        self._cold_start_done = True
        self._refresh_reference()
        self.push_weights()
        return stats

    def dump_logs(self) -> None:
        """Write the recorded values (SB3's ``rollout/``, ``time/`` keys plus the algorithm's) at ``num_timesteps``."""
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
