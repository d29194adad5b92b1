"""Hostile tools and tool calls (grpo_gym/tools.py, grpo_gym/tool_checks.py, issue 37): a tool that changes its
arguments does not rewrite the log, a generator is refused as a tool (or, when only its call shows it, an error
naming the fix), limits and schemas are checked when the toolbox is made, and no text a tool or the model makes can
crash the env's step (a lone surrogate, a limit past what threads can wait)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from grpo_gym import R1ZeroEnv
from grpo_gym.gold import tool_call_text
from grpo_gym.interop.mcp import mcp_schemas, remote_toolbox
from grpo_gym.tools import Toolbox, ToolLimits
from grpo_gym.validation import ArgumentError

ENV = {"template": "compact", "context_length": 1024, "max_new_tokens": 160, "difficulty": 0.5}


def call(name: str, **arguments: Any) -> str:
    return tool_call_text([{"name": name, "arguments": arguments}])


def append(items: list[int], extra: dict[str, int]) -> int:
    """Append to the list it is given and change the dict.

    Args:
        items: numbers
        extra: more numbers
    """
    items.append(99)
    extra["added"] = 1
    return len(items)


def counting(n: int) -> int:
    """Yield numbers (a generator: not a tool).

    Args:
        n: how many
    """
    yield from range(n)


async def streaming(n: int) -> int:
    """Yield numbers asynchronously (not a tool either).

    Args:
        n: how many
    """
    for i in range(n):
        yield i


async def hands_back_a_generator(n: int) -> int:
    """An async tool whose result is a generator (only its call shows it).

    Args:
        n: how many
    """
    return (i for i in range(n))


class Yielding:
    def __call__(self, n: int) -> int:
        """A callable object whose call yields.

        Args:
            n: how many
        """
        yield n


def surrogate(n: int) -> str:
    """Text no tokenizer encodes.

    Args:
        n: ignored
    """
    return "half \ud800 a pair"


def echo_error(text: str) -> str:
    """Raise with the text it got.

    Args:
        text: anything
    """
    raise ValueError(f"cannot use {text}")


def test_a_tool_that_changes_its_arguments_does_not_rewrite_the_log() -> None:
    sent = {"items": [1, 2], "extra": {"a": 1}}
    turn = Toolbox([append]).play(call("append", **sent), 4)
    record = turn.records[0]
    assert record["result"] == "3"  # the tool saw (and changed) its own copy
    assert record["arguments"] == sent  # what the model sent


def test_a_tool_that_changes_its_arguments_leaves_info_as_the_model_sent_it() -> None:
    env = R1ZeroEnv(**ENV, tools=[append])
    env.reset(seed=0)
    info = env.step(env.encode_action(call("append", items=[5], extra={})))[4]
    assert info["tool_calls"][0]["arguments"] == {"items": [5], "extra": {}}


@pytest.mark.parametrize(("tool", "kind"), [(counting, "a generator"), (streaming, "an async generator")])
def test_a_generator_function_is_refused_as_a_tool_naming_the_fix(tool, kind: str) -> None:
    with pytest.raises(ArgumentError, match=rf"tool '{tool.__name__}' is {kind} function .*return its result"):
        Toolbox([tool])
    with pytest.raises(ArgumentError, match="generator function"):
        R1ZeroEnv(**ENV, tools={"numbers": tool})


def test_a_callable_object_whose_call_yields_is_refused() -> None:
    with pytest.raises(ArgumentError, match="'numbers' is a generator function"):
        Toolbox({"numbers": Yielding()})


def test_a_coroutine_that_returns_a_generator_is_an_error_naming_the_fix_and_warned_once() -> None:
    box = Toolbox([hands_back_a_generator])
    with pytest.warns(RuntimeWarning, match="'hands_back_a_generator': .*returned a generator, not a result"):
        first = box.play(call("hands_back_a_generator", n=3), 4).records[0]
    assert "collect what it yields" in first["error"] and "result" not in first
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        second = box.play(call("hands_back_a_generator", n=3), 4).records[0]
    assert second["error"] == first["error"] and not again  # an error again, a warning once


@pytest.mark.parametrize("field", ["max_call_chars", "max_depth", "max_calls_per_turn", "max_result_chars"])
@pytest.mark.parametrize("value", [0, -5, True, float("nan"), "8"])
def test_tool_limits_out_of_range_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ArgumentError, match=rf"ToolLimits\.{field} must be an integer >= 1"):
        ToolLimits(**{field: value})


def test_a_huge_tool_timeout_is_no_limit_not_a_crash() -> None:
    turn = Toolbox(["calculator"], timeout=1e308).play(call("calculator", expression="2+3"), 4)
    assert turn.records[0]["result"] == "5"


def test_a_lone_surrogate_in_a_tools_result_is_shown_as_a_question_mark() -> None:
    env = R1ZeroEnv(**ENV, tools=[surrogate])
    env.reset(seed=0)
    info = env.step(env.encode_action(call("surrogate", n=1)))[4]  # tokenizing it raised a TypeError mid-step
    assert info["tool_calls"][0]["result"] == "half ? a pair"
    assert "half ? a pair" in env.codec.decode(env.window.tokens())  # what the model reads next


def test_a_surrogate_escape_the_model_sends_cannot_crash_the_step() -> None:
    """The model's text can hold the six characters \\ud800: JSON reads them as a lone surrogate, which reaches the
    tool and its error message."""
    env = R1ZeroEnv(**ENV, tools=[echo_error, "calculator"])
    env.reset(seed=0)
    text = '<tool_call>{"name": "echo_error", "arguments": {"text": "\\ud800"}}</tool_call>'
    text += '<tool_call>{"name": "calculator", "arguments": {"expression": "1+\\udfff"}}</tool_call>'
    info = env.step(env.encode_action(text))[4]
    errors = [record["error"] for record in info["tool_calls"]]
    assert errors[0] == "ValueError: cannot use ?" and all(error for error in errors)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ([1], "'parameters' must be an object schema"),
        ({"type": "object", "properties": [1]}, "'parameters' must be an object schema"),
        ({"type": "object", "properties": {"a": {"type": 5}}}, "argument 'a' needs a schema with a JSON type"),
        ({"type": "object", "properties": {"a": "int"}}, "argument 'a' needs a schema with a JSON type"),
        ({"type": "object", "properties": {}, "required": "a"}, "'required' must be a list"),
    ],
)
def test_a_remote_tools_schema_that_cannot_check_calls_is_refused_when_listed(schema: Any, words: str) -> None:
    """These crashed the step of the first call (AttributeError, TypeError) instead."""
    with pytest.raises(ArgumentError, match=rf"tool 'x': its schema cannot check calls: {words}"):
        remote_toolbox(mcp_schemas([{"name": "x", "input_schema": schema}]), lambda name, arguments: "ok")


def test_a_schema_part_that_is_not_a_schema_checks_nothing_rather_than_crash() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": [1], "prefixItems": 5}}}
    box = remote_toolbox(mcp_schemas([{"name": "x", "input_schema": schema}]), lambda name, arguments: arguments)
    record = box.play(call("x", a=[1, "two"]), 4).records[0]
    assert json.loads(record["result"]) == {"a": [1, "two"]}


def test_a_lambda_as_a_tool_is_refused_naming_both_fixes() -> None:
    """Before (hostile round four): the error named the rule but not how to meet it."""
    with pytest.raises(ArgumentError, match=r"got \['<lambda>'\].*`def name\(\.\.\.\)`.*tools=\{'name': function\}"):
        R1ZeroEnv(tools=[lambda n: n])
    assert R1ZeroEnv(tools={"calc": "calculator"}).tools.schemas[0]["function"]["name"] == "calc"


def test_a_huge_completion_is_tokenized_from_a_prefix_with_the_same_action() -> None:
    """Hostile round four: a 10 MB completion sent to the OpenEnv server was tokenized whole (21.6 s holding the GIL)
    before being cut to max_new_tokens. The action is the whole text's; the tokenizer sees a bounded prefix."""
    from grpo_gym.actions import CHARS_PER_TOKEN, text_action

    env = R1ZeroEnv(max_new_tokens=16)
    seen: list[int] = []
    encode = env.codec.encode

    def counted(text: str):
        seen.append(len(text))
        return encode(text)

    huge = "<think>" + "12 + 7 = 19. " * 800_000  # about 10 MB
    expected = text_action(huge[:5000], env.codec, 16)  # 16 tokens lie well inside the first 5000 characters
    env.codec.encode = counted  # type: ignore[method-assign]
    assert (text_action(huge, env.codec, 16) == expected).all()
    assert seen and max(seen) <= 18 * CHARS_PER_TOKEN
