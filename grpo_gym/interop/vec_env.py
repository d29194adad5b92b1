"""``ThreadedVecEnv``: SB3's ``DummyVecEnv`` whose ``reset`` and ``step`` run every env at once, one thread each.

For envs that wait on something else (an OpenEnv server's sessions): n sessions answer in about the time of one
instead of n times it. ``env_method`` (the later turns of multi-turn episodes, stepped one env at a time by the
algorithms) still runs one env after another. Each env is touched by one thread at a time, so envs need not be
thread-safe with themselves, only with each other (their own connections, their own state). An exception in one env
is raised from ``reset`` / ``step`` as it would be in ``DummyVecEnv``. This module imports stable-baselines3 (and so
torch): it is imported by :func:`grpo_gym.interop.openenv.openenv_vec_env`, never by ``import grpo_gym``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn


class ThreadedVecEnv(DummyVecEnv):
    """``DummyVecEnv`` with ``reset`` and ``step`` run on all envs at once (module docstring).

    :param env_fns: functions that return the envs
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]]) -> None:
        super().__init__(env_fns)
        self._pool = ThreadPoolExecutor(max_workers=self.num_envs, thread_name_prefix="grpo-gym-vec-env")

    def _each(self, fn: Callable[[int], Any]) -> list[Any]:
        if self.num_envs == 1:
            return [fn(0)]
        return list(self._pool.map(fn, range(self.num_envs)))  # re-raises the first env's exception, in order

    def _step_one(self, index: int) -> tuple[Any, float, bool, dict[str, Any], dict[str, Any] | None]:
        env = self.envs[index]
        obs, reward, terminated, truncated, info = env.step(self.actions[index])
        info["TimeLimit.truncated"] = truncated and not terminated
        reset_info = None
        if terminated or truncated:
            info["terminal_observation"] = obs
            obs, reset_info = env.reset()
        return obs, float(reward), bool(terminated or truncated), info, reset_info

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env at once; an ended episode is reset, as ``DummyVecEnv`` does."""
        for index, (obs, reward, done, info, reset_info) in enumerate(self._each(self._step_one)):
            self.buf_rews[index], self.buf_dones[index], self.buf_infos[index] = reward, done, info
            if reset_info is not None:
                self.reset_infos[index] = reset_info
            self._save_obs(index, obs)
        return self._obs_from_buf(), np.copy(self.buf_rews), np.copy(self.buf_dones), deepcopy(self.buf_infos)

    def reset(self) -> VecEnvObs:
        """Reset every env at once, with the seeds and options set for this reset."""

        def one(index: int) -> tuple[Any, dict[str, Any]]:
            options = {"options": self._options[index]} if self._options[index] else {}
            return self.envs[index].reset(seed=self._seeds[index], **options)

        for index, (obs, info) in enumerate(self._each(one)):
            self.reset_infos[index] = info
            self._save_obs(index, obs)
        self._reset_seeds()
        self._reset_options()
        return self._obs_from_buf()

    def close(self) -> None:
        """Close every env, then the threads."""
        super().close()
        self._pool.shutdown(wait=False)
