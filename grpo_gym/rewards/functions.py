"""Your reward functions, with TRL's signature: ``fn(prompts, completions, **kwargs) -> list[float | None]``.

The same function object works in TRL's ``GRPOTrainer(reward_funcs=[fn])`` and here
(``gym.make("R1Zero-v0", reward_funcs=[fn])`` or ``reward_funcs={"name": fn}``). In a list, each function is named
as TRL names it (:func:`reward_func_name`: its ``__name__``, a ``functools.partial`` by the function it wraps, a
callable object by its class), a lambda ``"lambda"``; a name taken already gets ``_2``, ``_3``, ... in list order;
the names label the components (``info["reward_components"]``, ``rollout/reward/<name>``, ``reward_weights``).
A function may also be given as a ``"module:function"`` string, imported then (you named it; a saved record never
names code to import, see :mod:`grpo_gym.describe`). Each function is called once
per batch of completions with keyword arguments, as TRL calls it:

- ``prompts``: the prompt texts the model was shown (the template around the question), one per completion; for a
  conversational dataset (a ``prompt`` column of ``[{"role": ..., "content": ...}]`` messages), the messages, as TRL
  passes them;
- ``completions``: the completion texts (decoded up to EOS, special tokens dropped); for a conversational dataset,
  ``[{"role": "assistant", "content": text}]`` per completion, as TRL passes them;
- ``completion_ids``: the completion token ids up to and including EOS, as lists of ints;
- every problem column, as a list aligned with the prompts: ``answer``, ``difficulty``, the task's own fields, and
  for the ``dataset`` task every column of your data by its own name (:meth:`Task.reward_columns`);
- ``log_metric(name, value)`` and ``log_extra(column, values)``: what the function logs reaches ``info``
  (``info["reward_metrics"]``, ``info["reward_extra"]``) and TensorBoard (``rollout/reward_metric/<name>``);
- ``trainer_state``: ``None`` (an env has no trainer; TRL passes its ``TrainerState``).

Each function gets its own copy of every list argument (``prompts``, ``completions``, ``completion_ids`` and the
columns, their items included): what one function changes in them is never seen by the next one, nor kept in the
env's stored rows. Each call is bounded by ``reward_timeout`` (:mod:`grpo_gym.rewards.timeouts`: 30 s by default;
a function past it scores 0 and is reported like any reward error).

**Rewards per turn** (multi-turn episodes: tool calls, the env's feedback). Every call also passes ``turn`` (each
completion's model turn in its episode, from 0), ``turn_completions`` (that turn's own text; ``completions`` is the
episode's whole text after the prompt, as on any answer turn) and ``tool_calls`` (that turn's calls, the records of
``info["tool_calls"]``: ``name``, ``arguments``, ``result`` or ``error``; ``[]`` on an answer turn). A function
scores answer turns only, unless it is marked :func:`per_turn`: then it also scores every tool turn (called once per
tool turn, after its calls ran; the task's verifier and the other components do not apply there), e.g. a small
reward for a call that ran or a penalty for one that failed. Which return each turn trains on is the algorithm's
choice (GRPO's ``turn_credit``).

Not passed: TRL's ``environments`` (its tool-calling environments). ``None`` in the returned list means "not
applicable": that completion's component is left out of the weighted sum, as in TRL. Each value is a real number
(booleans count as 0/1; numpy numbers and one-element tensors pass): a number that is not finite or lies beyond
float32's range (:data:`~grpo_gym.rewards.values.MAX_REWARD`, about 3.4e38: rollouts store rewards in float32) scores
0 for that completion with the reason, like any reward error; a value of another type (the text ``"0.5"``, the
extracted answer instead of a score) or an output that is not a list is a bug in the function:
:class:`~grpo_gym.validation.ReturnTypeError`, raised whatever ``on_reward_error`` says. ``async def``
functions (and callables whose ``__call__`` is async) are awaited; several are gathered concurrently on one event
loop that runs in a daemon thread of this process, as TRL does.

A function must accept ``**kwargs`` (the env passes all of the above), must not take arguments positionally only,
and may require by name only arguments the env passes; :func:`check_reward_function` says so when the env is made.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from grpo_gym.rewards.timeouts import DEFAULT_REWARD_TIMEOUT, LOOP_GRACE, call_with_timeout, timeout_error
from grpo_gym.rewards.values import real_number, reward_values
from grpo_gym.validation import ArgumentError, ReturnTypeError

PASSED = (
    "prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "turn", "turn_completions",
    "tool_calls",
)  # fmt: skip
"""The keyword arguments every call passes besides the problem columns."""
PER_TURN = "scores_every_turn"
"""The attribute :func:`per_turn` sets on a function."""

RewardFunc = Callable[..., Any]
LAMBDA_NAME = "lambda"
"""The name of a lambda in a list of reward functions (its ``__name__`` is ``"<lambda>"``)."""
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine by definition (``async def``, or an async ``__call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def check_reward_function(name: str, fn: Any, column_names: Callable[[], Collection[str] | None] | None = None) -> None:
    """Refuse, naming ``name`` and the fix, a function the env cannot call with TRL's arguments.

    :param name: the function's name in ``reward_funcs``
    :param fn: the function
    :param column_names: called (only when ``fn`` requires a named argument) for the problem columns the task gives
    :raises ArgumentError: when ``fn`` is not callable, is a generator function, takes no ``**kwargs``, takes a
        required argument positionally only, or requires an argument that is neither passed nor a column of the task
    """
    if not callable(fn):
        raise ArgumentError(
            f"reward_funcs[{name!r}] must be a function fn(prompts, completions, **kwargs) -> list[float | None] "
            f"(TRL's signature), got {type(fn).__name__}"
        )
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)  # noqa: B004
    if inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call):
        raise ArgumentError(
            f"reward function {name!r} is a generator function (it yields): a call would return a generator, not "
            "the rewards; return a list with one float (or None) per completion"
        )
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): checked at the first call
        return
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        raise ArgumentError(
            f"reward function {name!r} must accept **kwargs: the env calls it as TRL does, with prompts, "
            "completions, completion_ids, trainer_state, log_extra, log_metric, turn, turn_completions, tool_calls and "
            "every problem column by keyword; "
            "define it as def fn(prompts, completions, **kwargs)"
        )
    for p in parameters:
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise ArgumentError(f"reward function {name!r} takes {p.name!r} positionally only; the env passes keywords")
    required = [
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in PASSED
    ]
    known = column_names() if required and column_names is not None else None
    missing = [argument for argument in required if known is not None and argument not in known]
    if missing:
        raise ArgumentError(
            f"reward function {name!r} requires {', '.join(map(repr, missing))}, which the task does not provide; "
            f"its columns: {', '.join(sorted(known or ()))} (give the argument a default, or rename it)"
        )


def per_turn(fn: RewardFunc) -> RewardFunc:
    """Mark a reward function (TRL's signature) to score every model turn of an episode, tool turns included, not
    only the answers (see the module docstring); returns ``fn`` itself::

        @per_turn
        def tool_ran(prompts, completions, tool_calls, **kwargs):
            return [0.1 if calls and not any("error" in c for c in calls) else 0.0 for calls in tool_calls]

    :param fn: the function (a callable object or a ``functools.partial`` too)
    """
    try:
        setattr(fn, PER_TURN, True)
    except (AttributeError, TypeError):
        raise ArgumentError(
            f"per_turn: cannot mark {type(fn).__name__} (it takes no attributes); wrap it in a def or a partial"
        ) from None
    return fn


def is_per_turn(fn: Any) -> bool:
    """Whether ``fn`` is marked :func:`per_turn`."""
    return getattr(fn, PER_TURN, False) is True


def reward_func_name(fn: Any) -> str:
    """TRL's name of a reward function (``trl.trainer.utils.get_callable_name``): its ``__name__``, a
    ``functools.partial`` by the function it wraps, a callable object by its class; a lambda is ``"lambda"``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", type(fn).__name__)
    return LAMBDA_NAME if name == "<lambda>" else str(name)


def resolve_reward_func(spec: Any) -> RewardFunc:
    """``spec`` itself, or the function a ``"module:function"`` string names (imported now: you named it)."""
    if not isinstance(spec, str):
        return spec
    from grpo_gym.tasks import load_path

    return load_path(spec, what="reward function path")


def named_reward_funcs(reward_funcs: Any) -> dict[str, Any]:
    """``reward_funcs`` as ``{name: function}``: a mapping keeps its names; a list (or one function) is named by
    :func:`reward_func_name`, a repeated name getting ``_2``, ``_3``, ... in list order. ``"module:function"``
    strings are imported (:func:`resolve_reward_func`)."""
    if isinstance(reward_funcs, Mapping):
        return {name: resolve_reward_func(fn) for name, fn in reward_funcs.items()}
    if isinstance(reward_funcs, str) or callable(reward_funcs):
        reward_funcs = [reward_funcs]
    if not isinstance(reward_funcs, Sequence):
        raise ArgumentError(
            "reward_funcs must be a list of functions (named after them, as TRL does) or a dict {name: function}, "
            f"got {type(reward_funcs).__name__}"
        )
    named: dict[str, Any] = {}
    for spec in reward_funcs:
        fn = resolve_reward_func(spec)
        base = reward_func_name(fn)
        name, count = base, 1
        while name in named:
            count += 1
            name = f"{base}_{count}"
        named[name] = fn
    return named


def check_reward_funcs(
    reward_funcs: Any, reserved: Collection[str], column_names: Callable[[], Collection[str] | None] | None = None
) -> dict[str, RewardFunc]:
    """``reward_funcs`` as a ``{name: function}`` dict (:func:`named_reward_funcs`), every function checked
    (:func:`check_reward_function`).

    :param reward_funcs: ``None``, a list of functions (or ``"module:function"`` strings), or a mapping of names to
        them
    :param reserved: names taken by the built-in components
    :param column_names: see :func:`check_reward_function`
    """
    if reward_funcs is None:
        return {}
    from_list = not isinstance(reward_funcs, Mapping)
    checked: dict[str, RewardFunc] = {}
    for name, fn in named_reward_funcs(reward_funcs).items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ArgumentError(f"reward_funcs: names must be non-empty strings without '/', got {name!r}")
        if name in reserved:
            fix = "rename the function, or pass a dict {name: function}" if from_list else "choose another name"
            raise ArgumentError(
                f"reward_funcs: {name!r} is a built-in component ({', '.join(reserved)}); {fix} "
                "(set a built-in's weight to 0 in reward_weights to turn it off)"
            )
        check_reward_function(name, fn, column_names)
        checked[name] = fn
    return checked


class RewardLogs:
    """What the functions of one batch logged through ``log_metric`` and ``log_extra``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.metrics: dict[str, float] = {}
        self.extra: dict[str, list[Any]] = {}

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: one number for the batch (shown per completion in ``info["reward_metrics"]``)."""
        self.metrics[str(name)] = real_number(f"log_metric({name!r}, value)", value, "log one number", verb="got")

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """TRL's ``log_extra``: one value per completion (``info["reward_extra"][column]``)."""
        values = list(values)
        if len(values) != self.n:
            raise ValueError(f"log_extra({column!r}, ...) got {len(values)} values for {self.n} completions")
        self.extra[str(column)] = values


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's reward event loop, running in a daemon thread (started on first use, again after a fork)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="grpo-gym-reward-loop", daemon=True).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def own_arguments(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a deep copy of every list (the completions, the prompts, the ids, the columns): one function's
    changes to them never reach the next function or the stored rows."""
    return {name: copy.deepcopy(value) if isinstance(value, list) else value for name, value in kwargs.items()}


async def _gather(calls: dict[str, Any], timeout: float | None) -> list[Any]:
    async def bounded(name: str, awaitable: Any) -> Any:
        if timeout is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, min(timeout, threading.TIMEOUT_MAX))
        except TimeoutError:
            raise timeout_error(f"reward function {name!r}", timeout, still_running=False) from None

    return await asyncio.gather(*(bounded(name, call) for name, call in calls.items()), return_exceptions=True)


def _await_all(pending: dict[str, Any], timeout: float | None) -> list[Any]:
    """The outputs (or errors) of the pending coroutines, gathered on the reward loop; a loop that does not answer
    within ``timeout + LOOP_GRACE`` (a function blocked it) is abandoned and every pending function times out."""
    global _LOOP
    loop = _event_loop()
    future = asyncio.run_coroutine_threadsafe(_gather(pending, timeout), loop)
    try:
        return future.result(None if timeout is None else min(timeout + LOOP_GRACE, threading.TIMEOUT_MAX))
    except TimeoutError:
        future.cancel()
        loop.call_soon_threadsafe(loop.stop)  # the blocked loop stops once it gets control back
        with _LOOP_LOCK:
            if _LOOP is not None and _LOOP[1] is loop:
                _LOOP = None  # the next calls get a fresh loop
        return [timeout_error(f"reward function {name!r} (it blocked the event loop)", timeout) for name in pending]


def call_reward_funcs(
    funcs: Mapping[str, RewardFunc], kwargs: dict[str, Any], n: int, timeout: float | None = DEFAULT_REWARD_TIMEOUT
) -> dict[str, list[float | BaseException | None]]:
    """Call every function once with its own copy of ``kwargs`` (sync ones in order, async ones gathered), each
    bounded by ``timeout`` seconds (see :mod:`grpo_gym.rewards.timeouts`); per function, one value per completion (a
    float, ``None``, or the exception that stands for it: all of them when the call raised or timed out)."""
    results: dict[str, list[float | BaseException | None]] = {}
    pending: dict[str, Any] = {}
    for name, fn in funcs.items():
        own = own_arguments(kwargs)
        try:
            if is_async(fn):
                output = fn(**own)  # a coroutine: nothing runs until it is awaited
            else:
                output = call_with_timeout(lambda fn=fn, own=own: fn(**own), timeout, f"reward function {name!r}")
            if inspect.isawaitable(output):
                pending[name] = output
                continue
            results[name] = reward_values(f"reward function {name!r}", output, n)
        except ReturnTypeError:
            raise
        except Exception as exc:
            results[name] = [exc] * n
    if pending:
        for name, output in zip(pending, _await_all(pending, timeout), strict=True):
            try:
                if isinstance(output, BaseException):
                    raise output
                results[name] = reward_values(f"reward function {name!r}", output, n)
            except ReturnTypeError:
                raise
            except Exception as exc:
                results[name] = [exc] * n
    return {name: results[name] for name in funcs}
