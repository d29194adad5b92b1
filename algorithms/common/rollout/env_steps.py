"""Stepping some envs of a VecEnv alone: the later turns of multi-turn episodes (tool calls, feedback).

``VecEnv.step`` steps every env and resets those whose episode ended. The later turns of a multi-turn episode step
only the envs whose episodes still play, each alone through its wrappers (``env_method("step")``, so SB3's
``Monitor`` sees the whole episode), and an env whose episode ended is never reset: its last observation and info
stay as the episode left them. :func:`step_envs` returns what ``VecEnv.step`` would, for those envs.
:func:`score_ahead` lets each env score the first turns it will play in one batch, before they are stepped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

Obs = dict[str, np.ndarray]


def split_obs(obs: Obs, indices: list[int]) -> list[Obs]:
    """The observations of envs ``indices`` out of a VecEnv's batch ``{key: (n_envs, ...)}``."""
    return [{key: value[i] for key, value in obs.items()} for i in indices]


def stack_obs(obs: list[Obs]) -> Obs:
    """Observations of several envs as one batch ``{key: (len(obs), ...)}``, as a VecEnv returns them."""
    return {key: np.stack([o[key] for o in obs]) for key in obs[0]}


def step_envs(
    env: VecEnv, indices: list[int], actions: np.ndarray
) -> tuple[list[Obs], np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Step env ``indices[j]`` alone with ``actions[j]``: its observation, and the rewards ``(n,)``, dones ``(n,)``
    (terminated or truncated) and infos (with SB3's ``"TimeLimit.truncated"``) as ``VecEnv.step`` gives them, without
    the reset of an ended episode."""
    steps = [env.env_method("step", actions[j], indices=[i])[0] for j, i in enumerate(indices)]
    obs = [step[0] for step in steps]
    rewards = np.array([step[1] for step in steps], dtype=np.float32)
    dones = np.array([step[2] or step[3] for step in steps], dtype=bool)
    infos = [{**step[4], "TimeLimit.truncated": bool(step[3] and not step[2])} for step in steps]
    return obs, rewards, dones, infos


def score_ahead(env: VecEnv, problems: list[Any], actions: Any) -> None:
    """Each env scores the first turns it will play in one batch (one call per reward function, one reward-model
    forward); its ``step`` then returns those results. Env ``i`` plays episodes ``i, i + n_envs, ...``."""
    n_envs = env.num_envs
    for i in range(min(n_envs, len(problems))):
        env.env_method("score_ahead", problems[i::n_envs], list(actions[i::n_envs]), indices=[i])
