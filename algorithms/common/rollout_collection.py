"""``RolloutCollector``: the part of a language-model algorithm that collects its rollouts on R1Zero-style envs (the
algorithm owns one, ``model.rollouts``; ``learn`` draws the whole iteration:
:meth:`~algorithms.common.base_class.LMBaseAlgorithm.learn`).

:meth:`~RolloutCollector.collect` samples the K x G first turns in one batch, scores them ahead, steps them through
the env(s) ``n_envs`` at a time, plays the later turns of multi-turn episodes from the KV cache of the turn before,
lets the algorithm's sampling options play groups again (GRPO's refills) and returns the rows, from which the
algorithm builds its batch. The steps are separate methods because the overlapped loop
(:class:`~algorithms.common.overlapped_learning.OverlappedLoop`, ``max_staleness >= 1``) runs them around a first
turn sampled on its producer thread: :meth:`~RolloutCollector.start`, :meth:`~RolloutCollector.sampling_call`,
:meth:`~RolloutCollector.finish`.

What a rollout samples is one object the algorithm owns (``_sampling``), called at the collector's fixed points
instead of methods a subclass overrides: :meth:`~RolloutSampling.before_rollout` (at the start of every rollout, e.g.
GRPO's reward ramp), :meth:`~RolloutSampling.problem_keys` (which problems: the env's stream, or GRPO's prompt pool),
:meth:`~RolloutSampling.from_reference` (whether the frozen reference samples instead: GRPO's protected rollouts) and
:meth:`~RolloutSampling.after_play` (once the episodes are played: GRPO's refill rounds, the prompt pool's update).
:class:`RolloutSampling` is the default, which does nothing more; GRPO's options are
:class:`~algorithms.grpo.sampling.GRPOSampling`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.env_util import keeps_turn_cache, score_ahead, split_obs
from algorithms.common.generation.sampler import Completions
from algorithms.common.model.reference import reference_network
from algorithms.common.rollout.batch import left_pad
from algorithms.common.rollout.rows import Rows, check_reward_errors, contexts_from_obs, log_turns, merge_episode_infos
from algorithms.common.rollout.turns import play_later_turns
from algorithms.common.runtime.seeds import RolloutSeeds

#: how a sampling object plays groups again: ``play(slots, mine, refill_round)`` draws new problems for the job's
#: groups ``slots``, plays this rank's (``mine``: local group indices) and returns their rows and generation
#: seconds, or None when a callback stopped training
#: (:meth:`RolloutCollector.play_again`)
PlayRefill = Callable[[list[int], list[int], int], "tuple[Rows, float] | None"]


class RolloutSampling:
    """Every rollout draws the env's stream of problems and samples from the policy; nothing is played again."""

    def before_rollout(self, env: VecEnv, num_timesteps: int, logger: Logger) -> None:
        """At the start of every rollout, before its problems are drawn."""

    def problem_keys(self, n: int, seeds: RolloutSeeds, env: VecEnv) -> list[dict[str, Any]]:
        """The ``sample_problem`` arguments of the next ``n`` problems: the env's stream (the job-wide seeds)."""
        return seeds.problem_keys(n)

    def from_reference(self, iteration: int, logger: Logger) -> bool:
        """Whether the frozen reference samples the rollout of ``iteration`` instead of the policy."""
        return False

    def after_play(self, rows: Rows, play: PlayRefill, logger: Logger) -> float | None:
        """Once the rollout's episodes are played: may play groups again (``play``) and change ``rows`` in place;
        the extra generation seconds, or None when a callback stopped training."""
        return 0.0


@dataclass(frozen=True)
class RolloutStart:
    """A rollout before its first turn is sampled: each episode's problem and prompt, and the sampler's keyword
    arguments (the noise's placement, ``noise_offset`` and ``noise_rows``; ``keep_cache`` for later turns)."""

    problems: list[Any]
    prompts: list[th.Tensor]
    sampling: dict[str, Any]


@dataclass(frozen=True)
class Play:
    """Where the steps of one play of episodes go: the envs stepped, the callback told of each step, the rows the
    completions add to, the ``(Monitor episode, is_success)`` of the episodes that ended, and what a step counts
    (``job_steps``: ``n_envs x world size`` timesteps, as every rank plays as many episodes; else ``n_envs``, the
    caller adding the other ranks' completions)."""

    env: VecEnv
    callback: BaseCallback
    rows: Rows
    finished: list[tuple[Any, Any]]
    job_steps: bool = True


@dataclass(frozen=True)
class Collected:
    """A rollout played: its rows, the seconds spent sampling, and the rollouts' generator as it was before the
    refills (the update shuffles with it, as without refills)."""

    rows: Rows
    generation_seconds: float
    generator_state: th.Tensor


class RolloutCollector:
    """Collects the rollouts of ``algorithm`` (see the module docstring): its policy, envs, sampling options
    (``_sampling``), seeds and counters are read and its ``num_timesteps`` and episode statistics updated here.

    :param algorithm: the algorithm that owns this collector
    """

    def __init__(self, algorithm: Any) -> None:  # an LMBaseAlgorithm (which imports this module)
        self.algorithm = algorithm

    def collect(self, env: VecEnv, callback: BaseCallback) -> Collected | None:
        """Sample K problems, G completions each in one batch, step them through the env; the rows, or None when a
        callback stopped training.

        Episode ``e`` plays problem ``e // G``. The first turn of every episode is sampled in one batch; the
        episodes are then stepped ``n_envs`` at a time (reset with the pinned problem, step the completion).
        Multi-turn episodes (feedback, tool calls) answer again from the env's new context until they end: the later
        turns of a chunk's episodes still playing are sampled in one batch, each from the KV cache of the turn before
        (:func:`~algorithms.common.rollout.turns.play_later_turns`, ``turn_cache``). The algorithm's sampling options
        may then play more and change the rows (``_sampling.after_play``, e.g. dynamic sampling).
        """
        model = self.algorithm
        model._boundary = model.get_run_state()  # an iteration boundary: what a save during the rollout records
        callback.on_rollout_start()
        start = self.start(env)
        timer = time.perf_counter()
        first = self.sample(start.prompts, **start.sampling)
        return self.finish(env, callback, start, first, time.perf_counter() - timer)

    def start(self, env: VecEnv) -> RolloutStart:
        """What a rollout does before its first turn is sampled: the env's settings, the K problems (each played
        by G episodes), the sampler reseeded for the iteration, the episodes' prompts."""
        model = self.algorithm
        model.policy.set_training_mode(False)
        model._sampling.before_rollout(env, model.num_timesteps, model.logger)
        episode_problems = [p for p in self.draw_problems(env) for _ in range(model.group_size)]
        model._seeds.reseed_for_rollout(model._iteration)
        sampling = {
            "noise_offset": model._dist.rank * len(episode_problems),
            "noise_rows": model.n_groups * model.group_size,
        }
        sampling["keep_cache"] = keeps_turn_cache(model.turn_cache, env)  # for the later turns of multi-turn episodes
        return RolloutStart(episode_problems, self.prompts(env, episode_problems), sampling)

    def finish(
        self, env: VecEnv, callback: BaseCallback, start: RolloutStart, first: Completions, first_seconds: float
    ) -> Collected | None:
        """The rest of :meth:`collect` once the first turns ``first`` are sampled (in ``first_seconds``): the
        episodes played, groups played again; None when a callback stopped training."""
        model = self.algorithm
        model.policy.set_training_mode(False)
        play = Play(env, callback, Rows(), [])
        later = self._play_sampled(play, start.problems, start.prompts, first)
        if later is None:
            return None
        generation_seconds = first_seconds + later
        generator_state = model._seeds.generator.get_state()
        again = functools.partial(self.play_again, play, start.problems)
        extra_seconds = model._sampling.after_play(play.rows, again, model.logger)  # e.g. GRPO's refill rounds
        model._seeds.generator.set_state(generator_state)  # the update's shuffling as without refills
        if extra_seconds is None:
            return None
        finished, rows = play.finished, play.rows
        merge_episode_infos(model._dist, finished, model.ep_info_buffer, model.ep_success_buffer)
        model._rollout_successes = (sum(bool(success) for _, success in finished), len(finished))
        check_reward_errors(model._dist, rows, model.logger)
        log_turns(model.logger, model._dist, rows)  # tool-call rate, turns per episode, ... (multi-turn only)
        return Collected(rows, generation_seconds + extra_seconds, generator_state)

    def prompts(self, env: VecEnv, episode_problems: list[Any]) -> list[th.Tensor]:
        """The first prompt of each episode of ``episode_problems``: the envs reset once per run of episodes that
        play one problem (a group's G), ``n_envs`` problems at a time, each prompt shared by its run. With the reset
        before its step (:meth:`play`), an episode costs its env one reset, and its group one more."""
        if not episode_problems:
            return []
        starts = [e for e, problem in enumerate(episode_problems) if e == 0 or problem is not episode_problems[e - 1]]
        runs = [end - start for start, end in zip(starts, [*starts[1:], len(episode_problems)], strict=True)]
        problems, n_envs = [episode_problems[e] for e in starts], env.num_envs
        prompts: list[th.Tensor] = []
        for start in range(0, len(problems), n_envs):
            chunk = problems[start : start + n_envs]
            env.set_options([{"problem": problem} for problem in chunk + chunk[-1:] * (n_envs - len(chunk))])
            prompts.extend(contexts_from_obs(env.reset(), self.algorithm.policy.context_limit)[: len(chunk)])
        return [prompt for prompt, run in zip(prompts, runs, strict=True) for _ in range(run)]

    def play(self, play: Play, episode_problems: list[Any], noise_offset: int, noise_rows: int) -> float | None:
        """Play one episode per entry of ``episode_problems`` (sampled in one batch, stepped ``n_envs`` at a time),
        adding their rows (episodes numbered from 0) to ``play.rows``; the generation seconds, or None when a
        callback stopped training. ``noise_offset``, ``noise_rows``: the sampling noise's placement."""
        prompts = self.prompts(play.env, episode_problems)
        timer = time.perf_counter()
        keep_cache = keeps_turn_cache(self.algorithm.turn_cache, play.env)  # for the later turns of multi-turn play
        first = self.sample(prompts, noise_offset=noise_offset, noise_rows=noise_rows, keep_cache=keep_cache)
        generation_seconds = time.perf_counter() - timer
        later = self._play_sampled(play, episode_problems, prompts, first)
        return None if later is None else generation_seconds + later

    def _play_sampled(
        self, play: Play, episode_problems: list[Any], prompts: list[th.Tensor], first: Completions
    ) -> float | None:
        """:meth:`play` once the first turns ``first`` of ``prompts`` are sampled: scored ahead, stepped ``n_envs``
        at a time, later turns played; the later turns' generation seconds, or None when a callback stopped
        training."""
        env = play.env
        n_envs, generation_seconds = env.num_envs, 0.0
        chunks = [range(start, start + n_envs) for start in range(0, len(episode_problems), n_envs)]
        score_ahead(env, episode_problems, first.tokens.cpu().numpy())
        record = functools.partial(self._record_step, play)
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
            later = play_later_turns(env, self.sample, record, self.algorithm.policy.context_limit, episodes, live,
                                     split_obs(new_obs, live), first.cache, episodes)  # fmt: skip
            if later is None:
                return None
            generation_seconds += later
        return generation_seconds

    def _record_step(
        self,
        play: Play,
        episodes: list[int],
        turn: int,
        played: tuple[list[th.Tensor], tuple[th.Tensor, th.Tensor], th.Tensor],
        outcome: tuple[Any, Any, list[dict[str, Any]]],
        scope: dict[str, Any],
    ) -> bool:
        """Count the completions of one step (``play.job_steps``: every rank's), tell the callback (``scope``: the
        caller's locals, as SB3 passes them), keep the episodes that ended and add the rows of ``episodes``
        (contexts, completions and log-probs ``played``; rewards, dones and infos ``outcome``); False when the
        callback stopped training."""
        model = self.algorithm
        rewards, dones, infos = outcome
        model.num_timesteps += len(episodes) * (model._dist.world_size if play.job_steps else 1)  # the job's
        play.callback.update_locals(scope)
        if not play.callback.on_step():
            return False
        model._update_info_buffer(infos, dones)
        ended = [info for info, done in zip(infos, dones, strict=True) if done]
        play.finished.extend((info.get("episode"), info.get("is_success")) for info in ended)
        play.rows.add(episodes, turn, *played, rewards, infos)
        return True

    def play_again(
        self, play: Play, problems: list[Any], slots: list[int], mine: list[int], refill_round: int
    ) -> tuple[Rows, float] | None:
        """Play the job's groups ``slots`` again with new problems (round ``refill_round`` of this rollout's refills,
        e.g. GRPO's dynamic sampling): this rank's (``mine``, local indices) with the sampling noise of their place
        among the new groups; the episodes' ``problems`` follow. Returns the new rows (episodes numbered from 0) and
        their generation seconds, or None when a callback stopped training."""
        model = self.algorithm
        drawn = self.draw_problems(play.env, slots)  # this rank's, in slots order
        model._seeds.reseed_for_refill(model._iteration, refill_round)
        new, seconds, before, group = Rows(), 0.0, model.num_timesteps, model.group_size
        if mine:
            first = model._dist.rank * model._local_groups
            offset = next(i for i, slot in enumerate(slots) if slot - first in mine) * group
            episodes = [p for p in drawn for _ in range(group)]
            seconds = self.play(replace(play, rows=new, job_steps=False), episodes, offset, len(slots) * group)
            if seconds is None:
                return None
            for k, problem in zip(mine, drawn, strict=True):
                problems[k * group : (k + 1) * group] = [problem] * group
        model.num_timesteps = before + int(model._dist.sum(model.num_timesteps - before))  # every rank's completions
        return new, seconds

    def draw_problems(self, env: VecEnv, slots: list[int] | None = None) -> list[Any]:
        """This rank's problems for the groups ``slots`` (indices among the job's K; default: all K). Every rank
        draws the problems of all of them (``_sampling.problem_keys``) and plays its own: the same groups whatever
        the number of processes (the sampler is reseeded per iteration for the same reason)."""
        model = self.algorithm
        slots = list(range(model.n_groups)) if slots is None else slots
        keys = model._sampling.problem_keys(len(slots), model._seeds, env)
        first = model._dist.rank * model._local_groups
        local = [(slot - first, key) for slot, key in zip(slots, keys, strict=True)]
        mine = [(k, key) for k, key in local if 0 <= k < model._local_groups]
        return [env.env_method("sample_problem", **key, indices=[k % env.num_envs])[0] for k, key in mine]

    def sample(
        self, prompts: list[th.Tensor], noise_offset: int = 0, noise_rows: int | None = None, **turns: Any
    ) -> Completions:
        """The completions of one batch of ``prompts`` now (:meth:`sampling_call`); ``turns``: the KV cache kept
        across turns (``keep_cache``, ``cache``, ``cache_rows``: ``policy.generate``)."""
        return self.sampling_call(prompts, noise_offset, noise_rows, **turns)()

    def sampling_call(
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
        model = self.algorithm
        ids, mask = left_pad(prompts, model.policy.pad_token_id)
        ids, mask = ids.to(model.device), mask.to(model.device)
        from_reference = model._sampling.from_reference(model._iteration, model.logger)
        if model._overlap is not None:
            network = contextlib.nullcontext(model._overlap.sampler_network(from_reference, model.ref_model))
        elif from_reference:
            network = reference_network(model.policy, model.ref_model)
        else:
            network = contextlib.nullcontext(None)
        generator = model._seeds.generator if generator is None else generator
        policy = model.policy

        def call() -> Completions:
            with network as sampler:
                return policy.generate(
                    ids,
                    mask,
                    generator=generator,
                    model=sampler,
                    noise_offset=noise_offset,
                    noise_rows=noise_rows,
                    **turns,
                )

        return call
