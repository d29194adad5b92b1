"""Hostile data, reward functions and env states: no silent wrong result, no hang, no half-applied state.

Dataset answers that are NaN/inf, near-zero numbers, CSV files with a repeated header, latin-1 bytes or a huge
field, lone surrogates; reward functions that mutate their arguments or never return (sync, async, blocking the
loop), a reward model that hangs; ``set_state`` with any broken part.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_gym  # noqa: F401
from grpo_gym.env import R1ZeroEnv
from grpo_gym.rewards.composite import CompositeReward
from grpo_gym.rewards.timeouts import RewardTimeout
from grpo_gym.tasks import Problem, make_task
from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import Verdict, numbers_agree, scores_with_user_code
from grpo_gym.validation import ArgumentError
from tests.sizes import ENV_KWARGS

ROWS = [
    {"question": "What is 1 + 1?", "answer": "2", "tags": ["easy", "sum"]},
    {"question": "Say hi", "answer": "hi", "tags": ["word"]},
]


def dataset_env(rows: list[dict] | None = None, **kwargs: Any) -> R1ZeroEnv:
    data = {"data": rows or copy.deepcopy(ROWS), "prompt": "question"}
    return gym.make("R1Zero-v0", task="dataset", task_kwargs=data, **ENV_KWARGS, **kwargs).unwrapped


# ---------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize("answer", [math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("inf")])
def test_a_non_finite_answer_is_refused_naming_the_row(answer: Any) -> None:
    rows = [{"question": "q", "answer": 1.5}, {"question": "q", "answer": answer}]
    with pytest.raises(ValueError, match=r"data row 2: the answer column 'answer' holds .*not a finite number"):
        make_task("dataset", data=rows, prompt="question")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_answer_in_a_json_file_is_refused_naming_the_line(tmp_path: Path, suffix: str, literal: str):
    path = tmp_path / f"rows{suffix}"
    path.write_text(f'{{"prompt": "p", "answer": 1}}\n{{"prompt": "p", "answer": {literal}}}\n')
    with pytest.raises(ValueError, match=rf"rows\{suffix}:2: the answer column 'answer' holds .*not a finite number"):
        make_task("dataset", data=str(path))
    if suffix == ".jsonl":
        with pytest.raises(ValueError, match=r'rows\.jsonl:2: "answer" holds .*not a finite number'):
            make_task("jsonl", path=str(path))


def test_numpy_numbers_are_answers_too() -> None:
    task = make_task(
        "dataset", data=[{"prompt": "p", "answer": np.float32(0.5)}, {"prompt": "q", "answer": np.int64(7)}]
    )
    assert [row.answer for row in task.rows] == ["0.5", "7"]


@pytest.mark.parametrize(
    ("first", "second", "agree"),
    [
        ("1e-9", "2e-9", False),
        ("2e-9", "1e-9", False),
        ("1e-9", "1.0000001e-9", True),
        ("0", "1e-15", True),
        ("0.0", "1e-9", False),
        ("1000000", "1000000.5", True),
        ("0.1", "0.1000002", False),
        ("3", "3.0", True),
        ("12345678901234567890", "12345678901234567891", False),
    ],
)
def test_near_zero_answers_are_compared_by_their_own_scale(first: str, second: str, agree: bool) -> None:
    assert numbers_agree(first, second) is agree
    task = make_task("dataset", data=[{"prompt": "p", "answer": second}])
    problem = task.sample(0.5, np.random.default_rng(0))
    assert task.verify(problem, first).correct is agree


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_agree_is_symmetric_and_relative(a: float, b: float) -> None:
    first, second = repr(a), repr(b)
    assert numbers_agree(first, second) == numbers_agree(second, first)
    if numbers_agree(first, second) and a != b:  # never an absolute 1e-6 window around small numbers
        assert abs(a - b) <= max(1e-6 * max(abs(a), abs(b)), 1e-12)


# ---------------------------------------------------------------------------------------------- CSV files
def test_a_csv_with_a_repeated_column_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("prompt,answer,answer\nq,1,2\n")
    with pytest.raises(ValueError, match=r"rows\.csv:1: the header names column 'answer' more than once"):
        make_task("dataset", data=str(path))


def test_a_latin1_csv_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes("prompt,answer\nq,1\nCaf\u00e9?,2\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"rows\.csv:3: not UTF-8 text \(byte 0xe9\); save the \.csv file as UTF-8"):
        make_task("dataset", data=str(path))


def test_a_huge_csv_field_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("prompt,answer\nq,1\n" + '"' + "x" * 131_073 + '",2\n')
    with pytest.raises(ValueError, match=r"rows\.csv:3: not a readable CSV row .*field larger.*\.jsonl or \.parquet"):
        make_task("dataset", data=str(path))


def test_a_csv_row_with_more_fields_than_the_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("prompt,answer\nq,1\nWhat is 1,000 + 1?,1001\n")
    with pytest.raises(ValueError, match=r"rows\.csv:3: 3 fields for a header of 2 columns; quote fields"):
        make_task("dataset", data=str(path))


# ---------------------------------------------------------------------------------------------- surrogates
@pytest.mark.parametrize(("column", "role"), [("question", "prompt"), ("answer", "answer"), ("solution", "solution")])
def test_a_lone_surrogate_in_a_row_is_refused_at_construction(column: str, role: str) -> None:
    rows = [{"question": "ok", "answer": "1", "solution": "s"}, {"question": "ok", "answer": "1", "solution": "s"}]
    rows[1][column] = "bad \ud800 text"
    with pytest.raises(ValueError, match=rf"data row 2: the {role} column '{column}' holds a lone surrogate U\+D800"):
        make_task("dataset", data=rows, prompt="question", solution="solution")


def test_a_lone_surrogate_escape_in_a_jsonl_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "fine", "answer": 1}\n{"prompt": "bad \\ud800", "answer": 1}\n')
    for kind, kwargs in (("jsonl", {"path": str(path)}), ("dataset", {"data": str(path)})):
        with pytest.raises(ValueError, match=r"rows\.jsonl:2: .*prompt.* holds a lone surrogate"):
            make_task(kind, **kwargs)


def test_a_pinned_problem_with_a_lone_surrogate_is_refused_at_reset_and_changes_nothing() -> None:
    env = dataset_env()
    env.reset(seed=0)
    before = env.get_state()
    bad = Problem(prompt="\udcff", answer="1", task="dataset", difficulty=0.3, metadata={"line": 7})
    with pytest.raises(ValueError, match=r"prompt \(row 7 of task 'dataset'\) holds a lone surrogate U\+DCFF"):
        env.reset(options={"problem": bad})
    with pytest.raises(ValueError, match="a int, not text"):
        env.reset(options={"problem": Problem(prompt=5, answer="1", task="dataset", difficulty=0.3)})
    assert env.get_state() == before


# ---------------------------------------------------------------------------------------------- reward functions
def test_each_reward_function_gets_its_own_copy_of_every_list() -> None:
    seen: list[dict] = []

    def vandal(prompts, completions, completion_ids, tags, answer, **kwargs):
        seen.append(copy.deepcopy({"c": completions, "p": prompts, "ids": completion_ids, "tags": tags}))
        completions[0] = "<answer>2</answer>"
        completions.append("extra")
        prompts.clear()
        completion_ids[0].append(999)
        tags[0].append("vandalised")
        answer[0] = "changed"
        return [1.0] * len(seen[-1]["c"])

    def witness(prompts, completions, completion_ids, tags, answer, **kwargs):
        seen.append(copy.deepcopy({"c": completions, "p": prompts, "ids": completion_ids, "tags": tags, "a": answer}))
        return [0.5] * len(completions)

    env = dataset_env(reward_funcs={"vandal": vandal, "witness": witness})
    problem = next(p for p in (env.sample_problem(seed=s) for s in range(50)) if p.answer == "2")
    for _ in range(2):
        env.reset(options={"problem": problem})
        _, _, _, _, info = env.step(env.encode_action("<answer>3</answer>"))
        assert info["reward_components"]["witness"] == 0.5 and info["reward_errors"] == {}
    first, second = seen[0], seen[1]
    assert second == {**first, "a": ["2"]}  # the witness saw what the vandal saw, untouched
    assert seen[2] == first  # the next step too: nothing was stored changed
    assert problem.metadata["columns"]["tags"] == ["easy", "sum"]
    assert env.task.rows[[r.answer for r in env.task.rows].index("2")].columns["tags"] == ["easy", "sum"]


def test_non_finite_numbers_in_other_columns_reach_reward_functions_as_numbers() -> None:
    """NaN and the infinities outside the answer column are data a reward function may read (a missing score, an
    open bound): it gets floats, as TRL gives a dataset's columns, not the strings "nan"/"inf"; the env's state
    still goes through JSON and back."""
    seen: list[tuple] = []

    def reader(completions, weight, bound, **kwargs):
        seen.append((weight[0], bound[0]))
        return [0.0 if math.isnan(weight[0]) else weight[0]] * len(completions)

    rows = [{"question": "What is 1 + 1?", "answer": "2", "weight": np.float32("nan"), "bound": -math.inf}]
    env = dataset_env(rows, reward_funcs={"reader": reader})
    env.reset(seed=0)
    _, _, _, _, info = env.step(env.encode_action("<answer>2</answer>"))
    ((weight, bound),) = seen
    assert isinstance(weight, float) and math.isnan(weight) and bound == -math.inf
    assert info["reward_components"]["reader"] == 0.0 and info["reward_errors"] == {}
    env.reset(seed=1)
    state = json.loads(json.dumps(env.get_state()))
    other = dataset_env(rows, reward_funcs={"reader": reader})
    other.set_state(state)
    other.step(other.encode_action("<answer>2</answer>"))
    assert math.isnan(seen[-1][0]) and seen[-1][1] == -math.inf


@pytest.mark.filterwarnings("ignore:reward component:RuntimeWarning")
def test_a_reward_beyond_float32_scores_0_and_a_total_beyond_it_is_capped_with_a_warning() -> None:
    """Rollouts store rewards in float32: 1e308 would become inf there and stop learn() mid-training."""
    huge = dataset_env(reward_funcs={"huge": lambda completions, **kw: [1e308] * len(completions)})
    huge.reset(seed=0)
    _, reward, _, _, info = huge.step(huge.encode_action("<answer>2</answer>"))
    assert info["reward_components"]["huge"] == 0.0 and "beyond float32's range" in info["reward_errors"]["huge"]
    assert np.isfinite(np.float32(reward))
    edge = 3e38  # within float32, but two of them are not
    pair = {name: (lambda completions, **kw: [edge] * len(completions)) for name in ("a", "b")}
    both = dataset_env(reward_funcs=pair)
    both.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="beyond float32's range.*capped"):
        _, reward, _, _, info = both.step(both.encode_action("<answer>2</answer>"))
    assert reward == float(np.finfo(np.float32).max) and info["reward_errors"] == {}


@pytest.mark.filterwarnings("ignore:reward component:RuntimeWarning")
def test_learn_names_a_reward_function_returning_1e308() -> None:
    """It crashed in the loss with "rewards contain NaN or inf", naming neither the function nor the value."""
    from algorithms import GRPO
    from tests.sizes import TINY

    env = dataset_env(reward_funcs={"huge": lambda completions, **kw: [1e308] * len(completions)})
    model = GRPO("TransformerPolicy", env, n_groups=1, group_size=2, cold_start=False, seed=0, policy_kwargs=TINY)
    with pytest.raises(RuntimeError, match=r"every completion .*'huge' returned 1e\+308, beyond float32's range"):
        model.learn(total_timesteps=4)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: frees the reward calls the test abandoned."""
    event = threading.Event()
    yield event
    event.set()


@pytest.mark.filterwarnings("ignore:reward component:RuntimeWarning")
def test_a_custom_tasks_verify_that_never_returns_scores_0_and_the_env_stays_usable(release: threading.Event) -> None:
    """A user's task is user code like a reward function: its verify (and consistency hooks) get reward_timeout."""

    class Stuck(ArithmeticTask):
        name = "stuck"

        def verify(self, problem: Problem, answer: str) -> Verdict:
            release.wait()
            return super().verify(problem, answer)

    assert scores_with_user_code(Stuck()) and not scores_with_user_code(ArithmeticTask())
    env = R1ZeroEnv(task=Stuck(), reward_timeout=0.2, **ENV_KWARGS)
    for seed in range(2):
        env.reset(seed=seed)
        _, _, _, _, info = env.step(env.encode_action("<think>1</think><answer>1</answer>"))
        assert info["reward_components"]["task"] == 0.0
        assert "RewardTimeout" in info["reward_errors"]["task"] and "'stuck'" in info["reward_errors"]["task"]
        assert info["reward_components"]["syntax"] == 1.0  # the other components are scored as usual
    release.set()
    env.reset(seed=0)
    assert env.step(env.encode_action("<answer>1</answer>"))[4]["reward_errors"] == {}


@pytest.mark.filterwarnings("ignore:reward component:RuntimeWarning")
def test_a_sync_function_that_never_returns_scores_0_and_the_env_stays_usable(release: threading.Event) -> None:
    def forever(completions, **kwargs):
        release.wait()
        return [1.0] * len(completions)

    def fine(completions, **kwargs):
        return [0.25] * len(completions)

    env = dataset_env(reward_funcs={"forever": forever, "fine": fine}, reward_timeout=0.2)
    for _ in range(2):
        env.reset(seed=0)
        _, _, _, _, info = env.step(env.encode_action("<answer>2</answer>"))
        assert info["reward_components"]["forever"] == 0.0 and info["reward_components"]["fine"] == 0.25
        assert "RewardTimeout" in info["reward_errors"]["forever"]
        assert "within 0.2 s (reward_timeout)" in info["reward_errors"]["forever"]
        assert "keeps running in a daemon thread" in info["reward_errors"]["forever"]
    assert env.reward_fn.error_counts["forever"] == 2


def test_an_async_function_that_never_returns_is_cancelled() -> None:
    cancelled = threading.Event()

    async def forever(completions, **kwargs):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [1.0] * len(completions)

    async def fine(completions, **kwargs):
        return [0.5] * len(completions)

    env = dataset_env(reward_funcs={"forever": forever, "fine": fine}, reward_timeout=0.2)
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning):
        _, _, _, _, info = env.step(env.encode_action("<answer>2</answer>"))
    assert info["reward_components"] == {**info["reward_components"], "forever": 0.0, "fine": 0.5}
    assert "RewardTimeout" in info["reward_errors"]["forever"] and "fine" not in info["reward_errors"]
    assert cancelled.wait(5)


def test_an_async_function_that_blocks_the_loop_is_abandoned_with_it(release: threading.Event) -> None:
    async def blocker(completions, **kwargs):
        release.wait()  # never awaits: the loop itself is stuck
        return [1.0] * len(completions)

    async def fine(completions, **kwargs):
        await asyncio.sleep(0)
        return [0.5] * len(completions)

    env = dataset_env(reward_funcs={"blocker": blocker}, reward_timeout=0.1)
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning):
        _, _, _, _, info = env.step(env.encode_action("<answer>2</answer>"))
    assert "blocked the event loop" in info["reward_errors"]["blocker"]
    after = dataset_env(reward_funcs={"fine": fine}, reward_timeout=5)  # a fresh loop serves the next calls
    after.reset(seed=0)
    assert after.step(after.encode_action("<answer>2</answer>"))[4]["reward_components"]["fine"] == 0.5


def test_a_hanging_reward_model_scores_0(release: threading.Event) -> None:
    class Hanging:
        def score(self, prompts, completions):
            release.wait()
            return [1.0] * len(prompts)

    env = dataset_env(reward_model=Hanging(), reward_timeout=0.1)
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning):
        _, _, _, _, info = env.step(env.encode_action("<answer>2</answer>"))
    assert info["reward_components"]["consistency"] == 0.0
    assert "the reward model did not return within 0.1 s" in info["reward_errors"]["consistency"]


def test_on_reward_error_raise_raises_the_timeout(release: threading.Event) -> None:
    env = dataset_env(
        reward_funcs={"forever": lambda completions, **kw: release.wait()}, reward_timeout=0.1, on_reward_error="raise"
    )
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning), pytest.raises(RewardTimeout, match="forever"):
        env.step(env.encode_action("<answer>2</answer>"))


def test_without_a_timeout_functions_run_in_the_callers_thread() -> None:
    threads: list[threading.Thread] = []

    def where(completions, **kwargs):
        threads.append(threading.current_thread())
        return [0.0] * len(completions)

    for timeout, expected in ((None, True), (30, False)):
        env = dataset_env(reward_funcs={"where": where}, reward_timeout=timeout)
        env.reset(seed=0)
        env.step(env.encode_action("x"))
        assert (threads[-1] is threading.current_thread()) is expected
        assert env.describe()["kwargs"]["reward_timeout"] == timeout


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "30", True])
def test_a_bad_reward_timeout_is_refused(bad: Any) -> None:
    with pytest.raises(ArgumentError, match="reward_timeout"):
        dataset_env(reward_timeout=bad)
    with pytest.raises(ArgumentError, match="reward_timeout"):
        CompositeReward(reward_timeout=bad)


# ---------------------------------------------------------------------------------------------- set_state
def played_env(seed: int) -> R1ZeroEnv:
    env = gym.make("R1Zero-v0", **{**ENV_KWARGS, "max_turns": 3}).unwrapped
    env.reset(seed=seed)
    env.step(env.encode_action("<think>no</think><answer>-1</answer>"))
    return env


BROKEN = {
    "difficulty": [5.0, "0.5", None, math.nan],
    "reward_weights": [{"syntax": math.nan}, {"nope": 1.0}, [1, 2], None],
    "reward_error_counts": [{"syntax": -1}, {"syntax": "x"}, {"nope": 1}, 7],
    "task": [{"cursor": 3}, "x"],
    "warned": [{"prompt_cut": "yes"}, 3],
    "np_random": [{"bit_generator": "Evil"}, {"bit_generator": "PCG64", "state": "x"}, None],
    "episode": [
        {"problem": {"seed": -1, "difficulty": 0.3}},
        "episode",
        {"problem": {"fields": {"prompt": "\ud800"}}},
    ],
}
EPISODE_BROKEN = {
    "turn": [-1, 99, "1", 1.5],
    "transcript": [[1, 2], "text", None],
    "window": [[-1], [10**9], [[1, 2]], "abc"],
    "pending": [[10**20], list(range(1000))],
    "problem": [{"fields": {"prompt": "p", "answer": "1", "task": "arithmetic", "difficulty": 0.3, "x": 1}}, 5],
}


def _broken_states() -> list[tuple[str, dict]]:
    good = played_env(1).get_state()
    cases = [(f"{key}={value!r}", {**good, key: value}) for key, values in BROKEN.items() for value in values]
    cases += [
        (f"episode.{key}={value!r}", {**good, "episode": {**good["episode"], key: value}})
        for key, values in EPISODE_BROKEN.items()
        for value in values
    ]
    cases += [(f"missing {key}", {k: v for k, v in good.items() if k != key}) for key in ("difficulty", "np_random")]
    return cases


@pytest.mark.parametrize(("name", "state"), _broken_states(), ids=[name for name, _ in _broken_states()])
def test_a_bad_state_leaves_the_env_exactly_as_it_was(name: str, state: dict) -> None:
    env = played_env(0)
    before = env.get_state()
    with pytest.raises(ValueError):
        env.set_state(state)
    assert env.get_state() == before


@settings(max_examples=60, deadline=None)
@given(
    path=st.sampled_from([("difficulty",), ("reward_weights",), ("episode", "turn"), ("episode", "window"), ("task",)]),
    junk=st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=5), st.lists(st.integers(), max_size=3)),
)
def test_any_junk_in_a_state_is_refused_whole_or_applied_whole(path: tuple[str, ...], junk: Any) -> None:
    env, source = played_env(0), played_env(1)
    before, state = env.get_state(), json.loads(json.dumps(source.get_state()))
    holder = state
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = junk
    try:
        env.set_state(state)
    except ValueError:
        assert env.get_state() == before
    else:
        assert env.get_state()["episode"]["turn"] == state["episode"]["turn"]


def test_a_solution_with_the_templates_tags_is_refused_naming_the_row(tmp_path: Path) -> None:
    """Hostile round four: a solution whose <answer> disagreed with the answer column became a contradictory
    cold-start target ("<think>...<answer>8</answer></think><answer>7</answer>"), silently."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"prompt": "3 + 4?", "answer": 7, "solution": "3 + 4 = 7"}\n'
        '{"prompt": "3 + 5?", "answer": 7, "solution": "3 + 5 = 8 <answer>8</answer>"}\n'
    )
    with pytest.raises(ValueError, match=r'rows\.jsonl:2: "solution" holds <answer>, </answer>: a solution is'):
        make_task("jsonl", path=str(path))
    rows = [{"prompt": "p", "answer": "1", "solution": "<think>one</think>"}]
    with pytest.raises(ValueError, match=r"data row 1: the solution column 'solution' holds <think>, </think>"):
        make_task("dataset", data=rows, solution="solution")


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "hacker", "content": "2 + 2?"}], "message 0 has the role 'hacker', not one of system, user"),
        ([{"role": "system", "content": "Be brief."}], "it has no user message"),
    ],
)
def test_a_chat_prompt_with_a_foreign_role_or_no_user_turn_is_refused(messages: list, words: str) -> None:
    """Hostile round four: both were taken silently (the template dropped or mis-rendered the turn)."""
    with pytest.raises(ValueError, match=rf"data row 1: .*{words}"):
        make_task("dataset", data=[{"prompt": messages, "answer": "4"}])
