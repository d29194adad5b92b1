"""DynamicCurriculum: the rule table, bounds, and applying the level to envs and VecEnvs."""

from __future__ import annotations

import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from grpo_gym import DynamicCurriculum, R1ZeroEnv


@pytest.mark.parametrize(
    ("level", "success", "expected"),
    [
        (0.3, 0.81, 0.35),  # > 0.8: +0.05
        (0.3, 0.8, 0.3),  # exactly 0.8: not above, not below 0.5: unchanged
        (0.3, 0.5, 0.3),  # exactly 0.5: unchanged
        (0.3, 0.49, 0.27),  # < 0.5: -0.03
        (0.3, 0.65, 0.3),  # in between: unchanged
        (0.98, 1.0, 1.0),  # capped at 1.0
        (1.0, 0.9, 1.0),
        (0.12, 0.0, 0.1),  # floored at 0.1
        (0.1, 0.2, 0.1),
    ],
)
def test_rule_table(level: float, success: float, expected: float) -> None:
    curriculum = DynamicCurriculum(initial=level)
    assert curriculum.update(success) == pytest.approx(expected, abs=1e-12)


def test_defaults_are_the_seed_values() -> None:
    curriculum = DynamicCurriculum()
    assert curriculum.difficulty == 0.3
    assert (curriculum.raise_above, curriculum.lower_below) == (0.8, 0.5)
    assert (curriculum.step_up, curriculum.step_down, curriculum.minimum, curriculum.maximum) == (0.05, 0.03, 0.1, 1.0)


def test_repeated_steps_land_on_exact_values() -> None:
    curriculum = DynamicCurriculum()
    levels = [curriculum.update(0.9) for _ in range(20)]
    assert levels[:3] == [0.35, 0.4, 0.45] and levels[-1] == 1.0
    assert [curriculum.update(0.1) for _ in range(2)] == [0.97, 0.94]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_bad_success_rate(bad: float) -> None:
    with pytest.raises(ValueError, match="success_rate"):
        DynamicCurriculum().update(bad)


def test_bad_configuration() -> None:
    with pytest.raises(ValueError, match="initial"):
        DynamicCurriculum(initial=0.05)
    with pytest.raises(ValueError, match="lower_below"):
        DynamicCurriculum(raise_above=0.4, lower_below=0.6)


def test_apply_to_env_wrapper_and_vec_env() -> None:
    import gymnasium as gym

    curriculum = DynamicCurriculum()
    curriculum.update(0.9)
    wrapped = gym.make("R1Zero-v0", context_length=128, max_new_tokens=16, template="compact")
    curriculum.apply(wrapped)
    assert wrapped.unwrapped.difficulty == 0.35
    vec = DummyVecEnv([lambda: R1ZeroEnv(context_length=128, max_new_tokens=16, template="compact")] * 2)
    curriculum.apply(vec)
    assert vec.get_attr("difficulty") == [0.35, 0.35]
    assert vec.reset() is not None and all(p.difficulty == 0.35 for p in vec.get_attr("problem"))
    with pytest.raises(TypeError, match="R1ZeroEnv"):
        curriculum.apply(object())
