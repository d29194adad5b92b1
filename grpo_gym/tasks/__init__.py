"""Task families and their registry.

Built-in tasks: ``"arithmetic"`` (the default), ``"countdown"``, ``"jsonl"`` (needs ``path=``), ``"dataset"``
(needs ``data=``: your rows, see :mod:`grpo_gym.tasks.dataset`) and ``"reasoning_gym:<dataset name>"`` (any
reasoning-gym dataset, with the optional extra; see :mod:`grpo_gym.tasks.reasoning_gym`). A task can also be named
by its importable path, ``"mypkg.tasks:MyTask"`` (a :class:`Task` subclass). Add your own with
:func:`register_task` and build any of them with :func:`make_task`::

    from grpo_gym.tasks import make_task, register_task

    register_task("my_task", MyTask)  # or register_task("my_task", "mypkg.tasks:MyTask")
    task = make_task("countdown", use_all=False)

**Subprocesses.** ``SubprocVecEnv`` workers are fresh interpreters that never ran your ``register_task`` call.
Registering an importable class (or a ``"module:Class"`` path) therefore also records ``name -> "module:Class"``
in the environment variable ``GRPO_GYM_TASKS``, which processes started afterwards inherit and read when they import
this package, so ``make_vec_env("grpo_gym:R1Zero-v0", env_kwargs={"task": "my_task"}, vec_env_cls=SubprocVecEnv)``
works (a class defined in your script's ``__main__`` included: workers find it in the re-imported main module).
Register before the first ``SubprocVecEnv`` is made, or pass ``task="mypkg.tasks:MyTask"`` directly. A class
defined inside a function cannot be imported: pass the task object itself, ``task=MyTask()``, which is pickled.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import MAX_DIFFICULTY, MIN_DIFFICULTY, Problem, Task, Verdict, check_difficulty
from grpo_gym.tasks.countdown import CountdownTask
from grpo_gym.tasks.dataset import DatasetTask
from grpo_gym.tasks.jsonl import JsonlTask
from grpo_gym.tasks.reasoning_gym import PREFIX as REASONING_GYM_PREFIX
from grpo_gym.tasks.reasoning_gym import ReasoningGymTask
from grpo_gym.validation import ArgumentError, check_mapping

TaskFactory = Callable[..., Task]
ENV_VARIABLE = "GRPO_GYM_TASKS"
"""The environment variable that carries ``{name: "module:Class"}`` registrations to subprocesses."""
_REGISTRY: dict[str, TaskFactory | str] = {}
_BUILTIN = ("arithmetic", "countdown", "jsonl", "dataset")


def importable_path(obj: Any) -> str | None:
    """``"module:QualName"`` of a class or function that can be imported back by that path, else ``None``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        return None
    try:
        found = load_path(f"{module}:{qualname}")
    except (ArgumentError, ImportError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def load_path(path: str, what: str = "task path") -> Any:
    """The object a ``"module:QualName"`` path names (``__main__`` also looks in a subprocess's re-imported main).

    :param path: ``"package.module:QualName"``
    :param what: what the path stands for, in messages (``"task path"``, ``"reward function path"``)
    :raises ArgumentError: when the path is malformed or names nothing
    """
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        example = "ClassName" if what == "task path" else "name"
        raise ArgumentError(f"{what} {path!r} must look like 'package.module:{example}'")
    if module_name == "__main__":
        modules = [sys.modules.get("__main__"), sys.modules.get("__mp_main__")]
    else:
        try:
            modules = [importlib.import_module(module_name)]
        except ImportError as error:
            raise ArgumentError(f"{what} {path!r}: cannot import {module_name!r} ({error})") from None
    for module in modules:
        obj: Any = module
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            return obj
    raise ArgumentError(f"{what} {path!r}: {module_name!r} has no {qualname!r}")


def _published() -> dict[str, str]:
    try:
        value = json.loads(os.environ.get(ENV_VARIABLE, "{}"))
    except json.JSONDecodeError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _publish(name: str, path: str | None) -> None:
    published = _published()
    if path is None:
        published.pop(name, None)
    else:
        published[name] = path
    os.environ[ENV_VARIABLE] = json.dumps(published, sort_keys=True)


def register_task(name: str, cls_or_factory: TaskFactory | str, *, overwrite: bool = False) -> None:
    """Register a task class (or any callable returning a :class:`Task`, or a ``"module:Class"`` path) as ``name``.

    An importable class or path is also recorded for subprocesses (see the module docstring).

    :param name: the registry key, e.g. ``"countdown"`` (no ``":"``, which marks paths)
    :param cls_or_factory: called with :func:`make_task`'s keyword arguments to build the task
    :param overwrite: replace an existing entry instead of raising ``ValueError``
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"task name must be a non-empty string without ':', got {name!r}")
    if not callable(cls_or_factory) and not (isinstance(cls_or_factory, str) and ":" in cls_or_factory):
        raise TypeError(
            f"task {name!r}: expected a Task class or factory (or a 'module:Class' path), got {cls_or_factory!r}"
        )
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"task {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = cls_or_factory
    if name not in _BUILTIN:
        _publish(name, cls_or_factory if isinstance(cls_or_factory, str) else importable_path(cls_or_factory))


def unregister_task(name: str) -> None:
    """Remove ``name`` from the registry (``KeyError`` when it is not there)."""
    del _REGISTRY[name]
    _publish(name, None)


def list_tasks() -> list[str]:
    """The registered task names, sorted (``reasoning_gym:<name>`` and ``module:Class`` paths work too)."""
    return sorted(_REGISTRY)


def task_path(name_or_task: str | Task) -> str | None:
    """How a task can be named in another process: a built-in name, a ``reasoning_gym:`` name or a
    ``"module:Class"`` path; ``None`` when it cannot (a task object, or a name registered with a local class)."""
    if not isinstance(name_or_task, str):
        return None
    if name_or_task in _BUILTIN or name_or_task.startswith(REASONING_GYM_PREFIX) or ":" in name_or_task:
        return name_or_task
    entry = _REGISTRY.get(name_or_task)
    return entry if isinstance(entry, str) else importable_path(entry)


def _factory(name: str) -> TaskFactory:
    if name.startswith(REASONING_GYM_PREFIX):
        dataset = name[len(REASONING_GYM_PREFIX) :]
        return lambda **kwargs: ReasoningGymTask(dataset, **kwargs)
    entry = _REGISTRY.get(name)
    if entry is None and name in _published():  # registered in the parent process after this one started
        entry = _REGISTRY[name] = _published()[name]
    if entry is None and ":" in name:
        entry = name
    if entry is None:
        raise ArgumentError(
            f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())} (and reasoning_gym:<dataset>). "
            "A task registered with register_task in another process (the parent of a SubprocVecEnv) is known here "
            "only when its class is importable: pass task='package.module:ClassName', or the task object itself"
        )
    if isinstance(entry, str):
        cls = load_path(entry)
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise ArgumentError(f"task path {entry!r} names {cls!r}, not a Task subclass")
        return cls
    return entry


def make_task(name_or_task: str | Task, **kwargs: object) -> Task:
    """Build the task registered as ``name_or_task`` with ``kwargs``, or return a :class:`Task` as is.

    :param name_or_task: a registered name, ``"reasoning_gym:<dataset>"``, a ``"module:Class"`` path, or a ready
        :class:`Task`
    :param kwargs: constructor arguments, e.g. ``path="data.jsonl"`` for ``"jsonl"``
    """
    if isinstance(name_or_task, Task):
        if kwargs:
            raise ValueError(f"got a Task instance and keyword arguments {sorted(kwargs)}; pass one or the other")
        return name_or_task
    if not isinstance(name_or_task, str):
        raise ArgumentError(f"unknown task {name_or_task!r}: pass a task name or a Task; registered: {list_tasks()}")
    factory = _factory(name_or_task)
    accepted = _keyword_names(ReasoningGymTask if name_or_task.startswith(REASONING_GYM_PREFIX) else factory)
    if accepted is not None:
        accepted = [name for name in accepted if not name_or_task.startswith(REASONING_GYM_PREFIX) or name != "dataset"]
        check_mapping(f"task_kwargs of task {name_or_task!r}", kwargs, accepted)
    try:
        task = factory(**kwargs)
    except ArgumentError:
        raise
    except TypeError as error:
        raise TypeError(f"make_task({name_or_task!r}, ...): {error}") from error
    if not isinstance(task, Task):
        raise TypeError(f"the factory of task {name_or_task!r} returned {type(task).__name__}, not a Task")
    return task


def _keyword_names(factory: Any) -> list[str] | None:
    """The keyword arguments ``factory`` accepts, or ``None`` when it takes ``**kwargs`` or has no signature."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


register_task("arithmetic", ArithmeticTask)
register_task("countdown", CountdownTask)
register_task("jsonl", JsonlTask)
register_task("dataset", DatasetTask)
for _name, _path in _published().items():  # registrations of the process that started this one
    _REGISTRY.setdefault(_name, _path)

__all__ = [
    "MAX_DIFFICULTY",
    "MIN_DIFFICULTY",
    "ArithmeticTask",
    "CountdownTask",
    "DatasetTask",
    "JsonlTask",
    "Problem",
    "ReasoningGymTask",
    "Task",
    "TaskFactory",
    "Verdict",
    "check_difficulty",
    "list_tasks",
    "load_path",
    "make_task",
    "register_task",
    "task_path",
    "unregister_task",
]
