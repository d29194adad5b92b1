"""What a saved run holds, on plain data: the algorithm hands this module dicts and tensors, never itself.

A model file (the format is :mod:`algorithms.common.saving.model_file`) holds:

- the constructor's arguments, by name (so ``load`` builds the same algorithm and validates them again);
- the weights: the policy, its optimizer state, the frozen reference when there is one (with LoRA on a base
  model from a folder or hub name, the policy's adapters only: ``load`` reads the base from there again); in a
  sharded checkpoint (``save_sharded``) none: ``data["weights"]`` says they are the shards of the folder the file
  lies in;
- the run state (:meth:`~algorithms.common.base_class.LMBaseAlgorithm.get_run_state`):
  ``num_timesteps``, the update and iteration counters, skipped steps and the algorithm's own counters; the RNG
  states of torch, numpy, Python, the sampler's generator and the problem stream; each env's
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium.spaces import Space
from stable_baselines3.common.utils import check_for_correct_spaces

from algorithms.common.env_util import make_env
from algorithms.common.saving.checks import DAMAGED_FIX, check_run_state, check_weight_entries, missing_env_arguments
from algorithms.common.saving.model_file import FORMAT, decode, encode, read_model_file, write_model_file
from grpo_gym.describe import MUST_PASS, env_kwargs_from_record, recorded_env_id
from grpo_gym.env import R1ZeroEnv
from grpo_gym.validation import user_stacklevel


@dataclass
class SavedRun:
    """A model file read back and decoded: what
    :meth:`LMBaseAlgorithm.load <algorithms.common.base_class.LMBaseAlgorithm.load>` builds the algorithm from."""

    algorithm: str  # the class name the file was saved by
    policy_class: str
    observation_space: Any
    action_space: Any
    arguments: dict[str, Any]  # the constructor's arguments, decoded
    state: dict[str, Any]  # the run state, decoded
    state_dicts: dict[str, Any]  # the weights
    rng: dict[str, th.Tensor]  # the torch RNG states
    env: dict[str, Any] | None  # the env record, see :func:`env_record`
    sharded_weights: bool = False  # the weights are in the sharded checkpoint folder around the file
    #: of the format this version writes (False: an earlier version's, whose missing entries take their defaults)
    current: bool = True
    #: whether the run kept a frozen reference (its weights ``ref_model.pth``, or the shards'); None: not recorded
    reference: bool | None = None


#: ``data["weights"]`` of a model file whose weights are the shards of the checkpoint folder it lies in
SHARDED_WEIGHTS = "sharded checkpoint"


def read_saved_run(
    path: str | os.PathLike | io.BufferedIOBase,
    custom_objects: dict[str, Any] | None = None,
    allow_pickle: bool = False,
) -> SavedRun:
    """Read and decode the model file at ``path``; ``custom_objects`` replace saved arguments by name (an entry that
    would need unpickling is refused, naming it, unless replaced here or ``allow_pickle``)."""
    data, state_dicts, variables = read_model_file(path)
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "the model file"
    _check_data(data, variables, name)
    current = data["format"] == FORMAT
    reference = data.get("reference") if current else None
    if data.get("weights") != SHARDED_WEIGHTS:
        check_weight_entries(state_dicts, name, reference=bool(reference))
    custom = dict(custom_objects or {})
    arguments = {
        key: custom[key] if key in custom else decode(value, key, allow_pickle)
        for key, value in data.get("arguments", {}).items()
    }
    spaces = {}
    for key in ("observation_space", "action_space"):
        try:
            spaces[key] = decode(data[key], key)
            if not isinstance(spaces[key], Space):  # e.g. {"__space__": ..., "extra": 1} decodes as a plain dict
                raise ValueError(f"it decodes to a {type(spaces[key]).__name__}")
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"{name}: its {key} is not a space ({type(error).__name__}: {error}); the file is "
                             "damaged: use another save") from None  # fmt: skip
    return SavedRun(
        algorithm=str(data.get("algorithm")),
        policy_class=data["policy_class"],
        observation_space=spaces["observation_space"],
        action_space=spaces["action_space"],
        arguments=arguments,
        state=decode(data["state"], "state", allow_pickle),
        state_dicts=state_dicts,
        rng=variables.get("rng", {}),
        env=data.get("env"),
        sharded_weights=data.get("weights") == SHARDED_WEIGHTS,
        current=current,
        reference=reference,
    )


def write_run(
    path: str | os.PathLike,
    names: tuple[str, str],
    spaces: tuple[Any, Any],
    arguments: dict[str, Any],
    state: tuple[dict[str, Any], dict[str, th.Tensor]],
    env: Any,
    parameters: dict[str, Any],
    reference: bool,
) -> None:
    """Write a model file (atomically, :func:`~algorithms.common.saving.model_file.write_model_file`) from what the
    algorithm hands over: its class and policy class ``names``, its observation and action ``spaces``, its
    constructor's ``arguments``, its run ``state`` (JSON-able dict, torch RNG tensors), its ``env`` (recorded when
    it can describe itself), the state dicts ``parameters`` (none, ``{}``, for a sharded checkpoint's file, whose
    weights are the shards beside it) and whether the run keeps a frozen ``reference`` (whose weights a file of
    this format must then hold)."""
    run_state, rng = state
    data = {
        "algorithm": names[0],
        "policy_class": names[1],
        "observation_space": encode(spaces[0]),
        "action_space": encode(spaces[1]),
        "arguments": encode(arguments),
        "state": run_state,
        "env": env_record(env),
        "reference": reference,
        **({"weights": SHARDED_WEIGHTS} if not parameters else {}),
    }
    write_model_file(path, data, parameters, {"rng": rng})


#: what a model file's ``data`` holds, by key, and the type of each (``env`` may also be None)
DATA_KEYS = {
    "algorithm": str,
    "policy_class": str,
    "observation_space": dict,
    "action_space": dict,
    "arguments": dict,
    "state": dict,
    "env": dict,
    "reference": bool,  # a file of an earlier format may lack it
}
#: the run-state entries a saved run cannot continue without
STATE_KEYS = ("problem_rng", "numpy_rng", "python_rng")
#: the most envs a recorded env may ask for (a record is data: a crafted one must not build envs until memory ends)
MAX_RECORDED_ENVS = 1024


def _check_data(data: dict[str, Any], variables: dict[str, Any], name: str) -> None:
    """Every key ``data`` must hold, with its type, and the run state's RNG entries: ``ValueError`` naming the key
    otherwise (before anything is built from the file)."""
    for key, kind in DATA_KEYS.items():
        value = data.get(key)
        older = key == "reference" and key not in data and data["format"] != FORMAT
        if not isinstance(value, kind) and not (key == "env" and value is None) and not older:
            found = "missing" if key not in data else f"a {type(value).__name__}"
            raise ValueError(
                f"{name}: 'data' entry {key!r} must be a {kind.__name__}, found {found}; the file is damaged"
            )
    absent = [key for key in STATE_KEYS if key not in data["state"]]
    rng = variables.get("rng")
    if absent or not isinstance(rng, dict) or not {"torch", "generator"} <= rng.keys():
        missing = absent + ([] if isinstance(rng, dict) and {"torch", "generator"} <= rng.keys() else ["rng"])
        raise ValueError(
            f"{name}: the run state lacks {missing} (random generators' states; 'rng': pytorch_variables.pth's), which "
            f"a run continues from; {DAMAGED_FIX}"
        )
    check_run_state(data["state"], rng, name)


def check_recorded_envs(saved: Any, name: str = "the record", complete: bool = False) -> int:
    """The number of envs an env record (``{"record": ..., "n_envs": N}``) asks for, in ``[1,``
    :data:`MAX_RECORDED_ENVS` ``]``; ``ValueError`` naming it otherwise, or arguments of the env it does not take
    (or, when ``complete``, as a file of the current format's, every argument it takes: it records them all)."""
    n_envs = saved.get("n_envs") if isinstance(saved, dict) else None
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or not 1 <= n_envs <= MAX_RECORDED_ENVS:
        raise ValueError(
            f"{name}: the recorded env asks for n_envs={n_envs!r}; it must be an integer in [1, {MAX_RECORDED_ENVS}] "
            "(pass env= to load the model with envs of your own)"
        )
    if not isinstance(saved.get("record"), dict):
        raise ValueError(f"{name}: the env record is not a dict; pass env=")
    kwargs = saved["record"].get("kwargs")
    if not isinstance(kwargs, dict):
        raise ValueError(f"{name}: the env record's 'kwargs' is not a dict; pass env=")
    unknown = sorted(set(kwargs) - set(inspect.signature(R1ZeroEnv).parameters))
    if unknown:
        raise ValueError(
            f"{name}: the env record names arguments R1ZeroEnv does not take: {unknown} (written by another version, "
            "or edited); pass env= with an env of your own"
        )
    missing = missing_env_arguments(saved) if complete else []
    if missing:
        raise ValueError(
            f"{name}: the env record lacks the arguments {missing}, which every record holds; {DAMAGED_FIX}"
        )
    return n_envs


def plain_policy_kwargs(policy_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``policy_kwargs`` as a file records them: a model object given as ``model`` is left out (its architecture is
    in ``model_config``, its weights in the file), a path-like ``model`` becomes a string."""
    kwargs = dict(policy_kwargs or {})
    model = kwargs.get("model")
    if "model" in kwargs and not isinstance(model, (str, os.PathLike)):
        kwargs["model"] = None
    elif isinstance(model, os.PathLike):
        kwargs["model"] = os.fspath(model)
    return kwargs


# ---------------------------------------------------------------------------------------------- global RNGs
def global_rng_state() -> dict[str, Any]:
    """numpy's and Python's global RNG states as JSON data."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    return {
        "numpy_rng": [kind, keys.tolist(), int(position), int(has_gauss), float(gauss)],
        "python_rng": [version, list(internal), python_gauss],
    }


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`global_rng_state` gave."""
    kind, keys, position, has_gauss, gauss = state["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
    version, internal, python_gauss = state["python_rng"]
    random.setstate((version, tuple(internal), python_gauss))


def torch_rng_state() -> dict[str, th.Tensor]:
    """torch's global RNG states (CPU, and every CUDA device when there is one)."""
    rng = {"torch": th.get_rng_state()}
    if th.cuda.is_available():
        rng.update({f"cuda_{i}": s for i, s in enumerate(th.cuda.get_rng_state_all())})
    return rng


def set_torch_rng_state(rng: dict[str, th.Tensor]) -> None:
    """Put back what :func:`torch_rng_state` gave."""
    th.set_rng_state(rng["torch"])
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
    n_envs = check_recorded_envs(saved, os.fspath(path), complete=data["format"] == FORMAT)
    record = saved["record"]
    return recorded_env_id(record), env_kwargs_from_record(record, **objects), n_envs


def recorded_tokenizer(path: str | os.PathLike) -> str | None:
    """The tokenizer folder or hub name the model file at ``path`` records for its env (``None``: the built-in one,
    no env record, or a tokenizer object a file could not hold)."""
    saved = read_model_file(path)[0].get("env") or {}
    tokenizer = saved.get("record", {}).get("kwargs", {}).get("tokenizer") if isinstance(saved, dict) else None
    return tokenizer if isinstance(tokenizer, str) and tokenizer != MUST_PASS else None


def rebuild_env(saved: dict[str, Any], objects: dict[str, Any], seed: int | None, name: str) -> tuple[Any, str]:
    """The VecEnv the record describes and ``""``, or None and why not, warned about (an object the record needs is
    missing, a recorded file is absent here, ...): the model then predicts and exports but does not train."""
    try:
        n_envs, record = check_recorded_envs(saved), saved["record"]
        env_id, kwargs = recorded_env_id(record), env_kwargs_from_record(record, **objects)
        return make_env(env_id, n_envs, kwargs, seed), ""
    except Exception as error:  # any failure to rebuild: the model itself still loads
        reason = (
            f"the env {name} records was not rebuilt ({type(error).__name__}: {error}); pass the objects it names "
            "in env_objects (load(path, env_objects={'reward_funcs': [...], 'task_kwargs': {'data': ...}})), or pass "
            "load(path, env=...), or call model.set_env(env) later. Until then the model has no env (model.get_env() "
            "is false like None, and says this when used): it predicts and exports but cannot learn"
        )
        warnings.warn(reason, stacklevel=user_stacklevel())  # the caller of load()
        return None, reason


def env_to_load(
    saved: SavedRun, env: Any, env_objects: dict[str, Any] | None, rebuild: bool, name: str, wrap: Callable[[Any], Any]
) -> tuple[Any, str]:
    """The env a loaded model gets, wrapped (``wrap``: SB3's ``_wrap_env``) and checked against the saved spaces:
    ``env`` when given, else the one the file records rebuilt (unless ``rebuild`` is False), else None; and why the
    recorded env was not rebuilt (``""`` when it was, or was not asked for), for ``learn()``'s error."""
    missing = ""
    source = "the env given" if env is not None else "the env rebuilt from its record"
    if env is None and rebuild and saved.env:
        env, missing = rebuild_env(saved.env, dict(env_objects or {}), saved.arguments.get("seed"), name)
    elif env_objects:
        raise ValueError("env_objects rebuild the recorded env: pass them without env=")
    if env is None:
        return None, missing
    env = wrap(env)
    try:
        check_for_correct_spaces(env, saved.observation_space, saved.action_space)
    except ValueError as error:
        raise ValueError(
            f"{name}: {error}; {source} does not fit the model (its context_length, max_new_tokens or "
            "action_mode differ from the run's): make the env with the run's settings"
        ) from None
    return env, missing
