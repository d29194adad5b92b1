"""grpo_gym.validation: the argument checkers, the bounded line reader, and every constructor's bad-value table."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_gym import CompositeReward, DynamicCurriculum, R1ZeroEnv, RewardModelScorer
from grpo_gym.context import ContextWindow
from grpo_gym.tasks import ArithmeticTask, CountdownTask, JsonlTask, make_task
from grpo_gym.validation import (
    ArgumentError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_mapping,
    check_path,
    read_lines,
)

# ---------------------------------------------------------------- the checkers


@pytest.mark.parametrize(
    ("value", "expected"), [(4, 4), (np.int64(4), 4), (np.uint8(4), 4), (4.0, 4), (np.float32(4), 4)]
)
def test_check_int_accepts_integers_and_integral_floats(value: Any, expected: int) -> None:
    result = check_int("n", value, low=1)
    assert result == expected and type(result) is int


@pytest.mark.parametrize("value", [2.7, math.nan, math.inf, "4", True, np.bool_(True), None, [4], 0])
def test_check_int_refuses_with_name_value_and_range(value: Any) -> None:
    with pytest.raises(ArgumentError) as info:
        check_int("max_new_tokens", value, low=1, high=10)
    message = str(info.value)
    assert message.startswith("max_new_tokens must be an integer in [1, 10], got ")
    assert repr(value)[:10] in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_check_int_none_and_hint() -> None:
    assert check_int("seed", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1; pass a seed"):
        check_int("seed", -1, low=0, hint="pass a seed")


@pytest.mark.parametrize(("value", "expected"), [(0.5, 0.5), (1, 1.0), (np.float16(0.5), 0.5), (np.int32(0), 0.0)])
def test_check_float_accepts_real_numbers(value: Any, expected: float) -> None:
    result = check_float("beta", value, low=0.0, high=1.0)
    assert result == expected and type(result) is float


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "no", "0.5", True, None, 1.5, -0.1, 1j])
def test_check_float_refuses(value: Any) -> None:
    with pytest.raises(ArgumentError, match=r"^beta must be a finite number in \[0, 1\], got "):
        check_float("beta", value, low=0.0, high=1.0)


def test_check_float_open_bounds_and_inf() -> None:
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        check_float("lr", 0.0, low=0.0, high=1.0, low_open=True)
    assert check_float("lr", 1.0, low=0.0, high=1.0, low_open=True) == 1.0
    with pytest.raises(ValueError, match=r"< 1"):
        check_float("x", 1.0, high=1.0, high_open=True)
    assert check_float("limit", math.inf, low=0.0, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match=r"limit must be a number >= 0, got nan"):
        check_float("limit", math.nan, low=0.0, allow_inf=True)


@pytest.mark.parametrize("value", ["no", "False", 1, 0, None, 1.0, [True]])
def test_check_bool_refuses_anything_but_booleans(value: Any) -> None:
    with pytest.raises(ArgumentError, match=r"^use_all must be True or False, got "):
        check_bool("use_all", value)


def test_check_bool_accepts_booleans() -> None:
    assert check_bool("x", True) is True and check_bool("x", np.bool_(False)) is False
    assert check_bool("x", None, allow_none=True) is None


def test_check_choice() -> None:
    assert check_choice("mode", "token", ("sequence", "token")) == "token"
    assert check_choice("chat", True, ("auto", True, False)) is True
    with pytest.raises(ArgumentError, match=r"chat must be one of 'auto', True, False, got 1$"):
        check_choice("chat", 1, ("auto", True, False))  # 1 == True, but it is not a boolean
    with pytest.raises(ArgumentError, match=r"got 'tokn' \(str\); did you mean 'token'\?"):
        check_choice("mode", "tokn", ("sequence", "token"))
    with pytest.raises(ArgumentError, match=r"got 'TIS' \(str\); did you mean 'tis'\?"):
        check_choice("sampler_correction", "TIS", ("auto", "tis", None))  # a value that differs only in case
    with pytest.raises(ArgumentError, match="one of 'a'"):
        check_choice("mode", ["a"], ("a",))  # unhashable values are compared, not looked up


def test_check_mapping_lists_valid_keys_and_suggests() -> None:
    assert check_mapping("kw", None, ("a",)) == {}
    assert check_mapping("kw", {"a": 1}, ("a", "b")) == {"a": 1}
    with pytest.raises(ArgumentError, match=r"kw: unknown key 'n_group' \(did you mean 'n_groups'\?\); valid keys: "):
        check_mapping("kw", {"n_group": 8}, ("n_groups", "group_size"))
    with pytest.raises(ArgumentError, match="unknown key 3"):
        check_mapping("kw", {3: 1}, ("a",))
    with pytest.raises(ArgumentError, match="kw must be a dict with keys among: a, b, got"):
        check_mapping("kw", [("a", 1)], ("a", "b"))
    with pytest.raises(ArgumentError, match="must be a dict"):
        check_mapping("kw", None, ("a",), allow_none=False)


def test_check_path() -> None:
    assert check_path("path", Path("a/b")) == "a/b"
    for bad in (None, 3, "", b"bytes"):
        with pytest.raises(ArgumentError, match="path must be a path"):
            check_path("path", bad)


# ---------------------------------------------------------------- read_lines


def test_read_lines_numbers_lines_and_strips_newlines_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\n\nthree")
    assert list(read_lines(path)) == [(1, "one"), (2, "two"), (3, ""), (4, "three")]


def test_read_lines_limit_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"a" * 10 + b"\r\n" + b"b" * 10 + b"\n" + b"c" * 11 + b"\n")
    lines = read_lines(path, max_line_bytes=10, what="data file")
    assert next(lines) == (1, "a" * 10) and next(lines) == (2, "b" * 10)
    with pytest.raises(ValueError, match=r"f\.jsonl:3: line longer than 10 bytes"):
        next(lines)


def test_read_lines_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"fine\n\xc3\x28 broken\n")
    with pytest.raises(ValueError, match=r"f\.jsonl:2: not UTF-8 text \(byte 0xc3 at byte 1 of the line\)"):
        list(read_lines(path))
    with pytest.raises(ValueError, match=r"cannot read file .*absent"):
        list(read_lines(tmp_path / "absent"))
    with pytest.raises(ValueError, match="cannot read file"):
        list(read_lines(tmp_path))  # a directory


# ---------------------------------------------------------------- every constructor: one row per argument


def reward_model_dir(tmp_path: Path) -> str:
    (tmp_path / "rm").mkdir(exist_ok=True)
    (tmp_path / "rm" / "config.json").write_text("{}")
    return str(tmp_path / "rm")


ENV = {"context_length": 128, "max_new_tokens": 16, "template": "compact"}
BAD_VALUES: list[tuple[str, Callable[[Path], Any], str]] = [
    # (argument name in the message, the construction, the argument)
    ("task", lambda _: R1ZeroEnv(task=5, **ENV), "task"),
    ("task_kwargs", lambda _: R1ZeroEnv(task_kwargs="path=x", **ENV), "task_kwargs"),
    ("unknown key 'use_al'", lambda _: R1ZeroEnv(task="countdown", task_kwargs={"use_al": True}, **ENV), "task_kwargs"),
    ("tokenizer", lambda _: R1ZeroEnv(tokenizer=5, **ENV), "tokenizer"),
    ("context_length", lambda _: R1ZeroEnv(context_length=256.5, max_new_tokens=16), "context_length"),
    ("context_length", lambda _: R1ZeroEnv(context_length="4096", max_new_tokens=16), "context_length"),
    ("max_new_tokens", lambda _: R1ZeroEnv(context_length=128, max_new_tokens=2.7), "max_new_tokens"),
    ("max_new_tokens", lambda _: R1ZeroEnv(context_length=128, max_new_tokens=128), "max_new_tokens"),
    ("action_mode", lambda _: R1ZeroEnv(action_mode="chunk", **ENV), "action_mode"),
    ("max_turns", lambda _: R1ZeroEnv(max_turns=True, **ENV), "max_turns"),
    ("difficulty", lambda _: R1ZeroEnv(difficulty=math.nan, **ENV), "difficulty"),
    ("template", lambda _: R1ZeroEnv(context_length=128, max_new_tokens=16, template="{prompt} {x}"), "template"),
    ("use_chat_template", lambda _: R1ZeroEnv(use_chat_template="no", **ENV), "use_chat_template"),
    ("reward_weights", lambda _: R1ZeroEnv(reward_weights={"style": 1.0}, **ENV), "reward_weights"),
    ("weight of 'task'", lambda _: R1ZeroEnv(reward_weights={"task": math.nan}, **ENV), "reward_weights"),
    ("reward_model", lambda _: R1ZeroEnv(reward_model=3.5, **ENV), "reward_model"),
    ("render_mode", lambda _: R1ZeroEnv(render_mode="rgb", **ENV), "render_mode"),
    ("on_reward_error", lambda _: R1ZeroEnv(on_reward_error="ignore", **ENV), "on_reward_error"),
    ("use_all", lambda _: CountdownTask(use_all="no"), "use_all"),
    ("path", lambda _: JsonlTask(path=None), "path"),
    ("max_line_bytes", lambda p: JsonlTask(p / "x.jsonl", max_line_bytes=0), "max_line_bytes"),
    ("seed", lambda _: ArithmeticTask().sample_seeded(0.3, 2.5), "seed"),
    ("difficulty", lambda _: ArithmeticTask().sample_seeded(True, 1), "difficulty"),
    ("unknown key 'level'", lambda _: make_task("arithmetic", level=3), "kwargs"),
    ("reward_weights", lambda _: CompositeReward(weights=[0.3, 0.4, 0.3]), "weights"),
    ("on_reward_error", lambda _: CompositeReward(on_error="skip"), "on_error"),
    ("context_length", lambda _: ContextWindow(2.5, 0), "length"),
    ("pad_id", lambda _: ContextWindow(8, -1), "pad_id"),
    ("initial", lambda _: DynamicCurriculum(initial="0.3"), "initial"),
    ("raise_above", lambda _: DynamicCurriculum(raise_above=math.nan), "raise_above"),
    ("lower_below", lambda _: DynamicCurriculum(lower_below=0.9), "lower_below"),
    ("step_up", lambda _: DynamicCurriculum(step_up=math.inf), "step_up"),
    ("step_down", lambda _: DynamicCurriculum(step_down=-0.1), "step_down"),
    ("minimum", lambda _: DynamicCurriculum(minimum=0.0), "minimum"),
    ("maximum", lambda _: DynamicCurriculum(maximum=True), "maximum"),
    ("path", lambda _: RewardModelScorer(None), "path"),
    ("batch_size", lambda p: RewardModelScorer(reward_model_dir(p), batch_size=2.7), "batch_size"),
    ("max_length", lambda p: RewardModelScorer(reward_model_dir(p), max_length=1), "max_length"),
    ("device", lambda p: RewardModelScorer(reward_model_dir(p), device=0), "device"),
]


@pytest.mark.parametrize(
    ("name", "build", "argument"), BAD_VALUES, ids=[f"{i}-{row[2]}" for i, row in enumerate(BAD_VALUES)]
)
def test_every_bad_argument_raises_at_construction_naming_it(
    tmp_path: Path, name: str, build: Callable[[Path], Any], argument: str
) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        build(tmp_path)
    assert name in str(info.value)


def test_integral_floats_and_numpy_values_are_accepted() -> None:
    env = R1ZeroEnv(
        context_length=np.int64(128), max_new_tokens=16.0, max_turns=np.int32(2), difficulty=np.float32(0.5)
    )
    assert (env.context_length, env.max_new_tokens, env.max_turns) == (128, 16, 2)
    assert type(env.max_new_tokens) is int and env.difficulty == 0.5
