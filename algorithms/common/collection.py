"""Rollout collection, the first step of every iteration: problems drawn, completions sampled in one batch,
stepped through the env(s), and the rows handed to the algorithm's ``_build_batch``.

:class:`RolloutCollection` is a mixin of :class:`~algorithms.common.lm_algorithm.LMAlgorithm` (the role of
``OnPolicyAlgorithm.collect_rollouts`` in SB3): it reads the algorithm's policy, env, sampler generator, problem
sampler and distributed helper, and writes ``self._rollout``. Subclasses hook in with ``_before_rollout``,
``_extend_rollout`` (e.g. dynamic sampling), ``_problem_keys`` (e.g. prioritised prompts),
``_samples_from_reference`` and ``_build_batch``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common import state
from algorithms.common.batch import RolloutBatch, left_pad
from algorithms.common.generation import Completions
from algorithms.common.rollout import Rows, contexts_from_obs


class RolloutCollection:
    """``collect_rollouts`` and its steps, for :class:`~algorithms.common.lm_algorithm.LMAlgorithm`."""

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback) -> bool:
        """Sample K problems, G completions each in one batch, step them through the env, store the batch.

        Episode ``e`` plays problem ``e // G``. The first turn of every episode is sampled in one batch; the
        episodes are then stepped ``n_envs`` at a time (reset with the pinned problem, step the completion).
        Multi-turn episodes (feedback, tool calls) answer again from the env's new context until they end: the next
        turns of a chunk's episodes still playing are sampled in one batch (:meth:`_play_later_turns`), so
        ``n_envs`` is the batch of those turns. A subclass may then replace groups (:meth:`_extend_rollout`, e.g.
        dynamic sampling) before the batch is built.
        """
        self._boundary, self._in_rollout = state.capture(self), True  # an iteration boundary
        callback.on_rollout_start()
        self.policy.set_training_mode(False)
        self._before_rollout(env)
        episode_problems = [p for p in self._draw_problems(env) for _ in range(self.group_size)]
        self._generator.manual_seed(self._sampling_seed + 1 + self._iteration)
        rows, finished = Rows(), []  # (Monitor episode, is_success) of the episodes that ended
        local_rows = len(episode_problems)
        noise = {"noise_offset": self._dist.rank * local_rows, "noise_rows": self.n_groups * self.group_size}
        generation_seconds = self._play(env, callback, episode_problems, rows, finished, job_steps=True, **noise)
        if generation_seconds is None:
            return False
        extended = self._extend_rollout(env, callback, rows, finished, episode_problems)
        if extended is None:
            return False
        generation_seconds += extended
        self._merge_episode_infos(finished)
        self._check_reward_errors(rows)
        self._rollout = self._build_batch(rows, generation_seconds)
        self._in_rollout = False
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

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
        n_envs = env.num_envs
        chunks = [range(start, start + n_envs) for start in range(0, len(episode_problems), n_envs)]
        prompts: list[th.Tensor] = []
        for chunk in chunks:
            env.set_options([{"problem": episode_problems[e]} for e in chunk])
            prompts.extend(contexts_from_obs(env.reset(), self.policy.context_limit))
        timer = time.perf_counter()
        first = self._sample(prompts, noise_offset=noise_offset, noise_rows=noise_rows)
        generation_seconds = time.perf_counter() - timer
        self._score_ahead(env, episode_problems, first.tokens.cpu().numpy())
        for chunk in chunks:
            env.set_options([{"problem": episode_problems[e]} for e in chunk])
            env.reset()
            contexts = [prompts[e] for e in chunk]
            completions = first.tokens[chunk.start : chunk.stop], first.mask[chunk.start : chunk.stop]
            log_probs = first.log_probs[chunk.start : chunk.stop]
            new_obs, rewards, dones, infos = env.step(completions[0].cpu().numpy())
            played = (contexts, completions, log_probs)
            if not self._record_step(
                callback, rows, finished, list(chunk), 0, played, (rewards, dones, infos), job_steps, locals()
            ):
                return None
            live = [i for i, done in enumerate(dones) if not done]  # env i of the chunk plays episode chunk[i]
            obs = [{key: value[i] for key, value in new_obs.items()} for i in live]
            later = self._play_later_turns(env, callback, rows, finished, chunk, live, obs, job_steps)
            if later is None:
                return None
            generation_seconds += later
        return generation_seconds

    def _play_later_turns(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rows: Rows,
        finished: list[tuple[Any, Any]],
        chunk: range,
        live: list[int],
        obs: list[dict[str, np.ndarray]],
        job_steps: bool,
    ) -> float | None:
        """Multi-turn episodes: the chunk's envs ``live`` (their observations ``obs``) answer again from the env's new
        context, sampled in one batch per turn, until every episode ended. Each env is stepped alone
        (``env_method("step")``, through its wrappers, e.g. ``Monitor``), so an env whose episode ended is not
        stepped again (no auto-reset). The generation seconds, or None when a callback stopped training."""
        generation_seconds, turn = 0.0, 0
        while live:
            turn += 1
            stacked = {key: np.stack([o[key] for o in obs]) for key in obs[0]}
            contexts = contexts_from_obs(stacked, self.policy.context_limit)
            timer = time.perf_counter()
            answer = self._sample(contexts)
            generation_seconds += time.perf_counter() - timer
            actions = answer.tokens.cpu().numpy()
            steps = [env.env_method("step", actions[j], indices=[i])[0] for j, i in enumerate(live)]
            obs = [step[0] for step in steps]
            rewards = np.array([step[1] for step in steps], dtype=np.float32)
            dones = np.array([step[2] or step[3] for step in steps])
            infos = [{**step[4], "TimeLimit.truncated": step[3] and not step[2]} for step in steps]
            episodes = [chunk[i] for i in live]
            played = (contexts, (answer.tokens, answer.mask), answer.log_probs)
            if not self._record_step(
                callback, rows, finished, episodes, turn, played, (rewards, dones, infos), job_steps, locals()
            ):
                return None
            live = [i for i, done in zip(live, dones, strict=True) if not done]
            obs = [o for o, done in zip(obs, dones, strict=True) if not done]
        return generation_seconds

    def _record_step(
        self,
        callback: BaseCallback,
        rows: Rows,
        finished: list[tuple[Any, Any]],
        episodes: list[int],
        turn: int,
        played: tuple[list[th.Tensor], tuple[th.Tensor, th.Tensor], th.Tensor],
        outcome: tuple[np.ndarray, np.ndarray, list[dict[str, Any]]],
        job_steps: bool,
        scope: dict[str, Any],
    ) -> bool:
        """Count the completions of one step, tell the callback (``scope``: the caller's locals), keep the episodes
        that ended and add the rows; False when the callback stopped training."""
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

    def _extend_rollout(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rows: Rows,
        finished: list[tuple[Any, Any]],
        episode_problems: list[Any],
    ) -> float | None:
        """Called after the rollout's episodes are played, before the batch is built: a subclass may play more
        episodes and change ``rows`` (and ``episode_problems``) in place. Returns the extra generation seconds, or
        None when a callback stopped training."""
        return 0.0

    @staticmethod
    def _score_ahead(env: VecEnv, problems: list[Any], actions: np.ndarray) -> None:
        """Each env scores the first turns it will play in one batch (one call per reward function, one reward-model
        forward); its ``step`` then returns those results. Env ``i`` plays episodes ``i, i + n_envs, ...``."""
        n_envs = env.num_envs
        for i in range(min(n_envs, len(problems))):
            env.env_method("score_ahead", problems[i::n_envs], list(actions[i::n_envs]), indices=[i])

    def _before_rollout(self, env: VecEnv) -> None:
        """Called at the start of every rollout (e.g. to move a reward weight)."""

    def _draw_problems(self, env: VecEnv, slots: list[int] | None = None) -> list[Any]:
        """This rank's problems for the groups ``slots`` (indices among the job's K; default: all K). Every rank
        draws the problems of all of them (:meth:`_problem_keys`) and plays its own: the same groups whatever the
        number of processes (the sampler is reseeded per iteration for the same reason)."""
        slots = list(range(self.n_groups)) if slots is None else slots
        keys = self._problem_keys(len(slots))
        first = self._dist.rank * self._local_groups
        local = [(slot - first, key) for slot, key in zip(slots, keys, strict=True)]
        mine = [(k, key) for k, key in local if 0 <= k < self._local_groups]
        return [env.env_method("sample_problem", **key, indices=[k % env.num_envs])[0] for k, key in mine]

    def _problem_keys(self, n: int) -> list[dict[str, Any]]:
        """The ``sample_problem`` arguments of ``n`` problems (a fresh seed each), the same on every rank."""
        return [{"seed": int(s)} for s in self._problem_rng.integers(2**63 - 1, size=n)]

    def _samples_from_reference(self) -> bool:
        """Whether the frozen reference (:meth:`_reference`) samples this rollout instead of the policy."""
        return False

    def _sample(self, prompts: list[th.Tensor], noise_offset: int = 0, noise_rows: int | None = None) -> Completions:
        ids, mask = left_pad(prompts, self.policy.pad_token_id)
        sampler = self._reference() if self._samples_from_reference() else contextlib.nullcontext(None)
        with sampler as model:
            return self.policy.generate(
                ids.to(self.device),
                mask.to(self.device),
                generator=self._generator,
                model=model,
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

    def _check_reward_errors(self, rows: Rows) -> None:
        """Log ``rollout/reward_errors`` (completions whose reward raised, every rank's); when every completion of
        the iteration erred, stop training with that error (the env has warned with each first one)."""
        errors = [info["reward_errors"] for info in rows.infos if info.get("reward_errors")]
        failed, total = float(len(errors)), float(len(rows.infos))
        if self._dist.enabled:
            failed, total = self._dist.sum(failed), self._dist.sum(total)
        self.logger.record("rollout/reward_errors", failed)
        if total and failed == total:
            component, message = next(iter(errors[0].items())) if errors else ("?", "on another process")
            raise RuntimeError(
                f"the reward of every completion of this iteration raised an error ({component}: {message}); "
                "fix the reward function or verifier (R1ZeroEnv(on_reward_error='raise') shows the traceback)"
            )

    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """The rollout's rows as the batch the update trains on (the subclass's advantages)."""
        raise NotImplementedError
