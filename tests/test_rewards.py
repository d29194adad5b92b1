"""Tests for grpo_gym.rewards: the template parser, the three components and the composite reward."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_gym.env import R1ZeroEnv
from grpo_gym.rewards import (
    DEFAULT_WEIGHTS,
    MAX_COMPLETION_CHARS,
    CompositeReward,
    ParsedCompletion,
    consistency_score,
    length_score,
    parse_completion,
    syntax_score,
    task_score,
)
from grpo_gym.tasks import make_task
from grpo_gym.tasks.base import Problem, Task, Verdict
from tests.guards import nothing_executes


class SumTask(Task):
    """A tiny task: the sum of two integers. Records every answer its verifier sees."""

    name = "sum"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        a, b = (int(x) for x in rng.integers(0, 100, size=2))
        return Problem(prompt=f"What is {a} + {b}?", answer=str(a + b), task=self.name, difficulty=difficulty)

    def verify(self, problem: Problem, answer: str) -> Verdict:
        self.seen.append(answer)
        if answer.strip() == problem.answer:
            return Verdict(True)
        return Verdict(False, f"{answer.strip()[:20]!r} is not the sum")

    def solution(self, problem: Problem) -> tuple[str, str]:
        return f"{problem.prompt[8:-1]} = {problem.answer}", problem.answer


class BrokenTask(SumTask):
    """A task whose hooks raise, as a buggy task family might."""

    def verify(self, problem: Problem, answer: str) -> Verdict:
        raise RuntimeError("verifier bug")

    def conclusion(self, problem: Problem, reasoning: str) -> str | None:
        raise KeyError("conclusion bug")


class NoTermsTask(SumTask):
    def key_terms(self, problem: Problem) -> list[str]:
        return []


@pytest.fixture
def task() -> SumTask:
    return SumTask()


@pytest.fixture
def problem() -> Problem:
    return Problem(prompt="What is 12 + 30?", answer="42", task="sum", difficulty=0.3)


GOOD = "<think>12 + 30 = 42</think><answer>42</answer>"


# ---------------------------------------------------------------- parser


def test_parse_well_formed() -> None:
    parsed = parse_completion("  \n<think> 12 + 30 = 42 </think>\n\n<answer> 42 </answer>\n ")
    assert parsed == ParsedCompletion(reasoning="12 + 30 = 42", answer="42", well_formed=True, reason="")


def test_parse_bytes_valid_utf8() -> None:
    parsed = parse_completion("<think>ça fait 42</think><answer>42</answer>".encode())
    assert parsed.well_formed and parsed.reasoning == "ça fait 42" and parsed.answer == "42"


def test_parsed_completion_is_frozen() -> None:
    parsed = parse_completion(GOOD)
    with pytest.raises(AttributeError):
        parsed.answer = "7"  # type: ignore[misc]


FIVE_MB = 5 * 1024 * 1024

# (id, completion, reason substring, expected answer, expected reasoning)
BAD_INPUTS = [
    ("repeated-answer", GOOD + "<answer>41</answer>", "2 <answer> tags", None, "12 + 30 = 42"),
    ("repeated-think", "<think>a</think><think>b</think><answer>42</answer>", "2 <think> tags", "42", None),
    ("repeated-close", "<think>12</think><answer>42</answer></answer>", "2 </answer> tags", None, "12"),
    ("nested-answer", "<think>12</think><answer><answer>42</answer></answer>", "2 <answer> tags", None, "12"),
    (
        "nested-think-in-answer",
        "<think>12</think><answer>42<think>x</think></answer>",
        "think tag inside <answer>",
        None,
        None,
    ),
    ("nested-think", "<think>a<think>b</think></think><answer>42</answer>", "2 <think> tags", "42", None),
    ("unclosed-answer", "<think>12 + 30 = 42</think><answer>42", "unclosed <answer>", None, "12 + 30 = 42"),
    ("unclosed-think", "<think>12 + 30 = 42 <answer>42</answer>", "<answer> inside <think>", None, None),
    ("stray-close", "<think>12</think></answer>42", "</answer> without <answer>", None, "12"),
    ("close-before-open", "<think>12</think></answer>42<answer>", "</answer> before <answer>", None, "12"),
    (
        "answer-in-reasoning",
        "<think>12 + 30 <answer>42</answer> = 42</think>",
        "<answer> inside <think>",
        None,
        "12 + 30 <answer>42</answer> = 42",
    ),
    (
        "answer-in-reasoning-and-after",
        "<think>maybe <answer>41</answer></think><answer>42</answer>",
        "2 <answer> tags",
        None,
        "maybe <answer>41</answer>",
    ),
    ("empty", "", "empty completion", None, None),
    ("whitespace-only", " \n\t ", "empty completion", None, None),
    ("trailing-text", GOOD + " and also 41", "text after </answer>", "42", "12 + 30 = 42"),
    ("leading-text", "Sure! " + GOOD, "text before <think>", "42", "12 + 30 = 42"),
    (
        "text-between",
        "<think>12</think> so <answer>42</answer>",
        "text between </think> and <answer>",
        "42",
        "12",
    ),
    (
        "answer-first",
        "<answer>42</answer><think>12 + 30</think>",
        "<answer> before </think>",
        "42",
        "12 + 30",
    ),
    ("no-think", "<answer>42</answer>", "no <think> block", "42", None),
    ("no-tags", "The answer is 42.", "no <answer> block", None, None),
    ("wrong-case-tags", "<think>12</think><ANSWER>42</ANSWER>", "no <answer> block", None, "12"),
    ("empty-answer", "<think>12 + 30</think><answer>  </answer>", "empty <answer>", None, "12 + 30"),
    ("empty-think", "<think> </think><answer>42</answer>", "empty <think>", "42", ""),
    ("5MB-text", "<think>" + "a" * FIVE_MB + "</think><answer>42</answer>", "longer than", None, None),
    ("5MB-tags", "<answer>42</answer>" * (FIVE_MB // 19), "longer than", None, None),
    ("5MB-bytes", b"<think>12</think><answer>42</answer>" + b"\xff" * FIVE_MB, "longer than", None, None),
    (
        "invalid-utf8-prefix",
        b"\xff\xfe<think>12 + 30 = 42</think><answer>42</answer>",
        "text before",
        "42",
        None,
    ),
    (
        "invalid-utf8-answer",
        b"<think>12 + 30 = 42</think><answer>4\xff2</answer>\xc3",
        "text after",
        None,
        None,
    ),
    ("not-text", None, "not text", None, None),
    ("not-text-int", 42, "not text", None, None),
]


@pytest.mark.parametrize(
    ("completion", "reason", "answer", "reasoning"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_parse_bad_inputs(completion: object, reason: str, answer: str | None, reasoning: str | None) -> None:
    parsed = parse_completion(completion)  # type: ignore[arg-type]
    assert not parsed.well_formed
    assert reason in parsed.reason
    if answer is not None:
        assert parsed.answer == answer
    elif reason not in ("text after", "text before"):
        assert parsed.answer is None
    if reasoning is not None or reason in ("longer than", "not text", "empty completion"):
        assert parsed.reasoning == reasoning


def test_invalid_utf8_is_replaced_not_dropped() -> None:
    parsed = parse_completion(b"<think>12 + 30 = 42</think><answer>4\xff2</answer>")
    assert parsed.well_formed and parsed.answer == "4\ufffd2"


def test_length_cap_boundary() -> None:
    body = "<think></think><answer>42</answer>"
    pad = "x" * (MAX_COMPLETION_CHARS - len(body))
    at_cap = f"<think>{pad}</think><answer>42</answer>"
    assert len(at_cap) == MAX_COMPLETION_CHARS and parse_completion(at_cap).well_formed
    over = parse_completion(at_cap + " ")
    assert not over.well_formed and over.answer is None and "longer than" in over.reason


# ---------------------------------------------------------------- bad inputs through the whole reward

# (id, completion, whether the task credit is earned)
REWARD_BAD_INPUTS = [(case[0], case[1], False) for case in BAD_INPUTS if case[3] != "42"] + [
    (case[0], case[1], True) for case in BAD_INPUTS if case[3] == "42"
]
CODE = "<think>run it</think><answer>__import__('pathlib').Path('pwned').touch() or 42</answer>"


@pytest.mark.parametrize(
    ("completion", "earned"),
    [case[1:] for case in REWARD_BAD_INPUTS] + [(CODE, False)],
    ids=[case[0] for case in REWARD_BAD_INPUTS] + ["code-in-answer"],
)
def test_reward_bad_inputs(
    completion: object, earned: bool, task: SumTask, problem: Problem, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CompositeReward()(task, problem, completion)  # type: ignore[arg-type]
    assert result.is_success is earned
    assert result.components["task"] == (1.0 if earned else 0.0)
    assert all(0.0 <= result.components[k] <= 1.0 for k in ("syntax", "consistency", "task"))
    assert result.components["length"] is None  # no token ids given: not applicable
    assert 0.0 <= result.total <= 1.0
    assert all(result.reasons.values())
    if completion is not CODE:
        assert result.components["syntax"] == 0.0
    assert not (tmp_path / "pwned").exists()
    assert all(len(seen) < 100 for seen in task.seen)  # the verifier only ever saw an extracted answer


def test_code_is_data(task: SumTask, problem: Problem) -> None:
    result = CompositeReward()(task, problem, CODE)
    assert result.components["syntax"] == 1.0
    assert task.seen == ["__import__('pathlib').Path('pwned').touch() or 42"]
    assert result.reasons["task"].startswith('"__import__')


def test_fuzz_never_raises(task: SumTask, problem: Problem) -> None:
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "42", "12", "30", " ", "\n", "x", "<", ">", "/"]
    reward = CompositeReward()
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        parsed = parse_completion(text)
        assert parsed.well_formed == (parsed.reason == "")
        if parsed.answer is not None:
            assert text.count("<answer>") == 1 and text.count("</answer>") == 1
            assert not any(tag in parsed.answer for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        if parsed.well_formed:
            assert parsed.answer and parsed.reasoning
            assert all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        result = reward(task, problem, text)
        assert 0.0 <= result.total <= 1.0 and all(result.reasons.values())


# ---------------------------------------------------------------- components


def test_syntax_score() -> None:
    assert syntax_score(parse_completion(GOOD)) == (1.0, "well formed")
    assert syntax_score(parse_completion(GOOD + "!")) == (0.0, "text after </answer>")


def test_task_score(task: SumTask, problem: Problem) -> None:
    assert task_score(task, problem, parse_completion(GOOD)) == (1.0, "correct")
    score, reason = task_score(task, problem, parse_completion("<think>12</think><answer>41</answer>"))
    assert score == 0.0 and reason == "'41' is not the sum"
    score, reason = task_score(task, problem, parse_completion(GOOD + "<answer>42</answer>"))
    assert score == 0.0 and reason == "no unambiguous answer (2 <answer> tags)"
    assert task.seen == ["42", "41"]  # only extracted answers, stripped; nothing for the ambiguous one


@pytest.mark.parametrize(
    ("completion", "score", "reason"),
    [
        (GOOD, 1.0, "answer agrees with reasoning; 2/2 key terms"),
        (
            "<think>12 + 30 = 41</think><answer>41</answer>",
            1.0,
            "answer agrees with reasoning; 2/2 key terms",
        ),
        (
            "<think>12 + 30 = 41</think><answer>40</answer>",
            0.5,
            "answer disagrees with reasoning; 2/2 key terms",
        ),
        (
            "<think>I think it is 42</think><answer>42</answer>",
            0.5,
            "answer agrees with reasoning; 0/2 key terms",
        ),
        (
            "<think>12 plus something: 42</think><answer>42</answer>",
            0.75,
            "agrees with reasoning; 1/2 key terms",
        ),
        (
            "<think>12 and 30, then 42</think><answer>42</answer> ps",
            1.0,
            "agrees with reasoning; 2/2 key terms",
        ),
        ("<think>no idea</think><answer>42</answer>", 0.0, "reasoning reaches no conclusion; 0/2 key terms"),
        ("<think>12 + 30</think><answer>42</answer>", 0.5, "answer disagrees with reasoning; 2/2 key terms"),
        ("<answer>42</answer>", 0.0, "no reasoning"),
        ("<think>12 + 30 = 42</think>", 0.0, "no answer (no <answer> block)"),
    ],
)
def test_consistency_score(task: SumTask, problem: Problem, completion: str, score: float, reason: str) -> None:
    got_score, got_reason = consistency_score(task, problem, parse_completion(completion))
    assert got_score == pytest.approx(score)
    assert reason in got_reason


def test_consistency_without_key_terms(problem: Problem) -> None:
    task = NoTermsTask()
    assert consistency_score(task, problem, parse_completion("<think>so 42</think><answer>42</answer>")) == (
        1.0,
        "answer agrees with reasoning; no key terms",
    )
    assert consistency_score(task, problem, parse_completion("<think>so 41</think><answer>42</answer>"))[0] == 0.0


def test_task_bugs_propagate_from_the_components(problem: Problem) -> None:
    task = BrokenTask()
    with pytest.raises(RuntimeError, match="verifier bug"):
        task_score(task, problem, parse_completion(GOOD))
    with pytest.raises(KeyError, match="conclusion bug"):
        consistency_score(task, problem, parse_completion(GOOD))


# ---------------------------------------------------------------- reward errors


def test_composite_catches_counts_reports_and_warns_once(problem: Problem) -> None:
    reward = CompositeReward()
    with pytest.warns(RuntimeWarning, match="KeyError: 'conclusion bug'"):
        result = reward(BrokenTask(), problem, GOOD)
    assert result.total == pytest.approx(0.3) and not result.is_success
    assert result.components == {"syntax": 1.0, "consistency": 0.0, "task": 0.0, "length": None}
    assert result.errors == {"consistency": "KeyError: 'conclusion bug'", "task": "RuntimeError: verifier bug"}
    assert result.reasons["task"] == "error: RuntimeError: verifier bug"
    assert reward.error_counts == {"syntax": 0, "consistency": 1, "task": 1, "length": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per CompositeReward: the second error is only counted
        again = reward(BrokenTask(), problem, GOOD)
    assert again.errors == result.errors and reward.error_counts["task"] == 2
    assert CompositeReward()(SumTask(), problem, GOOD).errors == {}


def test_on_error_raise_reraises_the_original_exception(problem: Problem) -> None:
    class VerifyOnly(SumTask):
        def verify(self, problem: Problem, answer: str) -> Verdict:
            raise ZeroDivisionError("verifier bug")

    reward = CompositeReward(on_error="raise")
    with pytest.warns(RuntimeWarning), pytest.raises(ZeroDivisionError, match="verifier bug"):
        reward(VerifyOnly(), problem, GOOD)
    assert reward.error_counts["task"] == 1
    with pytest.raises(ValueError, match="on_reward_error must be one of 'zero', 'raise'"):
        CompositeReward(on_error="ignore")


class BrokenScorer:
    def __init__(self, result: object) -> None:
        self.result = result

    def score(self, prompts: list[str], completions: list[str]) -> object:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (OSError("model file gone"), "OSError: model file gone"),
        ([0.5], "ValueError: the reward model returned 1 rewards for 2 completions"),
        ([math.inf, 0.5], "ValueError: the reward model returned a non-finite reward (inf)"),
    ],
)
def test_reward_model_errors_are_per_completion(task: SumTask, problem: Problem, result: object, error: str) -> None:
    reward = CompositeReward(reward_model=BrokenScorer(result))
    with pytest.warns(RuntimeWarning, match="consistency"):
        first, second = reward.score_batch(task, [problem] * 2, [GOOD, GOOD])
    assert first.errors == {"consistency": error} and first.components["task"] == 1.0
    assert first.total == pytest.approx(0.6)  # syntax and task still score
    if "non-finite" in error:
        assert second.errors == {} and second.components["consistency"] == 0.5
    else:
        assert second.errors == first.errors
    strict = CompositeReward(reward_model=BrokenScorer(result), on_error="raise")
    with pytest.warns(RuntimeWarning), pytest.raises(Exception):  # noqa: B017 (whatever the reward model raised)
        strict.score_batch(task, [problem] * 2, [GOOD] * 2)
    assert strict.error_counts["consistency"] == 1


def test_reward_model_must_have_a_score_method() -> None:
    with pytest.raises(TypeError, match="reward_model must be None, a path"):
        CompositeReward(reward_model=5)  # type: ignore[arg-type]


# ---------------------------------------------------------------- composite


@pytest.mark.parametrize(
    ("completion", "total", "success"),
    [
        (GOOD, 1.0, True),  # 0.3*1 + 0.4*1 + 0.3*1
        ("<think>12 + 30 = 41</think><answer>41</answer>", 0.7, False),  # 0.3 + 0.4*1 + 0
        ("<think>12 + 30 = 41</think><answer>40</answer>", 0.5, False),  # 0.3 + 0.4*0.5 + 0
        ("<think>I think it is 42</think><answer>42</answer>", 0.8, True),  # 0.3 + 0.4*0.5 + 0.3
        ("<think>12 plus something: 42</think><answer>42</answer>", 0.9, True),  # 0.3 + 0.4*0.75 + 0.3
        (GOOD + " done", 0.7, True),  # 0 + 0.4 + 0.3
        ("<answer>42</answer>", 0.3, True),  # 0 + 0 + 0.3
        ("<think>12 + 30 = 42</think><answer>42", 0.0, False),
        ("", 0.0, False),
    ],
)
def test_composite_totals(task: SumTask, problem: Problem, completion: str, total: float, success: bool) -> None:
    result = CompositeReward()(task, problem, completion)
    assert result.total == pytest.approx(total)
    assert result.is_success is success
    expected = sum(DEFAULT_WEIGHTS[k] * v for k, v in result.components.items() if v is not None)
    assert result.total == pytest.approx(expected)


def test_composite_result_fields(task: SumTask, problem: Problem) -> None:
    result = CompositeReward()(task, problem, "<think>12 + 30 = 41</think><answer>41</answer>")
    assert result.components == {"syntax": 1.0, "consistency": 1.0, "task": 0.0, "length": None}
    assert result.reasons == {
        "syntax": "well formed",
        "consistency": "answer agrees with reasoning; 2/2 key terms",
        "task": "'41' is not the sum",
        "length": "not applicable: no token budget",
    }
    assert result.answer == "41" and result.is_success is False


def test_weights_default_and_copy() -> None:
    reward = CompositeReward()
    assert reward.weights == {"syntax": 0.3, "consistency": 0.4, "task": 0.3, "length": 0.0}
    reward.weights["task"] = 9.0
    assert reward.weights["task"] == 0.3
    assert DEFAULT_WEIGHTS == {"syntax": 0.3, "consistency": 0.4, "task": 0.3, "length": 0.0}


def test_set_weights_partial(task: SumTask, problem: Problem) -> None:
    reward = CompositeReward(weights={"task": 1.0})
    assert reward.weights == {"syntax": 0.3, "consistency": 0.4, "task": 1.0, "length": 0.0}
    reward.set_weights({"syntax": 0.0, "consistency": 0})
    assert reward.weights == {"syntax": 0.0, "consistency": 0.0, "task": 1.0, "length": 0.0}
    assert reward(task, problem, "<think>12 + 30 = 41</think><answer>41</answer>").total == 0.0
    assert reward(task, problem, GOOD).total == 1.0


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"format": 0.3}, "reward_weights: unknown key 'format'"),
        ({"syntax": math.nan}, "weight of 'syntax' must be a finite number, got nan"),
        ({"task": math.inf}, "weight of 'task' must be a finite number, got inf"),
        ({"task": "high"}, "weight of 'task' must be a finite number, got 'high'"),
        ({"task": True}, "weight of 'task' must be a finite number, got True"),
    ],
)
def test_set_weights_rejects(mapping: dict, message: str) -> None:
    reward = CompositeReward()
    with pytest.raises(ValueError, match=message) as info:
        reward.set_weights({"consistency": 0.9, **mapping})
    assert "valid keys: syntax, consistency, task, length" in str(info.value)
    assert reward.weights == DEFAULT_WEIGHTS  # nothing changed
    with pytest.raises(ValueError, match="valid keys"):
        CompositeReward(weights=mapping)


def test_total_clipped(task: SumTask, problem: Problem) -> None:
    reward = CompositeReward(weights={"syntax": 2, "consistency": 2, "task": 2})
    with pytest.warns(RuntimeWarning, match="was clipped"):
        assert reward(task, problem, GOOD).total == 1.0  # 6 clipped
    assert reward(task, problem, "<think>12 + 30 = 41</think><answer>41</answer>").total == 1.0  # 4 clipped
    assert reward(task, problem, "<think>I think it is 42</think><answer>4</answer>").total == 1.0  # 2 + 0
    reward.set_weights({"syntax": 0.1, "consistency": 0.5})
    assert reward(task, problem, "<answer>41</answer>").total == 0.0
    assert reward(task, problem, "<think>12 + 30 = 41</think><answer>41</answer>").total == pytest.approx(0.6)


def test_score_batch_matches_single_calls(task: SumTask, problem: Problem) -> None:
    other = Problem(prompt="What is 1 + 2?", answer="3", task="sum", difficulty=0.1)
    completions = [
        GOOD,
        b"<think>1 + 2 = 3</think><answer>3</answer>",
        "<answer>3</answer><answer>3</answer>",
    ]
    problems = [problem, other, other]
    reward = CompositeReward()
    batch = reward.score_batch(task, problems, completions)
    assert batch == [reward(task, p, c) for p, c in zip(problems, completions, strict=True)]
    assert [r.total for r in batch] == pytest.approx([1.0, 1.0, 0.0])
    assert reward.score_batch(task, [], []) == []
    with pytest.raises(ValueError, match="2 problems but 3 completions"):
        reward.score_batch(task, problems[:2], completions)
    with pytest.raises(ValueError, match="1 prompt_texts"):
        reward.score_batch(task, problems, completions, ["p"])


class FakeScorer:
    """A stand-in reward model: a fixed score per call position; counts calls and records its inputs."""

    def __init__(self, value: float = 0.25) -> None:
        self.value = value
        self.calls: list[tuple[list[str], list[str]]] = []

    def score(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        self.calls.append((prompts, completions))
        return np.full(len(prompts), self.value)


def test_reward_model_replaces_rule_based_consistency(task: SumTask, problem: Problem) -> None:
    scorer = FakeScorer(0.25)
    reward = CompositeReward(reward_model=scorer)
    result = reward(task, problem, GOOD, prompt_text="Q: 12 + 30?")
    assert result.components == {"syntax": 1.0, "consistency": 0.25, "task": 1.0, "length": None}
    assert result.total == pytest.approx(0.3 + 0.4 * 0.25 + 0.3)
    assert result.reasons["consistency"] == "reward model score 0.2500"
    assert scorer.calls == [(["Q: 12 + 30?"], [GOOD])]


def test_reward_model_one_call_per_batch(task: SumTask, problem: Problem) -> None:
    scorer = FakeScorer(0.5)
    reward = CompositeReward(reward_model=scorer)
    big = b"\xff" * (5 * 1024 * 1024)
    results = reward.score_batch(task, [problem] * 3, [GOOD, big, None], ["a", "b", "c"])  # type: ignore[list-item]
    assert len(scorer.calls) == 1
    prompts, texts = scorer.calls[0]
    assert prompts == ["a", "b", "c"]
    assert texts[0] == GOOD and len(texts[1]) == MAX_COMPLETION_CHARS and texts[2] == ""
    assert [r.components["consistency"] for r in results] == [0.5, 0.5, 0.5]
    assert [r.total for r in results] == pytest.approx([0.8, 0.2, 0.2])


@pytest.mark.parametrize(("value", "expected"), [(math.nan, 0.0), (1.5, 1.0), (-0.5, 0.0)])
def test_reward_model_scores_sanitised(task: SumTask, problem: Problem, value: float, expected: float) -> None:
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = CompositeReward(reward_model=FakeScorer(value))(task, problem, GOOD)
    assert result.components["consistency"] == expected
    assert bool(result.errors) is math.isnan(value)  # a non-finite score is a reward-model error


def test_reward_model_path_string_is_validated() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        CompositeReward(reward_model="./no/such/reward_model_dir")


# ---------------------------------------------------------------- property-based fuzzing (hypothesis)


PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<Answer>", "<answer >", "42", "12", "30", "-7", " ", "\n",
          "x", "<", ">", "/", "=", "é", "\x00", "\ufffd", "__import__('os').system('id')", "12 + 30 = 42"]  # fmt: skip
_CODES = "".join(chr(ord("A") + i) for i in range(len(PIECES)))
_TABLE = dict(zip(map(ord, _CODES), PIECES, strict=True))
completions = st.one_of(
    st.text(alphabet=_CODES, max_size=40).map(lambda s: s.translate(_TABLE)),  # template-shaped text
    st.text(max_size=200),  # any text
    st.binary(max_size=200),  # any bytes (decoded as UTF-8 with replacement)
)
TASKS = [SumTask(), make_task("arithmetic"), make_task("countdown")]


def check_parse(completion: str | bytes) -> None:
    with nothing_executes():
        parsed = parse_completion(completion)
    assert parsed.well_formed == (parsed.reason == "")
    text = completion if isinstance(completion, str) else completion.decode("utf-8", errors="replace")
    if parsed.answer is not None:
        assert parsed.answer == parsed.answer.strip() and parsed.answer
        assert text.count("<answer>") == 1 and text.count("</answer>") == 1
        assert not any(tag in parsed.answer for tag in ("<think>", "</think>", "<answer>", "</answer>"))
    if parsed.well_formed:
        assert parsed.answer and parsed.reasoning
        assert all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))


@settings(max_examples=2000, deadline=None)
@given(completions)
def test_fuzz_parser_never_raises_or_executes(completion: str | bytes) -> None:
    check_parse(completion)


@settings(max_examples=1000, deadline=None)
@given(completion=completions, which=st.integers(0, len(TASKS) - 1), seed=st.integers(0, 2**32 - 1))
def test_fuzz_composite_reward_scores_in_range(completion: str | bytes, which: int, seed: int) -> None:
    task = TASKS[which]
    problem = task.sample(0.5, np.random.default_rng(seed))
    reward = CompositeReward(on_error="raise")  # any exception would surface here
    with nothing_executes():
        result = reward(task, problem, completion)
    assert -1.0 <= result.total <= 1.0
    assert all(v is None or 0.0 <= v <= 1.0 for v in result.components.values())
    assert result.errors == {} and all(isinstance(r, str) and r for r in result.reasons.values())
    assert result.is_success == (result.components["task"] == 1.0)


ENV = None


@settings(max_examples=800, deadline=None)
@given(raw=st.binary(min_size=96, max_size=96), seed=st.integers(0, 2**16))
def test_fuzz_env_scores_any_token_ids(raw: bytes, seed: int) -> None:
    global ENV
    if ENV is None:
        ENV = R1ZeroEnv(context_length=256, max_new_tokens=48, template="compact", on_reward_error="raise")
    ids = np.frombuffer(raw, dtype=np.uint16).astype(np.int64) % ENV.codec.vocab_size  # any 48 ids, bytes included
    ENV.reset(seed=seed)
    with nothing_executes():
        _, reward, terminated, _, info = ENV.step(ids)
    assert -1.0 <= reward <= 1.0 and terminated and info["reward_errors"] == {}


# ---------------------------------------------------------------- named components: functions, weights, None, length
def shout(prompts, completions, **kwargs):
    """A TRL-style function: 1 for a completion in capitals, None (not applicable) for one without letters."""
    return [None if not any(ch.isalpha() for ch in c) else float(c.isupper()) for c in completions]


def test_negative_weights_are_penalties(task: SumTask, problem: Problem) -> None:
    reward = CompositeReward(weights={"syntax": -0.5, "task": 0.3, "consistency": 0.0}, reward_funcs={"shout": shout})
    result = reward(task, problem, GOOD)  # syntax 1, task 1, shout 0 (lower case tags)
    assert result.components["shout"] == 0.0
    assert result.total == pytest.approx(-0.5 + 0.3)
    reward.set_weights({"shout": -2.0})
    assert reward(task, problem, "<THINK>X</THINK>").total == -2.0  # with reward functions: no clip (TRL's sum)


def test_none_is_left_out_of_the_sum(task: SumTask, problem: Problem) -> None:
    reward = CompositeReward(reward_funcs={"shout": shout}, weights={"shout": 5.0})
    result = reward(task, problem, "<>42")
    assert result.components["shout"] is None and "not applicable" in result.reasons["shout"]
    assert result.total == pytest.approx(0.0)  # syntax 0, consistency 0, task 0, shout left out


def test_consistency_is_none_where_the_task_cannot_conclude(task: SumTask) -> None:
    text_problem = Problem(prompt="Capital of France?", answer="Paris", task="sum", difficulty=0.3)
    result = CompositeReward()(task, text_problem, "<think>it is Paris</think><answer>Paris</answer>")
    assert result.components["consistency"] is None and "not applicable" in result.reasons["consistency"]
    assert result.total == pytest.approx(0.6)  # syntax and task; the weight of consistency is left out


@pytest.mark.parametrize(("length", "expected"), [(1, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (20, -1.0)])
def test_length_is_dapo_overlong_penalty(length: int, expected: float) -> None:
    assert length_score(length, 16, 4)[0] == pytest.approx(expected)
    assert length_score(length, None, None) == (None, "not applicable: no token budget")


def test_length_component_from_token_ids(task: SumTask, problem: Problem) -> None:
    reward = CompositeReward(max_new_tokens=16, weights={"length": 1.0})  # buffer 16 // 4 = 4
    short, long = reward.score_batch(task, [problem] * 2, [GOOD, GOOD], completion_ids=[[5] * 10, [5] * 16])
    assert (short.components["length"], long.components["length"]) == (0.0, -1.0)
    assert long.total == pytest.approx(0.0)  # 1.0 from the rest, -1 from length
    with pytest.raises(ValueError, match="overlong_buffer must be an integer in \\[1, 16\\]"):
        CompositeReward(max_new_tokens=16, overlong_buffer=17)


class PartialTask(SumTask):
    def verify(self, problem: Problem, answer: str) -> Verdict:
        return Verdict(answer == problem.answer, "close" if answer != problem.answer else "", 0.5 if answer else 0.0)


def test_partial_credit_from_the_verdict(problem: Problem) -> None:
    result = CompositeReward()(PartialTask(), problem, "<think>12 + 30 = 41</think><answer>41</answer>")
    assert result.components["task"] == 0.5 and result.reasons["task"] == "close" and not result.is_success

    class OutOfRange(SumTask):
        def verify(self, problem: Problem, answer: str) -> Verdict:
            return Verdict(False, "", 1.5)

    with pytest.warns(RuntimeWarning, match="partial credit must be in \\[0, 1\\]"):
        assert CompositeReward()(OutOfRange(), problem, GOOD).errors["task"].startswith("ValueError")


def test_function_errors_follow_on_reward_error(task: SumTask, problem: Problem) -> None:
    def broken(completions, **kwargs):
        raise ZeroDivisionError("my bug")

    reward = CompositeReward(reward_funcs={"broken": broken})
    with pytest.warns(RuntimeWarning, match="'broken' raised ZeroDivisionError: my bug"):
        first, _ = reward.score_batch(task, [problem] * 2, [GOOD, GOOD])
    assert first.errors == {"broken": "ZeroDivisionError: my bug"} and first.components["broken"] == 0.0
    assert reward.error_counts["broken"] == 2 and first.total == pytest.approx(1.0)
    strict = CompositeReward(reward_funcs={"broken": broken}, on_error="raise")
    with pytest.warns(RuntimeWarning), pytest.raises(ZeroDivisionError):
        strict(task, problem, GOOD)


def test_functions_are_called_once_per_batch_with_the_same_results(task: SumTask, problem: Problem) -> None:
    calls: list[int] = []

    def counting(prompts, completions, answer, difficulty, **kwargs):
        calls.append(len(completions))
        return [float(a in c) + d for c, a, d in zip(completions, answer, difficulty, strict=True)]

    reward = CompositeReward(reward_funcs={"counting": counting, "shout": shout})
    other = Problem(prompt="What is 1 + 2?", answer="3", task="sum", difficulty=0.1)
    completions = [GOOD, "<think>1 + 2 = 3</think><answer>3</answer>", "<ANSWER>3</ANSWER>", "...."]
    problems = [problem, other, other, problem]
    batch = reward.score_batch(task, problems, completions, ["p"] * 4)
    assert calls == [4]
    assert batch == [reward(task, p, c, "p") for p, c in zip(problems, completions, strict=True)]
    assert calls == [4, 1, 1, 1, 1]
    assert [r.components["counting"] for r in batch] == [1.3, 1.1, 1.1, 0.3]


def answer_is_42(prompts, completions, **kwargs):
    return [float(c.endswith("<answer>42</answer>")) for c in completions]


def has_think(prompts, completions, **kwargs):
    return [float(c.startswith("<think>")) for c in completions]


def test_reward_functions_add_up_without_a_clip(task: SumTask, problem: Problem) -> None:
    """The issue's blocker: with the built-ins off, a right and a wrong well-formatted answer must not tie at 1."""
    builtins_off = {"syntax": 0.0, "consistency": 0.0, "task": 0.0}
    reward = CompositeReward(builtins_off, reward_funcs=[answer_is_42, has_think])
    assert reward.clip is None  # "auto" with reward functions: TRL's unclipped sum
    right, wrong = reward(task, problem, GOOD), reward(task, problem, "<think>12 + 30 = 41</think><answer>41</answer>")
    assert (right.total, wrong.total) == (2.0, 1.0) and reward.clipped_count == 0
    assert CompositeReward().clip == 1.0  # the built-ins alone: the seed's [-1, 1]
    clipped = CompositeReward(builtins_off, reward_funcs=[answer_is_42, has_think], clip=1.0)
    with pytest.warns(RuntimeWarning, match=r"clipped to \[-1, 1\] \(reward_clip=1\).*reward_clip=None"):
        assert clipped(task, problem, GOOD).total == 1.0  # the tie the issue reported, now with a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        assert clipped(task, problem, GOOD).total == 1.0
    assert clipped.clipped_count == 2
    assert CompositeReward(reward_funcs=[answer_is_42], clip=3)(task, problem, GOOD).total == pytest.approx(2.0)


@pytest.mark.parametrize("clip", [0, -1, math.inf, "none", True])
def test_reward_clip_is_checked(clip: object) -> None:
    with pytest.raises(ValueError, match="reward_clip must be a finite number > 0"):
        CompositeReward(clip=clip)  # type: ignore[arg-type]


def test_the_env_passes_reward_clip() -> None:
    env = R1ZeroEnv(template="compact", reward_funcs=[has_think], reward_clip=0.5)
    assert env.reward_fn.clip == 0.5 and env.describe()["kwargs"]["reward_clip"] == 0.5
    assert R1ZeroEnv(template="compact").reward_fn.clip == 1.0
