"""``RolloutCollection``: how a language-model algorithm collects a rollout on R1Zero-style envs, the first half of
:class:`~algorithms.common.lm_algorithm.LMAlgorithm`'s iteration (its module docstring draws the whole iteration).

:meth:`~RolloutCollection.collect_rollouts` samples the K x G first turns in one batch, scores them ahead, steps them
through the env(s) ``n_envs`` at a time, plays the later turns of multi-turn episodes from the KV cache of the turn
before, lets the algorithm's sampling options play groups again (GRPO's refills) and hands the rows to the
subclass's :meth:`~RolloutCollection._build_batch`. The steps are separate methods because the overlapped loop
(:class:`~algorithms.common.overlapped_learning.OverlappedLearning`, ``max_staleness >= 1``) runs them around a
first turn sampled on its producer thread: :meth:`~RolloutCollection._start_rollout`,
:meth:`~RolloutCollection._sampling_call`, :meth:`~RolloutCollection._finish_rollout`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.base_class import LMBaseAlgorithm
from algorithms.common.generation.sampler import Completions
from algorithms.common.model.reference import reference_network
from algorithms.common.rollout.batch import RolloutBatch, left_pad
from algorithms.common.rollout.env_steps import score_ahead, split_obs
from algorithms.common.rollout.rows import Rows, check_reward_errors, contexts_from_obs, merge_episode_infos
from algorithms.common.rollout.turns import keeps_turn_cache, log_turns, play_later_turns


@dataclass(frozen=True)
class RolloutStart:
    """A rollout before its first turn is sampled: each episode's problem and prompt, and the sampler's keyword
    arguments (the noise's placement, ``noise_offset`` and ``noise_rows``; ``keep_cache`` for later turns)."""

    problems: list[Any]
    prompts: list[th.Tensor]
    sampling: dict[str, Any]


class RolloutCollection(LMBaseAlgorithm):
    """Rollout collection (see the module docstring); the subclass builds the batch (:meth:`_build_batch`)."""

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

    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """The rollout's rows as the batch the update trains on (the subclass's advantages)."""
        raise NotImplementedError
