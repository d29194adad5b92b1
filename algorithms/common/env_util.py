"""The envs a run trains on: :func:`make_env` builds them (the command line, a saved run's record and the benchmarks
all use it), :func:`make_env_for_model` one from an id for a model's vocabulary, :func:`rollout_token_ids` checks
one for rollouts of whole completions and reads its EOS and pad ids, :class:`MissingEnv` stands in for a loaded
run's env that could not be rebuilt. The rollouts' VecEnv plumbing: :func:`split_obs` / :func:`stack_obs`,
:func:`step_envs` (stepping some envs alone: ``VecEnv.step`` steps every env and resets those whose episode ended; the
later turns of multi-turn episodes step only the envs still playing, each through its wrappers, so SB3's ``Monitor``
sees the whole episode, and an ended episode is never reset) and :func:`score_ahead`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from algorithms.common.model.tokenizer_check import model_tokenizer
from grpo_gym.validation import ArgumentError

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


def make_env(env_id: str, n_envs: int = 1, env_kwargs: dict[str, Any] | None = None, seed: int | None = None) -> VecEnv:
    """``n_envs`` copies of the registered env ``env_id`` made with ``env_kwargs``, in a ``DummyVecEnv`` (each
    wrapped in SB3's ``Monitor``), seeded from ``seed``; a bad argument's error as the env raised it
    (:func:`unwrapped_errors`)."""
    kwargs = env_kwargs or {}
    return unwrapped_errors(make_vec_env, env_id, n_envs=n_envs, seed=seed, env_kwargs=kwargs, vec_env_cls=DummyVecEnv)


#: what gymnasium appends to a ``TypeError`` an env's constructor raised (then the whole kwargs' repr: a dataset)
GYMNASIUM_SUFFIX = " was raised from the environment creator for "


def unwrapped_errors(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)`` (``gym.make`` or a function that calls it), with the error an env's constructor
    raised for a bad argument as it raised it: gymnasium re-raises a ``TypeError`` (our
    :class:`~grpo_gym.validation.ArgumentError` is one) with every argument's repr appended, a dataset's rows
    included. An :class:`ArgumentError` keeps its type (a ``ValueError`` too: the command line prints it as one
    line), any other ``TypeError`` becomes one."""
    try:
        return make(*args, **kwargs)
    except TypeError as error:
        cause = error.__cause__
        if not (GYMNASIUM_SUFFIX in str(error) and isinstance(cause, TypeError)):
            raise
        raise (cause if isinstance(cause, ArgumentError) else ArgumentError(str(cause))) from None


def make_env_for_model(env_id: str, model: Any) -> gym.Env:
    """``gym.make(env_id)``, given the model's tokenizer when the model comes from a folder or hub name that ships
    one: the env then speaks the model's vocabulary (the tokenizer guard's fix, applied for the caller). SB3 would
    ask for ``render_mode="rgb_array"``, which a text env does not have."""
    tokenizer = {"tokenizer": os.fspath(model)} if model_tokenizer(model) is not None else {}
    return gym.make(env_id, **tokenizer)


def rollout_token_ids(env: VecEnv, algorithm: str, n_groups: int, world_size: int, group_size: int) -> dict[str, int]:
    """Check that ``env`` can play an algorithm's rollouts (whole completions; whole groups per process; rows a
    multiple of the envs) and return the token ids the policy needs from it:
    ``{"eos_token_id", "pad_token_id"}``. ``ValueError`` naming the fix otherwise."""
    if not isinstance(env.action_space, spaces.MultiDiscrete):
        raise ValueError(f"{algorithm} trains on whole completions: make the env with action_mode='sequence'")
    if n_groups % world_size:
        raise ValueError(
            f"n_groups ({n_groups}) must be a multiple of the number of processes ({world_size}): "
            "each process trains whole groups"
        )
    local_rows = n_groups // world_size * group_size
    if local_rows % env.num_envs:
        raise ValueError(
            f"n_groups / processes * group_size ({local_rows}) must be a multiple of the number of envs "
            f"({env.num_envs})"
        )
    codec = env.get_attr("codec", indices=[0])[0]
    return {"eos_token_id": codec.eos_id, "pad_token_id": codec.pad_id}


class MissingEnv:
    """What ``model.get_env()`` returns for a model loaded without the env its file records (a reward function or
    dataset the file cannot hold was not passed back): false like ``None``, and any use of it raises an
    ``AttributeError`` that says why the env is missing and what to pass.

    :param reason: why the recorded env was not rebuilt, and how to give it back
    """

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def __bool__(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe dunders: they see a plain object
            raise AttributeError(name)
        raise AttributeError(f"model.get_env() has no env to {name}: {self._reason}")

    def __repr__(self) -> str:
        return f"MissingEnv({self._reason!r})"


def keeps_turn_cache(setting: bool | str, env: VecEnv) -> bool:
    """Whether rollouts keep the KV cache of each turn for the next (``turn_cache``): ``True``/``False`` as given;
    ``"auto"`` when the env's episodes may have more than one model turn (``max_turns > 1`` or ``tools``; an env
    without ``max_turns`` is taken to play several)."""
    if setting != "auto":
        return bool(setting)
    if not env.has_attr("max_turns"):
        return True
    many = int(env.get_attr("max_turns", indices=[0])[0]) > 1
    return many or (env.has_attr("tools") and env.get_attr("tools", indices=[0])[0] is not None)
