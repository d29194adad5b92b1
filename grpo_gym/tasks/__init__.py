"""Task families and their registry.

Built-in tasks: ``"arithmetic"`` (the default), ``"countdown"`` and ``"jsonl"`` (needs ``path=``). Add your
own with :func:`register_task` and build any of them with :func:`make_task`::

    from grpo_gym.tasks import make_task, register_task
    register_task("my_task", MyTask)
    task = make_task("countdown", use_all=False)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import MAX_DIFFICULTY, MIN_DIFFICULTY, Problem, Task, Verdict, check_difficulty
from grpo_gym.tasks.countdown import CountdownTask
from grpo_gym.tasks.jsonl import JsonlTask
from grpo_gym.validation import ArgumentError, check_mapping

TaskFactory = Callable[..., Task]

_REGISTRY: dict[str, TaskFactory] = {}


def register_task(name: str, cls_or_factory: TaskFactory, *, overwrite: bool = False) -> None:
    """Register a task class (or any callable returning a :class:`Task`) under ``name``.

    :param name: the registry key, e.g. ``"countdown"``
    :param cls_or_factory: called with :func:`make_task`'s keyword arguments to build the task
    :param overwrite: replace an existing entry instead of raising ``ValueError``
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"task name must be a non-empty string, got {name!r}")
    if not callable(cls_or_factory):
        raise TypeError(f"task {name!r}: expected a Task class or factory, got {cls_or_factory!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"task {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = cls_or_factory


def unregister_task(name: str) -> None:
    """Remove ``name`` from the registry (``KeyError`` when it is not there)."""
    del _REGISTRY[name]


def list_tasks() -> list[str]:
    """The registered task names, sorted."""
    return sorted(_REGISTRY)


def make_task(name_or_task: str | Task, **kwargs: object) -> Task:
    """Build the task registered as ``name_or_task`` with ``kwargs``, or return a :class:`Task` as is.

    :param name_or_task: a registered name, or a ready :class:`Task`
    :param kwargs: constructor arguments, e.g. ``path="data.jsonl"`` for ``"jsonl"``
    """
    if isinstance(name_or_task, Task):
        if kwargs:
            raise ValueError(f"got a Task instance and keyword arguments {sorted(kwargs)}; pass one or the other")
        return name_or_task
    if not isinstance(name_or_task, str) or name_or_task not in _REGISTRY:
        raise ArgumentError(f"unknown task {name_or_task!r}; registered tasks: {', '.join(list_tasks())}")
    factory = _REGISTRY[name_or_task]
    accepted = _keyword_names(factory)
    if accepted is not None:
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


def _keyword_names(factory: TaskFactory) -> list[str] | None:
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

__all__ = [
    "MAX_DIFFICULTY",
    "MIN_DIFFICULTY",
    "ArithmeticTask",
    "CountdownTask",
    "JsonlTask",
    "Problem",
    "Task",
    "TaskFactory",
    "Verdict",
    "check_difficulty",
    "list_tasks",
    "make_task",
    "register_task",
    "unregister_task",
]
