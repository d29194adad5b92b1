"""Saving, loading and resuming an :class:`~algorithms.common.lm_algorithm.LMAlgorithm` exactly.

What a saved model holds (the file format is :mod:`algorithms.common.serialization`):

- the constructor's arguments, by name (so ``load`` builds the same algorithm and validates them again);
- the weights: the policy, its optimizer state, the frozen reference when there is one (with LoRA on a base
  model from a folder or hub name, the policy's adapters only: ``load`` reads the base from there again);
- the run state: ``num_timesteps``, the update and iteration counters, skipped steps and the algorithm's own
  counters; the RNG states of torch, numpy, Python, the sampler's generator and the problem sampler; each env's
  :meth:`~grpo_gym.R1ZeroEnv.get_state` (reached through the VecEnv); the curriculum's level; the episode
  statistics SB3 logs (``rollout/ep_rew_mean``, ``rollout/success_rate``);
- the env's record (:meth:`~grpo_gym.R1ZeroEnv.describe`: its id and constructor arguments as JSON, and which
  objects a file cannot hold) with the number of envs: ``load`` without ``env`` rebuilds that env (a DummyVecEnv),
  given back what the record says must be passed (``env_objects={"reward_funcs": {...}}``).

Checkpoints are taken at iteration boundaries: a save requested while a rollout is being collected (e.g. by
SB3's ``CheckpointCallback``, which saves from ``on_step``) records the state at the start of that rollout —
the last finished iteration — with the weights, which do not change during a rollout. Loading it and calling
``learn(..., reset_num_timesteps=False)`` collects that rollout again, so nothing is counted and lost.

With the same seed, ``learn(2N)`` and ``learn(N); save; load; learn(N, reset_num_timesteps=False)`` end with
bit-identical parameters and optimizer state on CPU (replay buffers travel with ``save_replay_buffer``). As in
SB3, a schedule of the remaining progress is relative to each ``learn`` call's total, so exactness across
``learn`` calls holds for constant schedules and :class:`~algorithms.common.schedules.UpdateDecay` (the
defaults), not for ``lin_<x>`` schedules split over calls.
"""

from __future__ import annotations

import inspect
import io
import os
import random
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from stable_baselines3.common.utils import check_for_correct_spaces

from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.serialization import decode, encode, read_model_file, write_model_file
from grpo_gym.describe import MUST_PASS, env_kwargs_from_record, recorded_env_id

if TYPE_CHECKING:
    from algorithms.common.lm_algorithm import LMAlgorithm

#: constructor arguments that are not saved (the caller supplies them at load), and attributes of other names
NOT_SAVED = ("self", "policy", "env", "device", "_init_setup_model")
ATTRIBUTE_OF = {"stats_window_size": "_stats_window_size"}


def constructor_arguments(algorithm: LMAlgorithm) -> dict[str, Any]:
    """The algorithm's constructor arguments, read back from its attributes (a model object given as
    ``policy_kwargs["model"]`` is left out: its architecture is in ``model_config``, its weights in the file)."""
    names = [name for name in inspect.signature(type(algorithm).__init__).parameters if name not in NOT_SAVED]
    arguments = {name: getattr(algorithm, ATTRIBUTE_OF.get(name, name)) for name in names}
    policy_kwargs = dict(arguments.get("policy_kwargs") or {})
    if "model" in policy_kwargs and not isinstance(policy_kwargs["model"], (str, os.PathLike)):
        policy_kwargs["model"] = None
    if "model" in policy_kwargs and isinstance(policy_kwargs["model"], os.PathLike):
        policy_kwargs["model"] = os.fspath(policy_kwargs["model"])
    arguments["policy_kwargs"] = policy_kwargs
    return arguments


# ---------------------------------------------------------------------------------------------- run state
def capture(algorithm: LMAlgorithm) -> tuple[dict[str, Any], dict[str, th.Tensor]]:
    """The run state now: a JSON-able dict and the torch RNG states (tensors)."""
    state = {name: getattr(algorithm, name) for name in algorithm.state_attributes}
    state["ep_info_buffer"] = [dict(info) for info in algorithm.ep_info_buffer or []]
    state["ep_success_buffer"] = [bool(success) for success in algorithm.ep_success_buffer or []]
    state["problem_rng"] = algorithm._problem_rng.bit_generator.state
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    state["numpy_rng"] = [kind, keys.tolist(), int(position), int(has_gauss), float(gauss)]
    version, internal, python_gauss = random.getstate()
    state["python_rng"] = [version, list(internal), python_gauss]
    env = algorithm.env
    if env is not None and env.has_attr("get_state"):
        state["env_states"] = env.env_method("get_state")
    curriculum = getattr(algorithm, "_curriculum", None)
    if curriculum is not None:
        state["curriculum"] = curriculum.get_state()
    rng = {"torch": th.get_rng_state(), "generator": algorithm._generator.get_state()}
    if th.cuda.is_available():
        rng.update({f"cuda_{i}": s for i, s in enumerate(th.cuda.get_rng_state_all())})
    return encode(state), rng


def restore(algorithm: LMAlgorithm, state: dict[str, Any], rng: dict[str, th.Tensor]) -> None:
    """Put a :func:`capture`\\ d run state back; the env states are applied when training starts (after SB3's
    ``_setup_learn`` resets the envs), see :meth:`LMAlgorithm._setup_learn`."""
    for name in algorithm.state_attributes:
        if name in state:
            setattr(algorithm, name, state[name])
    window = algorithm._stats_window_size
    algorithm.ep_info_buffer = deque(state.get("ep_info_buffer", []), maxlen=window)
    algorithm.ep_success_buffer = deque(state.get("ep_success_buffer", []), maxlen=window)
    algorithm._problem_rng.bit_generator.state = state["problem_rng"]
    kind, keys, position, has_gauss, gauss = state["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
    version, internal, python_gauss = state["python_rng"]
    random.setstate((version, tuple(internal), python_gauss))
    algorithm._pending_env_states = state.get("env_states")
    if "curriculum" in state:
        algorithm._curriculum = CurriculumCallback.from_state(state["curriculum"])
    th.set_rng_state(rng["torch"])
    algorithm._generator.set_state(rng["generator"])
    cuda = [rng[key] for key in sorted(rng) if key.startswith("cuda_")]
    if cuda and th.cuda.is_available():
        th.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------------------------------- the env record
def env_record(env: Any) -> dict[str, Any] | None:
    """``{"record": <the first env's describe()>, "n_envs": N}``, or None for an env that cannot describe itself
    (not an :class:`~grpo_gym.R1ZeroEnv`)."""
    if env is None or not env.has_attr("describe"):
        return None
    return {"record": env.env_method("describe", indices=[0])[0], "n_envs": env.num_envs}


def recorded_env_kwargs(path: str | os.PathLike, **objects: Any) -> tuple[str, dict[str, Any], int]:
    """The env id, constructor arguments and number of envs recorded in the model file at ``path``; ``objects``
    are what the record says must be passed (and may override recorded values). ``ValueError`` when the file
    holds no env record (a model saved without an env) or an object is missing (the message names each)."""
    data = read_model_file(path)[0]
    saved = data.get("env")
    if not saved:
        raise ValueError(f"{os.fspath(path)} records no env (saved without one, or not an R1Zero-v0 env): pass env=")
    record = saved["record"]
    return recorded_env_id(record), env_kwargs_from_record(record, **objects), int(saved["n_envs"])


def recorded_tokenizer(path: str | os.PathLike) -> str | None:
    """The tokenizer folder or hub name the model file at ``path`` records for its env (``None``: the built-in one,
    no env record, or a tokenizer object a file could not hold)."""
    saved = read_model_file(path)[0].get("env") or {}
    tokenizer = saved.get("record", {}).get("kwargs", {}).get("tokenizer")
    return tokenizer if isinstance(tokenizer, str) and tokenizer != MUST_PASS else None


def _rebuild_env(saved: dict[str, Any], objects: dict[str, Any], seed: int | None, name: str) -> tuple[Any, str]:
    """The VecEnv the record describes and ``""``, or None and why not, warned about (an object the record needs is
    missing, a recorded file is absent here, ...): the model then predicts and exports but does not train."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    record = saved["record"]
    try:
        env_id, kwargs = recorded_env_id(record), env_kwargs_from_record(record, **objects)
        env = make_vec_env(env_id, n_envs=int(saved["n_envs"]), seed=seed, env_kwargs=kwargs, vec_env_cls=DummyVecEnv)
        return env, ""
    except Exception as error:  # any failure to rebuild: the model itself still loads
        reason = (
            f"the env {name} records was not rebuilt ({type(error).__name__}: {error}); pass the objects it names "
            "in env_objects (load(path, env_objects={'reward_funcs': [...], 'task_kwargs': {'data': ...}})), or pass "
            "load(path, env=...), or call model.set_env(env) later. Until then model.get_env() is None: the model "
            "predicts and exports but cannot learn"
        )
        warnings.warn(reason, stacklevel=3)
        return None, reason


# ---------------------------------------------------------------------------------------------- save and load
def save(algorithm: LMAlgorithm, path: str | os.PathLike) -> None:
    """Write the model file (atomically): arguments, weights, and the run state at the last iteration boundary."""
    state, rng = algorithm._boundary if algorithm._in_rollout else capture(algorithm)
    data = {
        "algorithm": type(algorithm).__name__,
        "policy_class": algorithm.policy_class.__name__,
        "observation_space": encode(algorithm.observation_space),
        "action_space": encode(algorithm.action_space),
        "arguments": encode(constructor_arguments(algorithm)),
        "state": state,
        "env": env_record(algorithm.env),
    }
    parameters = algorithm.get_parameters()
    parameters["policy"] = algorithm.policy.file_state_dict(parameters["policy"])  # LoRA: adapters only, maybe
    write_model_file(path, data, parameters, {"rng": rng})


def load(
    cls: type[LMAlgorithm],
    path: str | os.PathLike | io.BufferedIOBase,
    env: Any = None,
    device: th.device | str = "auto",
    custom_objects: dict[str, Any] | None = None,
    allow_pickle: bool = False,
    env_objects: dict[str, Any] | None = None,
    rebuild_env: bool = True,
    **kwargs: Any,
) -> LMAlgorithm:
    """Build the saved algorithm from its file: see :meth:`LMAlgorithm.load`."""
    data, state_dicts, variables = read_model_file(path)
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "the model file"
    if data.get("algorithm") != cls.__name__:
        raise ValueError(f"{name} holds a {data.get('algorithm')} model: load it with {data.get('algorithm')}.load")
    custom = dict(custom_objects or {})
    saved = data.get("arguments", {})
    arguments = {
        key: custom[key] if key in custom else decode(value, key, allow_pickle) for key, value in saved.items()
    }
    observation_space = decode(data["observation_space"], "observation_space")
    action_space = decode(data["action_space"], "action_space")
    env_missing = ""  # why the recorded env was not rebuilt, for learn()'s error
    if env is None and rebuild_env and data.get("env"):
        env, env_missing = _rebuild_env(data["env"], dict(env_objects or {}), arguments.get("seed"), name)
    elif env_objects:
        raise ValueError("env_objects rebuild the recorded env: pass them without env=")
    if env is not None:
        env = cls._wrap_env(env, int(arguments.get("verbose", 0)))
        check_for_correct_spaces(env, observation_space, action_space)
    arguments.update({key: value for key, value in kwargs.items() if key in saved})
    model = cls(policy=data["policy_class"], env=env, device=device, _init_setup_model=False, **arguments)
    if env is None:
        model.observation_space, model.action_space = observation_space, action_space
    model.__dict__.update({key: value for key, value in kwargs.items() if key not in saved})
    model._env_missing = env_missing
    run_state = decode(data["state"], "state", allow_pickle)
    model._token_info = run_state.get("_token_info", {})  # the env's EOS and pad ids, needed to build the policy
    model._setup_model()
    model.set_parameters(state_dicts, exact_match=True, device=device)
    restore(model, run_state, variables.get("rng", {}))
    return model
