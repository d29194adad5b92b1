"""``DynamicCurriculum``: the dynamic curriculum's difficulty rule, exactly as the seed gives it."""

from __future__ import annotations

from typing import Any

from grpo_gym.tasks import MAX_DIFFICULTY, MIN_DIFFICULTY, check_difficulty
from grpo_gym.validation import ArgumentError, check_float


class DynamicCurriculum:
    """Raise the difficulty while the policy succeeds, lower it while it fails (the original design's dynamic
    curriculum).

    ``update(success_rate)``: above ``raise_above`` (0.8) the level becomes ``min(1.0, level + 0.05)``;
    else below ``lower_below`` (0.5) it becomes ``max(0.1, level - 0.03)``; otherwise it stays. Levels are
    rounded to 6 decimals so repeated steps land on exact values (0.3 + 0.05 is 0.35, not 0.35000000000000003).

    :param initial: the starting level (0.3)
    :param raise_above: success rate above which the level rises (0.8)
    :param lower_below: success rate below which the level falls (0.5)
    :param step_up: how much it rises (0.05), in [0, 1]
    :param step_down: how much it falls (0.03), in [0, 1]
    :param minimum: the lowest level (0.1)
    :param maximum: the highest level (1.0)
    """

    def __init__(
        self,
        initial: float = 0.3,
        raise_above: float = 0.8,
        lower_below: float = 0.5,
        step_up: float = 0.05,
        step_down: float = 0.03,
        minimum: float = MIN_DIFFICULTY,
        maximum: float = MAX_DIFFICULTY,
    ) -> None:
        minimum = check_difficulty(minimum, "minimum")
        maximum = check_difficulty(maximum, "maximum")
        if minimum > maximum:
            raise ArgumentError(f"minimum ({minimum}) must be <= maximum ({maximum})")
        initial = check_float("initial", initial, low=minimum, high=maximum, hint="it must lie in [minimum, maximum]")
        raise_above = check_float("raise_above", raise_above, low=0.0, high=1.0)
        lower_below = check_float(
            "lower_below", lower_below, low=0.0, high=raise_above, hint="need lower_below <= raise_above"
        )
        step_up = check_float("step_up", step_up, low=0.0, high=1.0)
        step_down = check_float("step_down", step_down, low=0.0, high=1.0)
        self.difficulty: float = initial  # type: ignore[assignment]
        self.raise_above, self.lower_below = raise_above, lower_below
        self.step_up, self.step_down = step_up, step_down
        self.minimum, self.maximum = minimum, maximum

    def update(self, success_rate: float) -> float:
        """Apply the rule to one measured success rate in [0, 1] and return the new level."""
        success_rate = check_float("success_rate", success_rate, low=0.0, high=1.0)
        if success_rate > self.raise_above:
            self.difficulty = min(self.maximum, round(self.difficulty + self.step_up, 6))
        elif success_rate < self.lower_below:
            self.difficulty = max(self.minimum, round(self.difficulty - self.step_down, 6))
        return self.difficulty

    def apply(self, env: Any) -> None:
        """Set the current level on a Gymnasium env (through its wrappers) or on every env of a VecEnv."""
        if hasattr(env, "env_method"):  # a Stable-Baselines3 VecEnv, possibly in other processes
            env.env_method("set_difficulty", self.difficulty)
        elif hasattr(env, "unwrapped") and hasattr(env.unwrapped, "set_difficulty"):
            env.unwrapped.set_difficulty(self.difficulty)
        else:
            raise TypeError(
                f"cannot set a difficulty on {type(env).__name__}: expected an R1ZeroEnv (or a wrapper of one) "
                "or a VecEnv of them"
            )
