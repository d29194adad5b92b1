"""Hostile inputs, round five (issue 60): what user code hands back was read with ``float()``. A reward function,
a reward model, ``log_metric``, a task's ``sample`` and ``verify`` and a wrapped env's ``step`` return the type their
contract names, or a clear error names the code and the value; a number too large for a float zeroes only its
completion; rewards near float32's range keep their advantages."""

from __future__ import annotations

import decimal
import fractions
import importlib
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
import yaml

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.advantages import group_advantages, leave_one_out_advantages
from algorithms.grpo.advantages import turn_weights
from algorithms.grpo.controls import competition, winning_groups
from grpo_gym.rewards import CompositeReward
from grpo_gym.rewards.functions import RewardLogs, call_reward_funcs
from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import Verdict
from grpo_gym.validation import ReturnTypeError
from grpo_gym.wrappers import LMEnvWrapper
from tests.sizes import ENV_KWARGS, TINY

GOOD = "<think>1 + 1 = 2</think><answer>2</answer>"
FUNCTION_WORDS = "reward function 'f' returned {value}, not a number; it must return a list of floats"


def kwargs_for(n: int) -> dict[str, Any]:
    return {"prompts": ["p"] * n, "completions": ["c"] * n}


def returning(output: Any) -> Any:
    """A reward function that returns ``output`` (its first value alone for one completion)."""

    def f(completions: list[str], **kwargs: Any) -> Any:
        return output[: len(completions)]

    return f


@pytest.mark.parametrize(
    ("output", "shown"),
    [
        (["0.5", "0.5"], "'0.5' (str)"),  # the extracted answer, or a score as text: it trained on float("0.5")
        (["42", "7"], "'42' (str)"),  # a reward of 42, unclipped
        ([" 1e3 ", "1"], "' 1e3 ' (str)"),
        ([b"0.5", b"1"], "b'0.5' (bytes)"),
        (np.array(["0.5", "1"]), "'0.5' (str)"),
        ([1 + 0j, 0.5], "(1+0j) (complex)"),
        ([[0.5], [1.0]], "[0.5] (list)"),
    ],
)
def test_a_reward_function_returning_text_is_its_error_whatever_on_reward_error(output: Any, shown: str) -> None:
    """Silent before: every value was read with float() and trained on."""
    env = gym.make("R1Zero-v0", reward_funcs={"f": returning(output)}, **ENV_KWARGS).unwrapped
    env.reset(seed=0)
    with pytest.raises(ReturnTypeError, match=re.escape(FUNCTION_WORDS.format(value=shown))):
        env.score_ahead([env.problem] * 2, [env.encode_action(GOOD)] * 2)
    with pytest.raises(ReturnTypeError, match="not a text such as the answer"):  # the env alone, one completion
        env.step(env.encode_action(GOOD))


def test_learn_stops_at_the_first_rollout_naming_the_function_and_the_value() -> None:
    def extracted_answer(completions: list[str], **kwargs: Any) -> list[str]:
        return ["42" for _ in completions]

    env = gym.make("R1Zero-v0", reward_funcs=[extracted_answer], **ENV_KWARGS)
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, cold_start=False, seed=0, policy_kwargs=TINY)
    with pytest.raises(ReturnTypeError, match=r"reward function 'extracted_answer' returned '42' \(str\)"):
        model.learn(4)
    assert model.num_timesteps == 0


def test_a_reward_function_path_on_the_command_line_gets_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``-params "env_kwargs:{'reward_funcs': [...]}"`` reached the same silent float()."""
    (tmp_path / "round5_answer_reward.py").write_text(
        "def answer(completions, **kwargs):\n    return ['42' for _ in completions]\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    config = {"R1Zero-v0": {"n_timesteps": 4, "n_groups": 2, "group_size": 2, "cold_start": False,
                            "eval_problems": 2, "policy_kwargs": TINY, "env_kwargs": ENV_KWARGS}}  # fmt: skip
    (tmp_path / "grpo.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    argv = ["train", "--config", "grpo.yml", "--save-path", str(tmp_path / "m.zip"),
            "-params", "env_kwargs:{'reward_funcs': ['round5_answer_reward:answer']}"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "grpo-gym train: error: reward function 'answer' returned '42' (str), not a number" in err
    assert "Traceback" not in err and not (tmp_path / "m.zip").exists()
    sys.modules.pop("round5_answer_reward", None)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([1, 0.5, True, None], [1.0, 0.5, 1.0, None]),  # int, float, bool, None: TRL's
        ([np.float32(0.5), np.int64(2), np.bool_(False), None], [0.5, 2.0, 0.0, None]),
        ([fractions.Fraction(1, 4), decimal.Decimal("0.5"), th.tensor(1.5), th.tensor([2.0])], [0.25, 0.5, 1.5, 2.0]),
        (np.array([0.5, 1.0, 0.0, 2.0], dtype=np.float32), [0.5, 1.0, 0.0, 2.0]),
        (th.tensor([0.5, 1.0, 0.0, 2.0]), [0.5, 1.0, 0.0, 2.0]),
        (np.array([0.5, None, 1, True], dtype=object), [0.5, None, 1.0, 1.0]),
    ],
)
def test_real_numbers_of_every_kind_are_rewards(output: Any, expected: list[float | None]) -> None:
    assert call_reward_funcs({"f": returning(output)}, kwargs_for(4), 4)["f"] == expected


@pytest.mark.parametrize(
    "huge",
    [10**400, 10**5000, fractions.Fraction(10**400, 3), decimal.Decimal("1e400")],
    ids=["int", "int-past-str-limit", "fraction", "decimal"],
)
def test_one_value_too_large_for_a_float_zeroes_only_its_completion(huge: Any) -> None:
    """Before: float(10**400) raised OverflowError out of the loop, and the whole function's batch scored 0."""
    first, second = call_reward_funcs({"f": returning([huge, 1.0])}, kwargs_for(2), 2)["f"]
    assert isinstance(first, ValueError) and "reward function 'f' returned" in str(first) and second == 1.0
    assert re.search(r"beyond float32's range|non-finite", str(first))
    env = gym.make("R1Zero-v0", reward_funcs={"f": returning([huge, 1.0])}, **ENV_KWARGS).unwrapped
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="reward component 'f' raised ValueError"):
        first_result, second_result = env.reward_fn.score_batch(env.task, [env.problem] * 2, [GOOD] * 2)
    assert first_result.components["f"] == 0.0 and "f" in first_result.errors
    assert second_result.components["f"] == 1.0 and second_result.errors == {}


def test_rewards_near_float32s_range_keep_their_advantages() -> None:
    """Before: the float32 std of [3e38, -3e38] was inf, so every advantage was 0, without a word."""
    rewards = th.tensor([[3e38, -3e38], [1.0, 0.0]])
    for scale in ("group", "batch"):
        advantages = group_advantages(rewards, scale=scale)
        assert advantages.dtype == th.float32 and th.isfinite(advantages).all()
        assert advantages[0, 0] > 0.5 and advantages[0, 1] < -0.5
    assert group_advantages(rewards, scale="group")[0].tolist() == pytest.approx([2**-0.5, -(2**-0.5)], rel=1e-4)
    assert leave_one_out_advantages(th.tensor([[3e38, 1e38]]))[0].tolist() == pytest.approx([2e38, -2e38], rel=1e-6)
    weights = turn_weights(rewards)  # per-turn credit's 1/std: not 1/inf = 0
    assert weights.dtype == th.float32 and bool((weights > 0).all())
    assert winning_groups(th.tensor([[3e38, 3e38], [3e38, 1e38]])).tolist() == [True, False]  # means not inf
    assert np.isfinite(competition(rewards, "adaptive", 1.2, 0.0).between_variance)


def test_learn_with_rewards_near_float32s_range_trains_on_their_advantages() -> None:
    def far_apart(completions: list[str], **kwargs: Any) -> list[float]:
        return [3e38 if i % 2 else -3e38 for i in range(len(completions))]

    env = gym.make("R1Zero-v0", reward_funcs=[far_apart], reward_weights={"syntax": 0, "consistency": 0, "task": 0},
                   **ENV_KWARGS)  # fmt: skip
    model = GRPO("TransformerPolicy", env, n_groups=1, group_size=2, cold_start=False, seed=0, policy_kwargs=TINY)
    seen = []
    advantages = model.scoring.advantages

    def spy(*args: Any) -> Any:
        result = advantages(*args)
        seen.append(result[0])
        return result

    model.scoring.advantages = spy  # type: ignore[method-assign]
    model.learn(2)
    assert seen[0][0].tolist() == pytest.approx([-(2**-0.5), 2**-0.5], rel=1e-4)  # before: [0, 0]


class Scorer:
    def __init__(self, result: Any) -> None:
        self.result = result

    def score(self, prompts: list[str], completions: list[str]) -> Any:
        return self.result


@pytest.mark.parametrize(("result", "shown"), [(["0.9", "0.1"], "'0.9' (str)"), ([0.5, None], "None")])
def test_a_reward_model_returning_text_or_none_is_its_error(result: Any, shown: str) -> None:
    """Before: "0.9" scored 0.9; ["high", "low"] was "could not convert string to float", naming no one."""
    reward = CompositeReward(reward_model=Scorer(result))
    task = ArithmeticTask()
    problem = task.sample(0.1, np.random.default_rng(0))
    with pytest.raises(ReturnTypeError, match=rf"the reward model returned {re.escape(shown)}, not a number"):
        reward.score_batch(task, [problem] * 2, [GOOD] * 2)


@pytest.mark.parametrize("value", ["0.5", "abc", [1.0]])
def test_log_metric_of_a_value_that_is_not_a_number_is_named(value: Any) -> None:
    """Before: "0.5" was logged as 0.5; "abc" zeroed the function's batch with "could not convert string to
    float"."""
    with pytest.raises(ReturnTypeError, match=r"log_metric\('accuracy', value\) got .*, not a number; log one number"):
        RewardLogs(2).log_metric("accuracy", value)

    def logging(completions: list[str], log_metric: Any, **kwargs: Any) -> list[float]:
        log_metric("accuracy", value)
        return [1.0] * len(completions)

    with pytest.raises(ReturnTypeError, match="log_metric"):
        call_reward_funcs({"logging": logging}, {**kwargs_for(1), "log_metric": RewardLogs(1).log_metric}, 1)


class BoolVerify(ArithmeticTask):
    name = "bool_verify"

    def verify(self, problem: Any, answer: str) -> Any:
        return answer == problem.answer  # a bool, not a Verdict


class TextCorrect(ArithmeticTask):
    name = "text_correct"

    def verify(self, problem: Any, answer: str) -> Verdict:
        return Verdict(correct="no")  # type: ignore[arg-type]


class TextScore(ArithmeticTask):
    name = "text_score"

    def verify(self, problem: Any, answer: str) -> Verdict:
        return Verdict(False, "close", score="0.5")  # type: ignore[arg-type]


class NoProblem(ArithmeticTask):
    name = "no_problem"

    def sample(self, difficulty: float, rng: np.random.Generator) -> Any:
        super().sample(difficulty, rng)  # forgot the return


@pytest.mark.parametrize(
    ("task", "words"),
    [
        (BoolVerify(), "task 'bool_verify''s verify returned (True|False): it must return Verdict"),  # was a 0, warned
        (TextCorrect(), r"task 'text_correct''s verify returned correct='no' \(str\)"),  # bool("no"): full credit
        (TextScore(), r"task 'text_score''s verify \(its Verdict's score\) returned '0.5' \(str\)"),  # scored 0.5
    ],
)
def test_a_verdict_of_the_wrong_type_is_the_tasks_error(task: ArithmeticTask, words: str) -> None:
    env = gym.make("R1Zero-v0", task=task, **ENV_KWARGS).unwrapped
    env.reset(seed=0)
    with pytest.raises(ReturnTypeError, match=words):
        env.step(env.encode_action(GOOD))


def test_a_task_whose_sample_returns_no_problem_is_named() -> None:
    """Before: AttributeError: 'NoneType' object has no attribute 'seed'."""
    env = gym.make("R1Zero-v0", task=NoProblem(), **ENV_KWARGS).unwrapped
    with pytest.raises(
        ReturnTypeError, match=r"task 'no_problem''s sample returned None, not a grpo_gym.tasks.Problem"
    ):
        env.reset(seed=0)


class TextEnv(gym.Env):
    """A text env whose step returns ``reward`` and ``terminated`` as given."""

    observation_space = gym.spaces.Text(100)
    action_space = gym.spaces.Text(100)

    def __init__(self, reward: Any, terminated: Any = True) -> None:
        self.reward, self.terminated = reward, terminated

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "Say hi", {}

    def step(self, action: str) -> tuple[str, Any, Any, bool, dict]:
        return "done", self.reward, self.terminated, False, {}


def wrapped(reward: Any, terminated: Any = True) -> LMEnvWrapper:
    env = LMEnvWrapper(TextEnv(reward, terminated), max_new_tokens=8, context_length=128)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(("reward", "shown"), [("0.5", "'0.5' (str)"), ("abc", "'abc' (str)"), (b"1", "b'1' (bytes)")])
def test_a_wrapped_envs_reward_of_text_is_its_error(reward: Any, shown: str) -> None:
    """Before: "0.5" trained as 0.5; "abc" was "could not convert string to float: 'abc'"."""
    env = wrapped(reward)
    with pytest.raises(ReturnTypeError, match=rf"the wrapped env's step \(TextEnv\) returned {re.escape(shown)}"):
        env.step(env.encode_action("hi"))


@pytest.mark.parametrize("text", [5, None, b"hi"])
def test_obs_to_text_that_returns_no_text_is_named(text: Any) -> None:
    """Before: "'int' object is not iterable" from deep inside the prompt's layout."""
    env = LMEnvWrapper(TextEnv(1.0), obs_to_text=lambda obs: text, max_new_tokens=8, context_length=128)
    with pytest.raises(ReturnTypeError, match=rf"obs_to_text returned {re.escape(repr(text))}.*, not a str"):
        env.reset(seed=0)


def test_a_wrapped_envs_flag_of_text_is_its_error() -> None:
    """Before: bool("False") ended the episode. The integers 0 and 1 and numpy's bools pass, as Gymnasium's checker
    lets them."""
    env = wrapped(1.0, terminated="False")
    with pytest.raises(ReturnTypeError, match=r"the wrapped env's step \(TextEnv\): terminated returned 'False'"):
        env.step(env.encode_action("hi"))
    for flag in (1, np.int64(1), np.bool_(True)):
        env = wrapped(1.0, terminated=flag)
        env.reset(seed=0)
        assert env.step(env.encode_action("hi"))[2] is True


@pytest.mark.parametrize(("reward", "words"), [(float("nan"), "non-finite reward"), (1e39, "beyond float32's range")])
def test_a_wrapped_envs_non_finite_reward_scores_0_with_the_reason(reward: float, words: str) -> None:
    """Before: it reached the rollout, and learn() stopped with "rewards contain NaN or inf", naming no one."""
    env = wrapped(reward)
    with pytest.warns(RuntimeWarning, match=words):
        _, score, terminated, _, info = env.step(env.encode_action("hi"))
    assert score == 0.0 and terminated and words in info["reward_errors"]["env"]
    env.reset(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        assert env.step(env.encode_action("hi"))[1] == 0.0
    model = GRPO("TransformerPolicy", wrapped(reward), n_groups=1, group_size=2, cold_start=False, seed=0,
                 policy_kwargs=TINY)  # fmt: skip
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match=rf"every completion .*TextEnv.*{words}"):
        model.learn(2)


class TextAgree(ArithmeticTask):
    name = "text_agree"

    def answers_agree(self, problem: Any, first: str, second: str) -> Any:
        return "False"  # bool("False") read as agreement


class TextTerms(ArithmeticTask):
    name = "text_terms"

    def key_terms(self, problem: Any) -> Any:
        return "1 2"  # list() would split it into characters


@pytest.mark.parametrize(
    ("task", "words"),
    [
        (TextAgree(), r"task 'text_agree''s answers_agree returned 'False' \(str\), not True or False"),
        (TextTerms(), r"task 'text_terms''s key_terms returned '1 2' \(str\): it must return a list of strings"),
    ],
)
def test_a_consistency_hook_of_the_wrong_type_is_the_tasks_error(task: ArithmeticTask, words: str) -> None:
    """Found by the search: bool("False") read as agreement; a string of terms was split into its characters."""
    from grpo_gym.rewards.components import consistency_score
    from grpo_gym.rewards.parsing import parse_completion

    problem = task.sample(0.1, np.random.default_rng(0))
    with pytest.raises(ReturnTypeError, match=words):
        consistency_score(task, problem, parse_completion("<think>1 + 1 = 2</think><answer>2</answer>"))
