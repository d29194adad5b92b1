"""What user code hands back as a reward, read as a float: the type its contract names, or an error that names who
returned what.

A reward function, a reward model's ``score``, a task's verdict, ``log_metric`` and a wrapped env's ``step`` return
numbers. A real number passes: ``int``, ``float``, ``bool`` (0/1), ``fractions.Fraction``, ``decimal.Decimal``, numpy
numbers, and one-element numpy arrays or torch tensors of them. Anything else (``"0.5"``, ``b"1"``, a numpy string,
a complex number, a list) is a bug in that code, not in the model's output:
:class:`~grpo_gym.validation.ReturnTypeError`, raised whatever ``on_reward_error`` says (a silent ``float("42")``
would train on the answer as if it were the score).
A real number that is not finite or lies beyond float32's range (:data:`MAX_REWARD`: rollouts store rewards in
float32) is a ``ValueError`` for that one value, which its caller scores as a reward error.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from grpo_gym.validation import ReturnTypeError, show_value

MAX_REWARD = float(np.finfo(np.float32).max)
"""The largest reward magnitude a component may have: float32's largest number (rollouts store rewards in float32)."""


def real_number(what: str, value: Any, fix: str = "", verb: str = "returned") -> float:
    """``value`` as a float when it is a real number (see the module docstring); ``inf`` and ``nan`` pass.

    :param what: who returned it, for the message (``"reward function 'f'"``)
    :param value: the value
    :param fix: appended to the message
    :param verb: how ``what`` came by the value, for the message
    :raises ReturnTypeError: when ``value`` is not a real number
    :raises ValueError: when it is an integer too large for a float
    """
    if type(value) is float:
        return value  # the common case, fast
    if hasattr(value, "dtype") and hasattr(value, "item") and not isinstance(value, numbers.Real):
        try:  # a numpy or torch value of one element (np.bool_, a 0-d tensor, a tensor of shape (1,))
            value = value.item()
        except (ValueError, RuntimeError):
            raise ReturnTypeError(
                f"{what} {verb} {show_value(value)} where one number was expected{'; ' + fix if fix else ''}"
            ) from None
    if not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ReturnTypeError(f"{what} {verb} {show_value(value)}, not a number{'; ' + fix if fix else ''}")
    try:
        return float(value)
    except OverflowError:  # 10**400, a huge Fraction: no float holds it
        raise ValueError(f"{what} {verb} {show_value(value)}, beyond float32's range (+-{MAX_REWARD:.4g})") from None


def received_number(what: str, value: Any, fix: str = "", verb: str = "returned") -> float:
    """An env's or a server's reward (:func:`real_number`), a value no float holds read as the infinity of its sign
    (``10**400``; NaN when it has none): the wrapper then scores it 0, with the reason.

    :raises ReturnTypeError: when ``value`` is not a real number
    """
    try:
        return real_number(what, value, fix, verb)
    except ReturnTypeError:
        raise
    except ValueError:
        try:
            return math.inf if value > 0 else -math.inf
        except (ArithmeticError, TypeError, ValueError):  # a signalling NaN, which compares to nothing
            return math.nan


def returned_flag(what: str, value: Any, fix: str = "") -> bool:
    """A flag an env or a server returns (``terminated``, ``done``) as a bool: ``True``/``False``, numpy's bools and the
    integers 0 and 1 (Gymnasium's own checker lets them pass); anything else (``"False"``, which ``bool()`` reads as
    true) is that code's bug.

    :raises ReturnTypeError: naming ``what`` and the value
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise ReturnTypeError(f"{what} returned {show_value(value)}, not True or False{'; ' + fix if fix else ''}")


def reward_number(what: str, value: Any, fix: str = "") -> float:
    """``value`` as a reward: a real number (:func:`real_number`), finite and within float32's range.

    :raises ReturnTypeError: when ``value`` is not a real number
    :raises ValueError: when it is not finite or beyond :data:`MAX_REWARD` (that one reward's error)
    """
    number = real_number(what, value, fix)
    if not math.isfinite(number):
        raise ValueError(f"{what} returned a non-finite reward ({number})")
    if abs(number) > MAX_REWARD:
        raise ValueError(
            f"{what} returned {number:g}, beyond float32's range (+-{MAX_REWARD:.4g}) in which rollouts store "
            "rewards; return a smaller scale"
        )
    return number


def reward_values(what: str, output: Any, n: int, allow_none: bool = True) -> list[float | BaseException | None]:
    """A batch's rewards (a list, tuple, numpy array or torch tensor, one per completion) as floats: per value, a
    float, ``None`` (not applicable, where ``allow_none``) or the ``ValueError`` that value is (not finite, beyond
    float32's range).

    :param what: who returned them (``"reward function 'f'"``)
    :param output: what it returned
    :param n: the number of completions
    :param allow_none: whether ``None`` means "not applicable" (reward functions) or is refused (a reward model)
    :raises ReturnTypeError: when ``output`` is not a sequence of numbers (``None`` where allowed)
    :raises ValueError: when it holds another number of values than ``n``
    """
    wanted = f"a list of floats{' (or None)' if allow_none else ''}, one per completion"
    if isinstance(output, (str, bytes)) or not (isinstance(output, Sequence) or hasattr(output, "tolist")):
        raise ReturnTypeError(f"{what} returned {show_value(output)}, not {wanted}")
    if getattr(output, "ndim", 1) == 0:  # a numpy scalar or 0-d tensor: one number
        raise ReturnTypeError(f"{what} returned one number, {show_value(output)}, not {wanted}")
    output = list(output)
    if len(output) != n:
        raise ValueError(f"{what} returned {len(output)} rewards for {n} completions")
    fix = f"it must return {wanted}: a score (e.g. 1.0 when the answer is right), not a text such as the answer"
    values: list[float | BaseException | None] = []
    for value in output:
        if value is None and allow_none:
            values.append(None)
            continue
        try:
            values.append(reward_number(what, value, fix))
        except ReturnTypeError:
            raise
        except ValueError as error:  # this completion's reward error
            values.append(error)
    return values
