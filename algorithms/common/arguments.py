"""Constructor arguments checked in one place: each algorithm lists a rule per argument.

A rule takes the argument's name and value and returns the value in its canonical type (``4.0`` becomes ``4``
for an integer) or raises :class:`~grpo_gym.validation.ArgumentError` (a ``ValueError``) naming the argument,
the value and the valid range. Numbers must be finite; schedules (SB3's functions of the remaining progress,
or :class:`~algorithms.common.schedules.UpdateDecay`) are checked at both ends of training, so that no
non-finite value can reach the optimizer from any setting. The rules of the shared arguments are
:data:`LM_ALGORITHM_RULES`; GRPO's are in :mod:`algorithms.grpo.arguments`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from algorithms.common.collapse_guard import GuardSettings
from algorithms.common.runtime.distributed import COMPRESSIONS
from algorithms.common.runtime.parallel import SHARDINGS
from algorithms.common.runtime.precision import check_precision
from algorithms.common.sampler_correction import SAMPLER_CORRECTIONS
from algorithms.common.schedules import UpdateDecay
from grpo_gym.validation import (
    ArgumentError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_mapping,
    check_path,
)

Rule = Callable[[str, Any], Any]


def integer(low: int | None = None, high: int | None = None, allow_none: bool = False) -> Rule:
    """An integer in ``[low, high]`` (an integral float is read as an integer)."""
    return lambda name, value: check_int(name, value, low=low, high=high, allow_none=allow_none)


def number(
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> Rule:
    """A finite real number in the range."""
    bounds = {"low": low, "high": high, "low_open": low_open, "high_open": high_open, "allow_none": allow_none}
    return lambda name, value: check_float(name, value, **bounds)


def boolean() -> Rule:
    """``True`` or ``False`` (not ``"no"``, not ``1``)."""
    return lambda name, value: check_bool(name, value)


def choice(*values: Any) -> Rule:
    """One of ``values``."""
    return lambda name, value: check_choice(name, value, values)


def mapping(valid_keys: Iterable[str]) -> Rule:
    """A dict (or ``None``) whose keys are among ``valid_keys``."""
    keys = tuple(valid_keys)
    return lambda name, value: check_mapping(name, value, keys)


def optional_path() -> Rule:
    """A file path, or ``None``."""
    return lambda name, value: None if value is None else check_path(name, value)


def schedule(low: float | None = None, high: float | None = None, allow_none: bool = False, updates: bool = False):
    """A number in the range, or a schedule whose values at the start and the end of training are: an SB3
    schedule (a function of the remaining progress, 1 to 0) or, with ``updates``, an :class:`UpdateDecay`."""

    def rule(name: str, value: Any) -> Any:
        if value is None and allow_none:
            return None
        if isinstance(value, UpdateDecay):
            if not updates:
                raise ArgumentError(f"{name} takes a number or a schedule of the remaining progress, not UpdateDecay")
            for end in (value.start, value.end):
                check_float(f"{name} (UpdateDecay)", end, low=low, high=high)
            return value
        if callable(value):
            for progress in (1.0, 0.0):
                try:
                    result = value(progress)
                except Exception as error:  # a user's function: say which argument failed and how
                    raise ArgumentError(f"{name}: the schedule raised at progress {progress} ({error!r})") from None
                check_float(f"{name} at progress {progress}", result, low=low, high=high)
            return value
        return check_float(name, value, low=low, high=high)

    return rule


class ArgumentChecker:
    """A constructor's checker: ``self.n_epochs = check("n_epochs", n_epochs)`` returns the value in its canonical
    type, or raises naming the argument (the rule is ``rules[name]``; an argument without one is a bug)."""

    def __init__(self, rules: dict[str, Rule]) -> None:
        self.rules = rules

    def __call__(self, name: str, value: Any) -> Any:
        return self.rules[name](name, value)


def check_collapse_guard(name: str, value: Any) -> Any:
    """``True``, ``False``/``None`` or a dict of :class:`~algorithms.common.collapse_guard.GuardSettings` fields."""
    try:
        GuardSettings.parse(value)
    except (TypeError, ValueError) as error:
        raise ArgumentError(str(error)) from None
    return value


def finite_learning_rate(value: float) -> float:
    """A learning rate about to reach the optimizer: finite and >= 0, or an error naming the schedule."""
    if not (math.isfinite(value) and value >= 0):
        raise ArgumentError(f"learning_rate: the schedule gave {value!r}; it must stay finite and >= 0")
    return value


#: the arguments every :class:`~algorithms.common.base_class.LMBaseAlgorithm` takes
LM_ALGORITHM_RULES: dict[str, Rule] = {
    "learning_rate": schedule(low=0.0),
    "n_groups": integer(low=1),
    "group_size": integer(low=1),  # GRPO asks for >= 2 itself (a group of one has no relative advantage)
    "max_grad_norm": number(low=0.0, low_open=True),
    "gamma": number(low=0.0, high=1.0, low_open=True),
    "gradient_compression": choice(*COMPRESSIONS),
    "sharding": choice(*SHARDINGS),
    "dist_timeout": number(low=0.0, low_open=True),
    "mixed_precision": check_precision,
    "sampler_correction": choice(*SAMPLER_CORRECTIONS),
    "sampler_correction_cap": number(low=1.0),
    "cold_start": choice(True, False, "auto"),
    "sft_steps": integer(low=0),
    "sft_batch_size": integer(low=1),
    "sft_learning_rate": number(low=0.0, low_open=True),
    "sft_data": optional_path(),
    "curriculum": boolean(),
    "collapse_guard": check_collapse_guard,
    "stats_window_size": integer(low=1),
    "tensorboard_log": optional_path(),
    "verbose": integer(low=0, high=2),
    "seed": integer(low=0, allow_none=True),
}
