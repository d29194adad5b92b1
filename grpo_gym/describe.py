"""A JSON record of how an env was made, and rebuilding the env from it: what a saved model keeps of its env.

:meth:`R1ZeroEnv.describe() <grpo_gym.env.R1ZeroEnv.describe>` returns (``json.dumps`` works on it)::

    {"format": "grpo-gym-env/1", "env_id": "R1Zero-v0",
     "kwargs": {...the constructor's arguments...},
     "needs": ["reward_funcs", "task_kwargs.data"]}   # what must be passed back when rebuilding

How each argument is recorded:

- numbers, strings, booleans and ``None``: as given (the constructor's arguments, not the run-time state:
  ``get_state()`` holds that);
- ``tokenizer``: ``None`` (built-in), a folder or hub name as given; a tokenizer object by its ``name_or_path``
  when that is a local folder or a hub name, else it must be passed;
- ``task``: a built-in name, ``"reasoning_gym:<dataset>"``, or a ``"module:Class"`` path (a name registered with
  :func:`~grpo_gym.tasks.register_task` is recorded by its class's importable path); a task object, or a class that
  cannot be imported, must be passed;
- ``task_kwargs``: paths, numbers and strings as given, small JSON lists and dicts too (at most 64 KiB); anything
  else (a ``datasets.Dataset``, a large list of rows) must be passed, as ``task_kwargs={"data": ...}``;
- ``reward_model``: a :class:`RewardModelScorer` or path by its folder; another scorer object must be passed;
- ``reward_funcs``: by name only, and they must always be passed: a dict, or a list whose functions are named as the
  env names them (:func:`~grpo_gym.rewards.functions.named_reward_funcs`); you may name them by
  ``"module:function"`` (``reward_funcs=["my_rewards:accuracy"]``, ``grpo-gym eval --reward-funcs
  my_rewards:accuracy``), imported then because you named them. A record never names code to import for a reward
  function, and a task recorded by ``"module:Class"`` is rebuilt only when that module is already imported: a file
  never makes the process run code it chose.

:func:`env_kwargs_from_record` turns a record and the objects you pass into the constructor's arguments (for
``make_vec_env(env_id, env_kwargs=...)``); :meth:`R1ZeroEnv.from_description` and :func:`make_env_from_record`
build the env. A missing object is a ``ValueError`` naming each one and how to pass it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from grpo_gym.rewards.functions import named_reward_funcs
from grpo_gym.tasks import REASONING_GYM_PREFIX, task_path

RECORD_FORMAT = "grpo-gym-env/1"
MUST_PASS = "<must be passed>"
MAX_RECORDED_BYTES = 64 * 1024
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PLAIN = (str, int, float, bool, type(None))


def _jsonable(value: Any) -> Any:
    """``value`` when it is small JSON data (a path as its string), else :data:`MUST_PASS`."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple, dict)):
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            return MUST_PASS
        return json.loads(text) if len(text) <= MAX_RECORDED_BYTES else MUST_PASS
    return MUST_PASS


def _file_or_value(value: Any) -> Any:
    """A path to an existing file made absolute (the record may be read from another working directory), other
    values as :func:`_jsonable` records them."""
    value = _jsonable(value)
    return os.path.abspath(value) if isinstance(value, str) and value != MUST_PASS and os.path.isfile(value) else value


def _tokenizer(value: Any) -> Any:
    if value is None or isinstance(value, (str, os.PathLike)):
        return None if value is None else os.fspath(value)
    name = getattr(value, "name_or_path", None)
    if isinstance(name, str) and name and (os.path.isdir(name) or (_HUB_NAME.match(name) and not os.path.exists(name))):
        return os.path.abspath(name) if os.path.isdir(name) else name
    return MUST_PASS


def _reward_model(value: Any) -> Any:
    if value is None or isinstance(value, (str, os.PathLike)):
        return None if value is None else os.fspath(value)
    path = getattr(value, "path", None)
    if getattr(value, "trust_remote_code", False):  # a record never opts in to a folder's code: pass the object
        return MUST_PASS
    return path if type(value).__name__ == "RewardModelScorer" and isinstance(path, str) else MUST_PASS


def describe_env(init_arguments: Mapping[str, Any], env_id: str, reward_func_names: list[str]) -> dict[str, Any]:
    """The record of an env made as ``env_id`` with these constructor arguments, whose reward functions the env
    named ``reward_func_names`` (see the module docstring)."""
    given = dict(init_arguments)
    kwargs: dict[str, Any] = {
        name: _jsonable(value)
        for name, value in given.items()
        if name not in ("task", "task_kwargs", "tokenizer", "reward_model", "reward_funcs")
    }
    kwargs["task"] = task_path(given["task"]) or MUST_PASS
    task_kwargs = given["task_kwargs"]
    kwargs["task_kwargs"] = None if task_kwargs is None else {k: _file_or_value(v) for k, v in task_kwargs.items()}
    kwargs["tokenizer"] = _tokenizer(given["tokenizer"])
    kwargs["reward_model"] = _reward_model(given["reward_model"])
    given_funcs = given["reward_funcs"]
    kwargs["reward_funcs"] = None if given_funcs is None else dict.fromkeys(reward_func_names, MUST_PASS)
    needs = [name for name, value in kwargs.items() if value == MUST_PASS]
    needs += [f"task_kwargs.{k}" for k, v in (kwargs["task_kwargs"] or {}).items() if v == MUST_PASS]
    if reward_func_names:
        needs.append("reward_funcs")
    return {"format": RECORD_FORMAT, "env_id": env_id, "kwargs": kwargs, "needs": needs}


def reward_funcs_hint(record: Mapping[str, Any]) -> str:
    """How to pass back the record's reward functions, in Python and on the command line."""
    names = list(record["kwargs"]["reward_funcs"] or {})
    in_python = ", ".join(f"{name!r}: ..." for name in names)
    flags = " ".join(f"{name}=<module>:<function>" for name in names)
    return f"reward_funcs={{{in_python}}} (on the command line: --reward-funcs {flags})"


def _how_to_pass(need: str, record: dict[str, Any]) -> str:
    if need == "reward_funcs":
        return reward_funcs_hint(record)
    if need.startswith("task_kwargs."):
        return f"task_kwargs={{{need.split('.', 1)[1]!r}: ...}}"
    return f"{need}=..."


def env_kwargs_from_record(record: Mapping[str, Any], **objects: Any) -> dict[str, Any]:
    """The constructor's arguments from ``record`` and the objects it ``needs`` (see the module docstring).

    :param record: what :meth:`R1ZeroEnv.describe` returned
    :param objects: the arguments to pass back (``reward_funcs={...}``, ``tokenizer=...``, ``task=...``,
        ``task_kwargs={"data": ...}``); they may also override recorded values
    :raises ValueError: when the record is not one, or an object it needs is missing
    """
    if not isinstance(record, Mapping) or record.get("format") != RECORD_FORMAT:
        found = record.get("format") if isinstance(record, Mapping) else type(record).__name__
        raise ValueError(f"not an env record (format {found!r}, expected {RECORD_FORMAT!r})")
    kwargs = copy.deepcopy(dict(record["kwargs"]))
    for name, value in objects.items():
        if name not in kwargs:
            raise ValueError(f"unknown env argument {name!r}; the record has: {', '.join(kwargs)}")
        if name == "task_kwargs" and isinstance(value, Mapping) and isinstance(kwargs["task_kwargs"], dict):
            kwargs["task_kwargs"].update(value)
        elif name == "reward_funcs" and isinstance(kwargs["reward_funcs"], dict) and value is not None:
            value = named_reward_funcs(value)  # a list is named as the env names it; strings imported (you named them)
            absent = sorted(set(kwargs["reward_funcs"]) - set(value))
            if absent:
                raise ValueError(
                    f"reward_funcs: the record names {absent} too ({sorted(value)} given); pass every recorded "
                    f"function: {reward_funcs_hint(record)}"
                )
            kwargs["reward_funcs"] = value
        else:
            kwargs[name] = value
    if "reward_funcs" not in objects:
        _check_recorded_funcs(kwargs["reward_funcs"])
    needs = [*record.get("needs", []), "reward_funcs"]  # a crafted record may leave its reward functions out
    missing = list(dict.fromkeys(need for need in needs if _still_missing(need, kwargs)))
    if missing:
        shown = ", ".join(_how_to_pass(need, dict(record)) for need in missing)
        raise ValueError(f"rebuilding the env needs objects a file does not hold: pass {shown}")
    _check_task_module(kwargs["task"], "task" in objects)
    return kwargs


def _check_recorded_funcs(recorded: Any) -> None:
    """A record names its reward functions, never code: ``None`` or ``{name: MUST_PASS}`` (what :func:`describe_env`
    writes); a ``"module:function"`` string or anything else would be imported or called, so it is refused."""
    if recorded is None or (isinstance(recorded, dict) and all(fn == MUST_PASS for fn in recorded.values())):
        return
    shown = json.dumps(recorded, default=repr)[:200]
    raise ValueError(
        f"the record's reward_funcs is {shown}, not the names of functions to pass: a record never names code to "
        "import; pass the functions yourself (reward_funcs=[...] in Python, --reward-funcs module:function on the "
        "command line)"
    )


def _still_missing(need: str, kwargs: dict[str, Any]) -> bool:
    if need.startswith("task_kwargs."):
        return (kwargs["task_kwargs"] or {}).get(need.split(".", 1)[1]) == MUST_PASS
    if need == "reward_funcs":  # a list (["module:function", ...]) names every function it holds
        funcs = kwargs["reward_funcs"]
        return isinstance(funcs, dict) and any(fn == MUST_PASS for fn in funcs.values())
    return kwargs.get(need) == MUST_PASS


def _check_task_module(task: Any, passed: bool) -> None:
    """A recorded ``"module:Class"`` task is rebuilt only from a module this process has already imported."""
    if passed or not isinstance(task, str) or ":" not in task or task.startswith(REASONING_GYM_PREFIX):
        return
    module = task.split(":", 1)[0]
    if module not in sys.modules and not (module == "__main__" and "__mp_main__" in sys.modules):
        raise ValueError(
            f"the record's task is {task!r}: import {module} first (a record never imports code by itself), "
            "or pass task=..."
        )


def recorded_env_id(record: Mapping[str, Any]) -> str:
    """The record's env id, checked without importing anything: an id already registered (``R1Zero-v0``, or your
    own ``register(id=..., entry_point=R1ZeroEnv)``) whose entry point is :class:`~grpo_gym.env.R1ZeroEnv`.
    ``"grpo_gym:R1Zero-v0"`` is read as ``"R1Zero-v0"``. Anything else (``"some.module:Env-v0"`` would make
    gymnasium import ``some.module``) is a ``ValueError``. (The class is recognised by its module and name: this
    module never imports the env.)"""
    env_id = record.get("env_id")
    if env_id == "grpo_gym:R1Zero-v0":
        env_id = "R1Zero-v0"
    spec = gym.registry.get(env_id) if isinstance(env_id, str) else None
    entry = None if spec is None else spec.entry_point
    is_class = (
        getattr(entry, "__module__", None) == "grpo_gym.env" and getattr(entry, "__qualname__", None) == "R1ZeroEnv"
    )
    if entry not in ("grpo_gym.env:R1ZeroEnv", "grpo_gym:R1ZeroEnv") and not is_class:
        raise ValueError(
            f"the record's env id {env_id!r} is not a registered R1ZeroEnv id (a record never imports code): "
            "register it first (gymnasium.register(id=..., entry_point=grpo_gym.R1ZeroEnv)), or pass the env"
        )
    return env_id


def make_env_from_record(record: Mapping[str, Any], **objects: Any) -> gym.Env:
    """``gym.make(record["env_id"], **env_kwargs_from_record(record, **objects))``, the id checked by
    :func:`recorded_env_id`."""
    return gym.make(recorded_env_id(record), **env_kwargs_from_record(record, **objects))
