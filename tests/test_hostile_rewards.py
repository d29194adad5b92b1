"""Rewards that cannot teach (grpo_gym/rewards/, algorithms/grpo/trl_port.py, issue 37): ``GRPO.from_trl`` with no
reward function, reward functions that return ``None`` for a whole batch, weights that are all 0, a generator as a
reward function, TRL arguments of the wrong type, and an env's bad argument without gymnasium's dump of every
argument after it. Never a run that trains on zero reward without a word."""

from __future__ import annotations

import math
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.common.env_util import make_env
from grpo_gym.validation import ArgumentError
from tests.sizes import ENV_KWARGS, TINY_KWARGS

ROWS = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(12)]
SMALL = {"policy_kwargs": {"model_kwargs": TINY_KWARGS}, "cold_start": False, "mixed_precision": "no"}
PORT = {"train_dataset": ROWS, "env_kwargs": {"max_new_tokens": 8, "context_length": 128}, **SMALL}
BUILTINS_OFF = {"syntax": 0.0, "consistency": 0.0, "task": 0.0, "length": 0.0}


def not_applicable(completions: list[str], **kwargs: Any) -> list[float | None]:
    return [None] * len(completions)


def short(completions: list[str], **kwargs: Any) -> list[float]:
    return [-len(c) / 100 for c in completions]


def only_the_first(completions: list[str], **kwargs: Any) -> list[float | None]:
    return [1.0] + [None] * (len(completions) - 1)


def yielding(completions: list[str], **kwargs: Any):
    yield from (1.0 for _ in completions)


async def streaming(completions: list[str], **kwargs: Any):
    for _ in completions:
        yield 1.0


@pytest.mark.parametrize("reward_funcs", [[], {}, ()])
def test_from_trl_refuses_no_reward_function(reward_funcs: Any) -> None:
    """It trained to the end on zero reward: the port turns the built-in components off, as TRL scores with your
    functions alone."""
    with pytest.raises(ValueError, match=r"from_trl: reward_funcs is empty; .*every completion would score 0"):
        GRPO.from_trl("tiny", reward_funcs, **PORT)


def test_from_trl_warns_when_every_function_returns_none_for_a_whole_batch() -> None:
    model = GRPO.from_trl("tiny", [not_applicable], n_groups=2, group_size=2, **PORT)
    with pytest.warns(RuntimeWarning, match=r"no weighted component scored any of the 4 completions .*not_applicable"):
        model.learn(8)  # two rollouts: warned once, counted twice
    reward = model.get_env().get_attr("reward_fn")[0]
    assert reward.unscored_batches == 2 and model.num_timesteps == 8
    env = gym.make("R1Zero-v0", reward_funcs=[not_applicable], reward_weights=BUILTINS_OFF, **ENV_KWARGS).unwrapped
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="This is a warning, not an error"):  # the env alone, a batch of 3
        env.score_ahead([env.problem] * 3, [env.encode_action("<answer>2</answer>")] * 3)
    assert env.reward_fn.unscored_batches == 1


@pytest.mark.parametrize(
    ("funcs", "weights"),
    [
        ([only_the_first], BUILTINS_OFF),  # one completion scored: TRL's "not applicable" for the others
        ([not_applicable], None),  # the built-in components score every completion
        ([not_applicable, short], BUILTINS_OFF),  # another function does
    ],
)
def test_none_for_some_completions_or_some_functions_is_not_applicable_without_a_warning(funcs, weights) -> None:
    env = gym.make("R1Zero-v0", reward_funcs=funcs, reward_weights=weights, **ENV_KWARGS).unwrapped
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        env.score_ahead([env.problem] * 3, [env.encode_action("<answer>2</answer>")] * 3)
    assert env.reward_fn.unscored_batches == 0


@pytest.mark.parametrize(
    "weights",
    [
        {"syntax": 0.0, "consistency": 0.0, "task": 0.0},
        {"syntax": np.float32(0), "consistency": -0.0, "task": 0, "length": 0.0},
    ],
)
def test_weights_that_are_all_zero_are_refused(weights: dict) -> None:
    with pytest.raises(ArgumentError, match=r"every component has weight 0 .*give at least one a non-zero weight"):
        gym.make("R1Zero-v0", reward_weights=weights, **ENV_KWARGS)


def test_from_trl_reward_weights_of_zero_are_refused() -> None:
    with pytest.raises(ArgumentError, match="every component has weight 0"):
        GRPO.from_trl("tiny", [short], args={"reward_weights": [0.0]}, **PORT)


@pytest.mark.parametrize("fn", [yielding, streaming])
def test_a_generator_function_is_refused_as_a_reward_function(fn) -> None:
    """It scored 0 with a reward error on every batch instead ("returned generator, not a list of floats")."""
    words = rf"reward function '{fn.__name__}' is a generator function .*return a list"
    with pytest.raises(ArgumentError, match=words):
        gym.make("R1Zero-v0", reward_funcs=[fn], **ENV_KWARGS)


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ("1", "reward_weights must be a list of weights, one per reward function"),
        ({"short": 1.0}, "reward_weights must be a list of weights"),
        ([math.nan], r"reward_weights\[0\] must be a finite number, got nan"),
        (["1.0"], r"reward_weights\[0\] must be a finite number"),
    ],
)
def test_from_trl_reward_weights_of_the_wrong_kind_are_refused_naming_them(weights: Any, words: str) -> None:
    """A string of one character passed as one weight; NaN reached the env with gymnasium's dump of the dataset."""
    with pytest.raises(ValueError, match=words):
        GRPO.from_trl("tiny", [short], args={"reward_weights": weights}, **PORT)


@pytest.mark.parametrize("value", [math.nan, "8", 0, -2, 2.5])
@pytest.mark.parametrize("field", ["per_device_train_batch_size", "gradient_accumulation_steps"])
def test_from_trl_batch_fields_must_be_counts(field: str, value: Any) -> None:
    """NaN gave "cannot convert float NaN to integer"; "8" was read as 8."""
    with pytest.raises(ArgumentError, match=rf"args\['{field}'\] must be an integer >= 1"):
        GRPO.from_trl("tiny", [short], args={field: value}, **PORT)


@pytest.mark.parametrize("rows", [["What is 1 + 1?", "Say hi"], [["What is 1 + 1?", "2"]]])
def test_from_trl_rows_that_are_not_dicts_are_named(rows: list) -> None:
    """It said 'pass answer=...; the dataset's columns: ' (none)."""
    with pytest.raises(ValueError, match="train_dataset's rows must be dicts of columns, row 1 is a"):
        GRPO.from_trl("tiny", [short], **{**PORT, "train_dataset": rows})


def test_from_trl_suggests_the_grpo_config_field_a_typo_meant() -> None:
    with pytest.raises(TypeError, match=r"num_generationz are not fields .*did you mean 'num_generations'"):
        GRPO.from_trl("tiny", [short], args={"num_generationz": 4}, **PORT)


def test_a_bad_env_argument_is_named_without_gymnasiums_dump_of_every_argument() -> None:
    """gymnasium appends the repr of every argument to a TypeError of the constructor: with 5000 rows, a message of
    hundreds of kilobytes around the one line that matters."""
    rows = [{"prompt": f"question {i}", "answer": str(i)} for i in range(5000)]
    env_kwargs = {"task": "dataset", "task_kwargs": {"data": rows}, "reward_weights": {"task": math.nan}}
    with pytest.raises(ArgumentError) as from_make_env:
        make_env("R1Zero-v0", 1, env_kwargs)
    assert str(from_make_env.value).startswith("weight of 'task' must be a finite number, got nan")
    assert len(str(from_make_env.value)) < 300
    with pytest.raises(ArgumentError) as from_port:
        GRPO.from_trl("tiny", [short], **{**PORT, "train_dataset": rows, "env_kwargs": {"max_turns": 0}})
    assert len(str(from_port.value)) < 300 and "max_turns must be an integer" in str(from_port.value)


def test_an_argument_the_env_does_not_take_is_an_argument_error_naming_ours() -> None:
    """A plain TypeError before: the command line printed a traceback for a typo in env_kwargs."""
    with pytest.raises(ArgumentError, match="unexpected keyword argument 'max_new_token'; did you mean max_new_tokens"):
        make_env("R1Zero-v0", 1, {"max_new_token": 5})
    with pytest.raises(ArgumentError, match="'n_group'"):
        GRPO("TransformerPolicy", make_env("R1Zero-v0", 1, ENV_KWARGS), n_group=2)
