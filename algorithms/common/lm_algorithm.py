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
    ├─ push_weights                           the rollout engine gets the new weights (time/weight_sync_seconds)
    └─ dump_logs                              rollout/, time/, train/ at num_timesteps

The cold start (:meth:`LMAlgorithm.run_cold_start`) runs before the first rollout. With ``max_staleness >= 1`` the
loop is :class:`~algorithms.common.overlapped_learning.OverlappedLearning`'s: the same steps, the first turns sampled
on a producer thread while the update runs on the rollout before.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import configure_logger, safe_mean, update_learning_rate
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.cold_start import check_pretrained, supervised_finetune
from algorithms.common.generation.sampler import Completions
from algorithms.common.model.reference import reference_network
from algorithms.common.overlapped_learning import OverlappedLearning
from algorithms.common.rollout.batch import RolloutBatch, left_pad
from algorithms.common.rollout.env_steps import score_ahead, split_obs
from algorithms.common.rollout.rows import TEXT_ONLY, Rows, check_reward_errors, contexts_from_obs, merge_episode_infos
from algorithms.common.rollout.turns import keeps_turn_cache, log_turns, play_later_turns
from algorithms.common.runtime.determinism import deterministic_on_cpu

SelfLMAlgorithm = TypeVar("SelfLMAlgorithm", bound="LMAlgorithm")


@dataclass(frozen=True)
class RolloutStart:
    """A rollout before its first turn is sampled: each episode's problem and prompt, and the sampler's keyword
    arguments (the noise's placement, ``noise_offset`` and ``noise_rows``; ``keep_cache`` for later turns)."""

    problems: list[Any]
    prompts: list[th.Tensor]
    sampling: dict[str, Any]


class LMAlgorithm(OverlappedLearning):
    """Base class of the language-model algorithms (GRPO, the PPO baseline): see the module docstring.

    The constructor arguments are documented on the subclasses, which pass them through.
    """

    # ------------------------------------------------------------------ rollouts
    def collect_rollouts(self, env: VecEnv, callback: BaseCallback) -> bool:
        """Sample K problems, G completions each in one batch, step them through the env, store the batch.

        Episode ``e`` plays problem ``e // G``. The first turn of every episode is sampled in one batch; the
        episodes are then stepped ``n_envs`` at a time (reset with the pinned problem, step the completion).
        Multi-turn episodes (feedback, tool calls) answer again from the env's new context until they end: the later
        turns of a chunk's episodes still playing are sampled in one batch, each from the KV cache of the turn before
        (:func:`~algorithms.common.rollout.turns.play_later_turns`, ``turn_cache``). A subclass
        may then play more and change the rows (``_sampling.after_play``, e.g. dynamic sampling) before the batch is
        built.
        Returns False when a callback stopped training.
        """
        self._boundary = self.get_run_state()  # an iteration boundary: what a save during the rollout records
        callback.on_rollout_start()
        start = self._start_rollout(env)
        timer = time.perf_counter()
        first = self._sample(start.prompts, **start.sampling)
        return self._finish_rollout(env, callback, start, first, time.perf_counter() - timer)

    def _start_rollout(self, env: VecEnv) -> RolloutStart:
        """What a rollout does before its first turn is sampled: the env's settings, the K problems (each played
        by G episodes), the sampler reseeded for the iteration, the episodes' prompts."""
        self.policy.set_training_mode(False)
        self._sampling.before_rollout(env, self.num_timesteps, self.logger)
        episode_problems = [p for p in self._draw_problems(env) for _ in range(self.group_size)]
        self._seeds.reseed_for_rollout(self._iteration)
        sampling = {
            "noise_offset": self._dist.rank * len(episode_problems),
            "noise_rows": self.n_groups * self.group_size,
        }
        sampling["keep_cache"] = keeps_turn_cache(self.turn_cache, env)  # for the later turns of multi-turn episodes
        return RolloutStart(episode_problems, self._prompts(env, episode_problems), sampling)

    def _finish_rollout(
        self, env: VecEnv, callback: BaseCallback, start: RolloutStart, first: Completions, first_seconds: float
    ) -> bool:
        """The rest of :meth:`collect_rollouts` once the first turns ``first`` are sampled (in ``first_seconds``):
        the episodes played, groups played again, the batch built. False when a callback stopped training."""
        self.policy.set_training_mode(False)
        rows, finished = Rows(), []  # (Monitor episode, is_success) of the episodes that ended
        later = self._play_sampled(env, callback, start.problems, start.prompts, first, rows, finished, True)
        if later is None:
            return False
        generation_seconds = first_seconds + later
        generator_state = self._seeds.generator.get_state()
        play = functools.partial(self._play_again, env, callback, finished, start.problems)
        extra_seconds = self._sampling.after_play(rows, play, self.logger)  # e.g. GRPO's refill rounds
        self._seeds.generator.set_state(generator_state)  # the update's shuffling as without refills
        if extra_seconds is None:
            return False
        merge_episode_infos(self._dist, finished, self.ep_info_buffer, self.ep_success_buffer)
        self._rollout_successes = (sum(bool(success) for _, success in finished), len(finished))
        check_reward_errors(self._dist, rows, self.logger)
        log_turns(self.logger, self._dist, rows)  # tool-call rate, turns per episode, ... (multi-turn only)
        self._rollout = self._build_batch(rows, generation_seconds + extra_seconds)
        self._boundary = None
        if self._overlap is not None:  # the producer samples the next rollout while the update shuffles
            self._overlap.update_generator.set_state(generator_state)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _prompts(self, env: VecEnv, episode_problems: list[Any]) -> list[th.Tensor]:
        """The first prompt of each episode of ``episode_problems``: the envs reset with them, ``n_envs`` at a time."""
        prompts: list[th.Tensor] = []
        for start in range(0, len(episode_problems), env.num_envs):
            env.set_options([{"problem": problem} for problem in episode_problems[start : start + env.num_envs]])
            prompts.extend(contexts_from_obs(env.reset(), self.policy.context_limit))
        return prompts

    def _play(
        self,
        env: VecEnv,
        callback: BaseCallback,
        episode_problems: list[Any],
        rows: Rows,
        finished: list[tuple[Any, Any]],
        job_steps: bool,
        noise_offset: int,
        noise_rows: int,
    ) -> float | None:
        """Play one episode per entry of ``episode_problems`` (sampled in one batch, stepped ``n_envs`` at a time),
        adding their rows (episodes numbered from 0) to ``rows``; the generation seconds, or None when a callback
        stopped training. ``job_steps``: every rank plays as many episodes, so a step counts ``n_envs x world size``
        timesteps; else ``n_envs`` (the caller adds the other ranks' completions)."""
        prompts = self._prompts(env, episode_problems)
        timer = time.perf_counter()
        keep_cache = keeps_turn_cache(self.turn_cache, env)  # for the later turns of multi-turn episodes
        first = self._sample(prompts, noise_offset=noise_offset, noise_rows=noise_rows, keep_cache=keep_cache)
        generation_seconds = time.perf_counter() - timer
        later = self._play_sampled(env, callback, episode_problems, prompts, first, rows, finished, job_steps)
        return None if later is None else generation_seconds + later

    def _play_sampled(
        self,
        env: VecEnv,
        callback: BaseCallback,
        episode_problems: list[Any],
        prompts: list[th.Tensor],
        first: Completions,
        rows: Rows,
        finished: list[tuple[Any, Any]],
        job_steps: bool,
    ) -> float | None:
        """:meth:`_play` once the first turns ``first`` of ``prompts`` are sampled: scored ahead, stepped ``n_envs``
        at a time, later turns played; the later turns' generation seconds, or None when a callback stopped
        training."""
        n_envs, generation_seconds = env.num_envs, 0.0
        chunks = [range(start, start + n_envs) for start in range(0, len(episode_problems), n_envs)]
        score_ahead(env, episode_problems, first.tokens.cpu().numpy())
        record = functools.partial(self._record_step, callback, rows, finished, job_steps=job_steps)
        for chunk in chunks:
            env.set_options([{"problem": episode_problems[e]} for e in chunk])
            env.reset()
            completions = first.tokens[chunk.start : chunk.stop], first.mask[chunk.start : chunk.stop]
            played = [prompts[e] for e in chunk], completions, first.log_probs[chunk.start : chunk.stop]
            new_obs, rewards, dones, infos = env.step(completions[0].cpu().numpy())
            if not record(list(chunk), 0, played, (rewards, dones, infos), locals()):
                return None
            live = [i for i, done in enumerate(dones) if not done]  # env i of the chunk plays episode chunk[i]
            episodes = [chunk[i] for i in live]  # also their rows in the first turn's cache
            later = play_later_turns(env, self._sample, record, self.policy.context_limit, episodes, live,
                                     split_obs(new_obs, live), first.cache, episodes)  # fmt: skip
            if later is None:
                return None
            generation_seconds += later
        return generation_seconds

    def _record_step(
        self,
        callback: BaseCallback,
        rows: Rows,
        finished: list[tuple[Any, Any]],
        episodes: list[int],
        turn: int,
        played: tuple[list[th.Tensor], tuple[th.Tensor, th.Tensor], th.Tensor],
        outcome: tuple[Any, Any, list[dict[str, Any]]],
        scope: dict[str, Any],
        job_steps: bool = True,
    ) -> bool:
        """Count the completions of one step (``job_steps``: every rank's), tell the callback (``scope``: the caller's
        locals, as SB3 passes them), keep the episodes that ended and add the rows of ``episodes`` (contexts,
        completions and log-probs ``played``; rewards, dones and infos ``outcome``); False when the callback stopped
        training."""
        rewards, dones, infos = outcome
        self.num_timesteps += len(episodes) * (self._dist.world_size if job_steps else 1)  # the job's completions
        callback.update_locals(scope)
        if not callback.on_step():
            return False
        self._update_info_buffer(infos, dones)
        ended = [info for info, done in zip(infos, dones, strict=True) if done]
        finished.extend((info.get("episode"), info.get("is_success")) for info in ended)
        rows.add(episodes, turn, *played, rewards, infos)
        return True

    def _play_again(
        self,
        env: VecEnv,
        callback: BaseCallback,
        finished: list[tuple[Any, Any]],
        problems: list[Any],
        slots: list[int],
        mine: list[int],
        refill_round: int,
    ) -> tuple[Rows, float] | None:
        """Play the job's groups ``slots`` again with new problems (round ``refill_round`` of this rollout's refills,
        e.g. GRPO's dynamic sampling): this rank's (``mine``, local indices) with the sampling noise of their place
        among the new groups; the episodes' ``problems`` follow. Returns the new rows (episodes numbered from 0) and
        their generation seconds, or None when a callback stopped training."""
        drawn = self._draw_problems(env, slots)  # this rank's, in slots order
        self._seeds.reseed_for_refill(self._iteration, refill_round)
        new, seconds, before, group = Rows(), 0.0, self.num_timesteps, self.group_size
        if mine:
            first = self._dist.rank * self._local_groups
            offset = next(i for i, slot in enumerate(slots) if slot - first in mine) * group
            episodes = [p for p in drawn for _ in range(group)]
            seconds = self._play(env, callback, episodes, new, finished, False, offset, len(slots) * group)
            if seconds is None:
                return None
            for k, problem in zip(mine, drawn, strict=True):
                problems[k * group : (k + 1) * group] = [problem] * group
        self.num_timesteps = before + int(self._dist.sum(self.num_timesteps - before))  # every rank's completions
        return new, seconds

    def _draw_problems(self, env: VecEnv, slots: list[int] | None = None) -> list[Any]:
        """This rank's problems for the groups ``slots`` (indices among the job's K; default: all K). Every rank
        draws the problems of all of them (``_sampling.problem_keys``) and plays its own: the same groups whatever
        the number of processes (the sampler is reseeded per iteration for the same reason)."""
        slots = list(range(self.n_groups)) if slots is None else slots
        keys = self._sampling.problem_keys(len(slots), self._seeds, env)
        first = self._dist.rank * self._local_groups
        local = [(slot - first, key) for slot, key in zip(slots, keys, strict=True)]
        mine = [(k, key) for k, key in local if 0 <= k < self._local_groups]
        return [env.env_method("sample_problem", **key, indices=[k % env.num_envs])[0] for k, key in mine]

    def _sample(
        self, prompts: list[th.Tensor], noise_offset: int = 0, noise_rows: int | None = None, **turns: Any
    ) -> Completions:
        """The completions of one batch of ``prompts`` now (:meth:`_sampling_call`); ``turns``: the KV cache kept
        across turns (``keep_cache``, ``cache``, ``cache_rows``: ``policy.generate``)."""
        return self._sampling_call(prompts, noise_offset, noise_rows, **turns)()

    def _sampling_call(
        self,
        prompts: list[th.Tensor],
        noise_offset: int = 0,
        noise_rows: int | None = None,
        generator: th.Generator | None = None,
        **turns: Any,
    ) -> Callable[[], Completions]:
        """The sampling of one batch of ``prompts``, to call now or on the producer: the sampler's network is chosen
        here (the policy, the frozen reference for a protected rollout, or with ``max_staleness`` the producer's copy
        of a scheduled version); the call draws from ``generator`` (default: the rollouts')."""
        ids, mask = left_pad(prompts, self.policy.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        from_reference = self._sampling.from_reference(self._iteration, self.logger)
        if self._overlap is not None:
            network = contextlib.nullcontext(self._overlap.sampler_network(from_reference, self.ref_model))
        elif from_reference:
            network = reference_network(self.policy, self.ref_model)
        else:
            network = contextlib.nullcontext(None)
        generator = self._seeds.generator if generator is None else generator

        def call() -> Completions:
            with network as model:
                return self.policy.generate(
                    ids,
                    mask,
                    generator=generator,
                    model=model,
                    noise_offset=noise_offset,
                    noise_rows=noise_rows,
                    **turns,
                )

        return call

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
    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """The rollout's rows as the batch the update trains on (the subclass's advantages)."""
        raise NotImplementedError

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
            for index, env_state in enumerate(self._pending_env_states):
                self.env.env_method("set_state", env_state, indices=[index])
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
