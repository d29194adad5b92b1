"""Episodes with tools: schemas, the call parser and its limits, the runner (errors, time limit, non-text results),
the calculator, tool turns in R1ZeroEnv (rewards, budget, transcript), chat templates, gold trajectories, resume."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from grpo_gym import R1ZeroEnv
from grpo_gym.builtin_tools import calculator
from grpo_gym.gold import answer_text, tool_call_text
from grpo_gym.templates import TOOLS_INSTRUCTIONS, PromptFormatter
from grpo_gym.tokenizer import build_char_tokenizer
from grpo_gym.tools import Toolbox, ToolLimits, check_arguments, json_depth, parse_tool_calls, result_text
from grpo_gym.validation import ArgumentError

ENV = {"template": "compact", "context_length": 1024, "max_new_tokens": 160, "difficulty": 0.5}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def lookup(key: str, default: float | None = None, tags: list[str] | None = None) -> dict[str, Any]:
    """Look a key up.

    Args:
        key: the key
        default: returned when the key is unknown
        tags: labels to filter by
    """
    return {"key": key, "value": default, "tags": tags}


def call(name: str, **arguments: Any) -> str:
    return tool_call_text([{"name": name, "arguments": arguments}])


def tool_env(**kwargs: Any) -> R1ZeroEnv:
    return R1ZeroEnv(**{**ENV, "tools": ["calculator"], **kwargs})


def play(env: R1ZeroEnv, text: str) -> tuple[dict, float, bool, bool, dict]:
    return env.step(env.encode_action(text))


def gold_turns(env: R1ZeroEnv) -> tuple[str, str]:
    calls, reasoning, answer = env.task.tool_solution(env.problem, env.tools.names)
    return tool_call_text(calls), answer_text(reasoning, answer)


def window_text(env: R1ZeroEnv) -> str:
    return env.codec.decode(env.window.tokens())


# ---------------------------------------------------------------- schemas
def test_schemas_are_derived_from_type_hints_and_docstrings() -> None:
    box = Toolbox([add, "calculator", lookup])
    assert box.names == ["add", "calculator", "lookup"]
    add_schema = box.schemas[0]["function"]
    assert add_schema["description"] == "Add two integers."
    assert add_schema["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first"}
    assert add_schema["parameters"]["required"] == ["a", "b"]
    lookup_schema = box.schemas[2]["function"]["parameters"]
    assert lookup_schema["properties"]["tags"]["items"] == {"type": "string"}
    assert lookup_schema["required"] == ["key"]
    renamed = Toolbox({"plus": add, "calc": "calculator"})
    assert renamed.names == ["plus", "calc"] and renamed.schemas[0]["function"]["name"] == "plus"


def test_bad_tools_are_refused_with_the_fix() -> None:
    def no_doc(x: int) -> int:
        return x

    def no_hints(x):
        """Doc.

        Args:
            x: X
        """

    with pytest.raises(ArgumentError, match=r"'no_doc'.*docstring"):
        Toolbox([no_doc])
    with pytest.raises(ArgumentError, match=r"'no_hints'.*type hints"):
        Toolbox([no_hints])
    with pytest.raises(ArgumentError, match="unknown built-in tool 'abacus'"):
        Toolbox(["abacus"])
    with pytest.raises(ArgumentError, match="distinct"):
        Toolbox([add, add])
    with pytest.raises(ArgumentError, match="must be a function"):
        Toolbox({"x": 3})
    with pytest.raises(ArgumentError, match="empty"):
        Toolbox([])
    with pytest.raises(ArgumentError, match="tool_timeout"):
        Toolbox([add], timeout=0)
    with pytest.raises(ArgumentError, match="tool_timeout"):
        R1ZeroEnv(**ENV, tool_timeout=float("inf"))
    with pytest.raises(ArgumentError, match="max_tool_calls"):
        R1ZeroEnv(**ENV, tools=[add], max_tool_calls=0)


# ---------------------------------------------------------------- parsing and checking
def test_parser_reads_every_call_and_never_raises() -> None:
    limits = ToolLimits()
    text = f"text {call('add', a=1, b=2)} more {call('calculator', expression='1+1')} <tool_call>{{"
    calls = parse_tool_calls(text, limits)
    assert [(c.name, c.arguments, c.error) for c in calls[:2]] == [
        ("add", {"a": 1, "b": 2}, None),
        ("calculator", {"expression": "1+1"}, None),
    ]
    assert "unclosed" in calls[2].error
    assert parse_tool_calls("no call at all", limits) == []
    assert json_depth('{"a": "[[[[{{", "b": [[1]]}') == 3  # brackets inside strings do not count


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{'name': 'calculator'}</tool_call>", "malformed JSON"),
        ("<tool_call>not json</tool_call>", "malformed JSON"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": NaN}}</tool_call>', "malformed JSON"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no name"),
        ('<tool_call>{"name": "calculator", "arguments": "1+1"}</tool_call>', "'arguments' must be an object"),
        ('<tool_call>{"name": "calculator", "arguments": {}, "id": 3}</tool_call>', "unexpected keys"),
        ('<tool_call>{"name": "abacus", "arguments": {}}</tool_call>', "unknown tool 'abacus'"),
        ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "missing required argument"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>', "must be string"),
        ('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>', "unexpected argument"),
        (
            "<tool_call>" + '{"name": "calculator", "arguments": {"expression": "' + "1+" * 40 + '1"}}</tool_call>',
            "longer",
        ),
        ('<tool_call>{"name": "calculator", "arguments": {"x": ' + "[" * 12 + "]" * 12 + "}}</tool_call>", "deeper"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "2**8"}}</tool_call>', "power"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}', "unclosed"),
    ],
)
def test_each_bad_call_becomes_an_error_message_the_model_reads(text: str, error: str) -> None:
    env = tool_env(max_new_tokens=200)
    env.tools.limits = ToolLimits(max_call_chars=100)  # small enough for a test completion to exceed
    env.reset(seed=0)
    obs, _reward, terminated, truncated, info = play(env, text)
    (record,) = info["tool_calls"]
    assert error in record["error"] and "result" not in record
    assert not terminated and not truncated  # the episode goes on: the model can answer or try again
    assert "\nTool: Error: " in window_text(env) and window_text(env).endswith("\nAssistant: ")
    assert info["reward_components"]["tool_errors"] == 1.0
    assert obs["attention_mask"].sum() == len(env.window)


def test_argument_types_follow_the_schema() -> None:
    schema = Toolbox([lookup]).schemas[0]["function"]["parameters"]
    assert check_arguments(schema, {"key": "k"}) is None
    assert check_arguments(schema, {"key": "k", "default": 3, "tags": None}) is None  # int is a number; nullable
    assert "must be number" in check_arguments(schema, {"key": "k", "default": True})
    assert "['tags'][1]" not in (check_arguments(schema, {"key": "k", "tags": ["a", "b"]}) or "")
    assert "argument 'tags'[1] must be string" in check_arguments(schema, {"key": "k", "tags": ["a", 2]})
    assert "must be integer" in check_arguments(Toolbox([add]).schemas[0]["function"]["parameters"], {"a": 1.5, "b": 2})


def test_too_many_calls_in_a_turn_and_in_an_episode() -> None:
    env = tool_env(max_tool_calls=3, max_new_tokens=300)
    env.tools.limits = ToolLimits(max_calls_per_turn=2)
    env.reset(seed=0)
    three = call("calculator", expression="1+1") * 3
    _, _, terminated, truncated, info = play(env, three)
    results = [r.get("result") for r in info["tool_calls"]]
    assert results == ["2", "2", None] and "too many tool calls" in info["tool_calls"][2]["error"]
    assert info["reward_components"]["tool_calls"] == 2.0 and info["reward_components"]["tool_errors"] == 1.0
    assert not terminated and not truncated
    _, _, terminated, truncated, info = play(env, call("calculator", expression="2+2") * 2)
    assert [r.get("result") for r in info["tool_calls"]] == ["4", None]  # the episode's third and last call
    assert env.tool_session.calls == 3 and not truncated
    _, reward, terminated, truncated, info = play(env, call("calculator", expression="3+3"))
    assert truncated and not terminated  # a tool turn after the budget: the episode ends
    assert "too many tool calls" in info["tool_calls"][0]["error"] and reward == 0.0


# ---------------------------------------------------------------- running
def test_a_tool_that_raises_returns_non_text_or_hangs_leaves_the_env_usable() -> None:
    release = threading.Event()

    def fail(x: int) -> str:
        """Fail.

        Args:
            x: anything
        """
        raise KeyError(f"no entry {x}")

    def hang(x: int) -> str:
        """Wait until the test releases it.

        Args:
            x: anything
        """
        release.wait(30)
        return "late"

    class Odd:
        def __str__(self) -> str:
            return "an odd object"

    def objects(kind: str) -> Any:
        """Return a non-text value.

        Args:
            kind: which one
        """
        return {"dict": {"a": [1, 2.5, None]}, "odd": Odd(), "big": list(range(5000)), "nan": float("nan")}[kind]

    # a window that holds the big result (in 1024 tokens it ended the episode, truncated, before the answer)
    env = R1ZeroEnv(**{**ENV, "context_length": 8192, "tools": [fail, hang, objects], "tool_timeout": 0.2,
                       "max_tool_calls": 8})  # fmt: skip
    env.reset(seed=0)
    _, _, _, _, info = play(env, call("fail", x=3))
    assert info["tool_calls"][0]["error"] == "KeyError: 'no entry 3'"
    _, _, terminated, truncated, info = play(env, call("hang", x=1))
    record = info["tool_calls"][0]
    assert "timed out after 0.2 s" in record["error"] and record["seconds"] >= 0.2
    assert not terminated and not truncated
    release.set()  # the abandoned thread finishes on its own; its result is dropped
    _, _, _, _, info = play(env, call("objects", kind="dict") + call("objects", kind="odd"))
    assert [r["result"] for r in info["tool_calls"]] == ['{"a": [1, 2.5, null]}', "an odd object"]
    _, _, _, _, info = play(env, call("objects", kind="big") + call("objects", kind="nan"))
    big, nan = info["tool_calls"]
    shown = f"... [cut: {len(json.dumps(list(range(5000))))} characters]"
    assert big["result"].endswith(shown) and len(big["result"]) == 2000 + len(shown)
    assert nan["result"] == "nan"  # NaN is no JSON: shown with str()
    _, _, terminated, _, info = play(env, answer_text(*env.task.solution(env.problem)))
    assert terminated and info["is_success"]


def test_async_tools_are_awaited() -> None:
    async def double(x: int) -> int:
        """Double.

        Args:
            x: a number
        """
        return 2 * x

    box = Toolbox([double])
    assert box.play(call("double", x=21), 4).messages == ["42"]


def test_calculator_is_exact_and_never_evaluates_code() -> None:
    assert calculator("37+48*2") == "133"
    assert calculator("(1+2)/4") == "3/4"
    for text, reason in [("__import__('os')", "names"), ("2**10", "power"), ("1/0", "division by zero")]:
        with pytest.raises(ValueError, match=reason):
            calculator(text)
    assert result_text("x" * 30, 10) == "xxxxxxxxxx... [cut: 30 characters]"


# ---------------------------------------------------------------- episodes
def test_gold_tool_episode_succeeds_and_reports_its_calls() -> None:
    env = tool_env(render_mode="ansi")
    _, info = env.reset(seed=1)
    assert info["prompt"].startswith("Tools: calculator(expression)\nUser: What is ")
    first, final = gold_turns(env)
    _, reward, terminated, truncated, info = play(env, first)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["reward_components"]["task"] is None and info["reward_components"]["tool_calls"] == 1.0
    assert info["tool_calls"][0]["result"] == env.problem.answer and info["tool_calls"][0]["seconds"] > 0
    _, reward, terminated, truncated, info = play(env, final)
    assert terminated and not truncated and info["is_success"] and reward == pytest.approx(1.0)
    assert info["tool_calls"] == [] and info["turn"] == 2
    assert env.render().endswith(f"\nTool: {env.problem.answer}\nAssistant: {final}")


def test_max_turns_counts_answers_not_tool_turns() -> None:
    env = tool_env(max_turns=2)
    env.reset(seed=2)
    first, _ = gold_turns(env)
    play(env, first)
    _, _, terminated, _, _info = play(env, "<think>no</think><answer>0</answer>")
    assert not terminated and "That is not correct" in window_text(env)  # one answer of two: feedback
    _, _, terminated, _, _ = play(env, "<think>no</think><answer>1</answer>")
    assert terminated


def test_tool_components_take_weights_and_reward_functions_see_the_transcript() -> None:
    seen: list[str] = []

    def transcript(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        seen.extend(completions)
        return [0.0] * len(completions)

    weights = {"tool_calls": 0.1, "tool_errors": -0.25}
    env = tool_env(reward_weights=weights, reward_funcs={"transcript": transcript})
    env.reset(seed=3)
    first, final = gold_turns(env)
    _, reward, _, _, info = play(env, first + call("abacus"))
    assert reward == pytest.approx(0.1 * 2 - 0.25 * 1)  # two calls made, one of them failed
    assert info["reward_components"]["transcript"] is None and seen == []  # functions score answers
    _, _, _, _, info = play(env, final)
    results = f"\nTool: {env.problem.answer}\nTool: Error: unknown tool 'abacus'; the tools are calculator"
    assert seen == [first + call("abacus") + results + "\nAssistant: " + final]
    with pytest.raises(ArgumentError, match="tool_calls"):
        R1ZeroEnv(**ENV, reward_weights=weights)  # no tools, no tool components
    with pytest.raises(ArgumentError, match="built-in component"):
        tool_env(reward_funcs={"tool_errors": transcript})


def test_score_ahead_leaves_tool_turns_to_step() -> None:
    env = tool_env()
    problem = env.sample_problem(seed=5)
    env.reset(options={"problem": problem})
    first, final = gold_turns(env)
    alone = [env.score_completion(problem, env.encode_action(text))[1:] for text in (first, final)]
    env.score_ahead([problem, problem], [env.encode_action(first), env.encode_action(final)])
    assert len(env._ahead) == 1  # the answer only
    ahead = [env.score_completion(problem, env.encode_action(text))[1:] for text in (first, final)]
    for (r1, te1, tr1, i1), (r2, te2, tr2, i2) in zip(alone, ahead, strict=True):
        assert (r1, te1, tr1, i1["reward_components"]) == (r2, te2, tr2, i2["reward_components"])


def test_an_answer_after_a_tool_turn_is_scored_on_its_transcript_not_ahead() -> None:
    seen: list[str] = []

    def transcript(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        seen.extend(completions)
        return [0.0] * len(completions)

    env = tool_env(reward_funcs={"transcript": transcript})
    problem = env.sample_problem(seed=5)
    env.reset(options={"problem": problem})
    first, final = gold_turns(env)
    env.score_ahead([problem], [env.encode_action(final)])  # another episode's first turn, the same text
    assert seen == [final]
    env.reset(options={"problem": problem})
    play(env, first)
    play(env, final)  # a later turn: scored on this episode's transcript, the kept result left alone
    assert seen[-1].startswith(first) and seen[-1].endswith(final) and len(env._ahead) == 1


def test_window_full_after_a_tool_turn_truncates() -> None:
    env = tool_env(context_length=200, max_new_tokens=120)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = play(env, gold_turns(env)[0])
    assert truncated and not terminated and len(env.window) <= 200


def test_token_mode_tool_turn() -> None:
    env = tool_env(action_mode="token")
    env.reset(seed=4)
    first, final = gold_turns(env)
    for text in (first, final):
        for token in [*env.codec.encode(text), env.codec.eos_id]:
            _, _reward, terminated, _truncated, info = env.step(int(token))
    assert terminated and info["is_success"] and info["turn"] == 2


# ---------------------------------------------------------------- templates
TOOL_CHAT = (
    "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<end>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_template_shows_tools_and_tool_messages() -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TOOL_CHAT
    env = R1ZeroEnv(**{**ENV, "template": "r1zero", "tokenizer": tokenizer, "tools": ["calculator"]})
    _, info = env.reset(seed=0)
    assert info["prompt"].startswith("<tools>calculator;</tools>\n<system>A conversation")
    play(env, gold_turns(env)[0])
    assert window_text(env).endswith(f"<end>\n<tool>{env.problem.answer}<end>\n<assistant>")
    tokenizer.chat_template = TOOL_CHAT.split("{% endif %}", 1)[1]  # a template that ignores tools
    with pytest.raises(ArgumentError, match="does not show tools"):
        R1ZeroEnv(**{**ENV, "tokenizer": tokenizer, "tools": ["calculator"]})
    env = R1ZeroEnv(**{**ENV, "tokenizer": tokenizer, "tools": ["calculator"], "use_chat_template": False})
    assert env.reset(seed=0)[1]["prompt"].startswith("Tools: calculator(expression)\nUser: ")


def test_plain_block_of_an_instructed_template() -> None:
    formatter = PromptFormatter("r1zero", build_char_tokenizer(), tools=Toolbox([add]).schemas)
    prompt = formatter.prompt("Q?")
    lines = prompt.split("\n")
    assert prompt.startswith(TOOLS_INSTRUCTIONS) and json.loads(lines[1])["name"] == "add"
    assert lines[2].startswith("A conversation between User and Assistant")
    assert formatter.tool_results(["add", None], ["3", "Error: x"]) == "\nTool: 3\nTool: Error: x\nAssistant: "


# ---------------------------------------------------------------- cold start, resume, checkers, records
def test_gold_examples_are_the_turns_a_rollout_sees() -> None:
    env = tool_env()
    examples = env.gold_examples(5)
    assert len(examples) == 5
    (p1, c1), (p2, c2) = examples[:2]
    assert env.codec.decode(c1).startswith("<tool_call>{") and c1[-1] == env.codec.eos_id
    assert np.array_equal(p2[: len(p1)], p1) and np.array_equal(p2[len(p1) : len(p1) + len(c1) - 1], c1[:-1])
    tail = env.codec.decode(p2[len(p1) + len(c1) - 1 :])
    assert tail.startswith("\nTool: ") and tail.endswith("\nAssistant: ")
    assert env.codec.decode(c2).startswith("<think>")
    plain = R1ZeroEnv(**ENV).gold_examples(2)  # no tools: one single-turn example per problem
    assert all(env.codec.decode(c).startswith("<think>") for _, c in plain)


def test_resume_mid_episode_after_a_tool_turn() -> None:
    env = tool_env(max_tool_calls=2)
    env.reset(seed=7)
    first, _final = gold_turns(env)
    play(env, first)
    state = json.loads(json.dumps(env.get_state()))  # JSON data
    assert state["episode"]["tools"] == {"calls": 1, "turns": 1}
    other = tool_env(max_tool_calls=2)
    other.reset(seed=99)
    other.set_state(state)
    for text in (call("calculator", expression="1+1"), call("calculator", expression="2+2")):
        a, b = play(env, text), play(other, text)
        assert np.array_equal(a[0]["input_ids"], b[0]["input_ids"]) and a[1:4] == b[1:4]
        assert [r.get("result") for r in a[4]["tool_calls"]] == [r.get("result") for r in b[4]["tool_calls"]]
    assert a[3] and env.tool_session.calls == other.tool_session.calls == 2  # the third tool turn: truncated
    assert env.render_mode is None and env._transcript == other._transcript
    with pytest.raises(ValueError, match="tools"):
        R1ZeroEnv(**ENV).set_state(state)
    before = other.get_state()
    for tools in ({"calls": -1, "turns": 0}, {"calls": 3, "turns": 1}, {"calls": 1, "turns": 2}, None, {"calls": 1}):
        bad = json.loads(json.dumps(state))
        bad["episode"]["tools"] = tools  # negative, past max_tool_calls, more tool turns than turns, missing
        with pytest.raises(ValueError, match=r"state\['episode'\]\['tools'\]"):
            other.set_state(bad)
        assert other.get_state() == before  # a refused state changes nothing


def test_state_without_tools_carries_no_tool_counts() -> None:
    env = R1ZeroEnv(**ENV)
    env.reset(seed=0)
    state = env.get_state()
    assert state["episode"]["tools"] is None
    del state["episode"]["tools"]  # a state saved before tools existed: of the earlier format, which may lack them
    state["format"] = "grpo-gym-env-state/1"
    with pytest.warns(UserWarning, match=r"records no state\['episode'\]\['tools'\] \(default None"):
        env.set_state(state)
    state["episode"]["tools"] = {"calls": 0, "turns": 0}
    with pytest.raises(ValueError, match="no tools"):
        env.set_state(state)


def test_env_checkers_pass_with_tools() -> None:
    gym_check_env(tool_env(), skip_render_check=True)
    sb3_check_env(tool_env(), warn=True)


def test_describe_records_built_in_tools_and_asks_for_functions() -> None:
    record = tool_env().describe()
    assert record["kwargs"]["tools"] == ["calculator"] and "tools" not in record["needs"]
    assert R1ZeroEnv.from_description(record).tools.names == ["calculator"]
    record = R1ZeroEnv(**ENV, tools=[add]).describe()
    assert "tools" in record["needs"]
    with pytest.raises(ValueError, match="tools="):
        R1ZeroEnv.from_description(record)
    assert R1ZeroEnv.from_description(record, tools=[add]).tools.names == ["add"]


def test_tools_unavailable_ends_the_turn_with_the_error_and_remote_tools_keep_their_schemas() -> None:
    from grpo_gym.interop.mcp import mcp_schemas, remote_toolbox
    from grpo_gym.tools import ToolsUnavailable

    listed = [{"name": "echo", "description": "Echo.", "input_schema": {"type": "object",
               "properties": {"text": {"type": "string"}}, "required": ["text"]}}]  # fmt: skip
    calls = []

    def call(name: str, arguments: dict) -> str:
        calls.append((name, arguments))
        if arguments["text"] == "gone":
            raise ToolsUnavailable("the server is gone")
        return arguments["text"]

    box = remote_toolbox(mcp_schemas(listed), call)
    assert box.names == ["echo"] and box.schemas[0]["function"]["parameters"]["required"] == ["text"]
    turn = box.play('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', calls_left=4)
    assert turn.messages == ["hi"] and calls == [("echo", {"text": "hi"})]
    turn = box.play('<tool_call>{"name": "echo", "arguments": {"text": 3}}</tool_call>', calls_left=4)
    assert turn.errors == 1 and "must be string" in turn.messages[0] and len(calls) == 1  # checked before the call
    with pytest.raises(ToolsUnavailable, match="the server is gone"):
        box.play('<tool_call>{"name": "echo", "arguments": {"text": "gone"}}</tool_call>', calls_left=4)
    with pytest.raises(ValueError, match="distinct"):
        remote_toolbox(mcp_schemas(listed * 2), call)
