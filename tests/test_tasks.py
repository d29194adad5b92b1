"""Task families: registry, determinism, monotone hardness, gold solutions and verifiers."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from grpo_gym.tasks import (
    ArithmeticTask,
    CountdownTask,
    JsonlTask,
    Problem,
    Task,
    Verdict,
    check_difficulty,
    list_tasks,
    make_task,
    register_task,
    unregister_task,
)
from grpo_gym.tasks.arithmetic import LEVELS, expression_value, level_for
from grpo_gym.tasks.countdown import countdown_parameters
from grpo_gym.tasks.safe_expr import evaluate

LEVELS_TO_TEST = (0.1, 0.3, 0.5, 0.7, 1.0)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def qa_file(tmp_path: Path) -> Path:
    rows = [
        {"prompt": "2+2?", "answer": "4", "solution": "2+2=4", "difficulty": 0.2},
        {"prompt": "Capital of France?", "answer": "Paris", "difficulty": 0.5},
        {"prompt": "Half of 3?", "answer": 1.5, "solution": "3/2=1.5", "difficulty": 0.5},
        {"prompt": "17*23?", "answer": "391", "solution": "17*23=391", "difficulty": 0.9},
    ]
    return _write_jsonl(tmp_path / "qa.jsonl", rows)


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    before = set(list_tasks())
    yield
    for name in set(list_tasks()) - before:
        unregister_task(name)


def _tasks(qa_file: Path) -> list[Task]:
    return [ArithmeticTask(), CountdownTask(), CountdownTask(use_all=False), JsonlTask(qa_file)]


# ---------------------------------------------------------------------------------------------- registry
def test_builtins_are_registered() -> None:
    assert {"arithmetic", "countdown", "jsonl"} <= set(list_tasks())
    assert isinstance(make_task("arithmetic"), ArithmeticTask)
    countdown = make_task("countdown", use_all=False)
    assert isinstance(countdown, CountdownTask)
    assert countdown.use_all is False


def test_make_task_passes_instances_through(qa_file: Path) -> None:
    task = JsonlTask(qa_file)
    assert make_task(task) is task
    assert isinstance(make_task("jsonl", path=qa_file), JsonlTask)
    with pytest.raises(ValueError, match="one or the other"):
        make_task(task, path=qa_file)


def test_unknown_name_lists_registered_tasks() -> None:
    with pytest.raises(ValueError, match="unknown task 'nope'") as info:
        make_task("nope")
    assert "arithmetic" in str(info.value)
    assert "countdown" in str(info.value)
    with pytest.raises(ValueError, match="unknown task"):
        make_task(3)  # type: ignore[arg-type]


def test_register_duplicate_and_overwrite(scratch_registry: None) -> None:
    register_task("my_arith", ArithmeticTask)
    assert "my_arith" in list_tasks()
    assert isinstance(make_task("my_arith"), ArithmeticTask)
    with pytest.raises(ValueError, match="already registered"):
        register_task("my_arith", CountdownTask)
    register_task("my_arith", lambda **kw: CountdownTask(**kw), overwrite=True)
    assert make_task("my_arith", use_all=False).use_all is False
    with pytest.raises(ValueError, match="already registered"):
        register_task("arithmetic", ArithmeticTask)


def test_register_and_make_reject_bad_factories(scratch_registry: None) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        register_task("", ArithmeticTask)
    with pytest.raises(TypeError, match="Task class or factory"):
        register_task("bad", 42)  # type: ignore[arg-type]
    register_task("not_a_task", lambda: "hello")
    with pytest.raises(TypeError, match="not a Task"):
        make_task("not_a_task")
    with pytest.raises(TypeError, match="make_task\\('jsonl'"):
        make_task("jsonl")


# ---------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("bad", [0.0, 0.05, 1.5, float("nan"), float("inf"), "abc", None])
def test_check_difficulty_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="difficulty"):
        check_difficulty(bad)  # type: ignore[arg-type]


def test_check_difficulty_accepts_the_range() -> None:
    assert check_difficulty(0.1) == 0.1
    assert check_difficulty(1) == 1.0
    with pytest.raises(ValueError):
        ArithmeticTask().sample(0.0, np.random.default_rng(0))


def test_same_rng_same_problem_and_pickle(qa_file: Path) -> None:
    for task in _tasks(qa_file):
        for difficulty in LEVELS_TO_TEST:
            first = task.sample(difficulty, np.random.default_rng(123))
            second = task.sample(difficulty, np.random.default_rng(123))
            assert first == second
            assert first.task == task.name
            assert first.difficulty == difficulty
            assert pickle.loads(pickle.dumps(first)) == first
        prompts = {task.sample(0.7, np.random.default_rng(seed)).prompt for seed in range(40)}
        assert len(prompts) > 1


def test_sample_seeded_records_the_seed(qa_file: Path) -> None:
    for task in _tasks(qa_file):
        problem = task.sample_seeded(0.5, 987654321)
        assert problem.seed == 987654321
        assert task.sample_seeded(0.5, problem.seed) == problem


def test_gold_solutions_verify(qa_file: Path) -> None:
    for task in _tasks(qa_file):
        rng = np.random.default_rng(7)
        for difficulty in LEVELS_TO_TEST:
            for _ in range(150):
                problem = task.sample(difficulty, rng)
                reasoning, answer = task.solution(problem)
                assert task.verify(problem, answer) == Verdict(True), (problem, answer)
                if reasoning:
                    conclusion = task.conclusion(problem, reasoning)
                    assert conclusion is not None
                    assert task.answers_agree(problem, conclusion, answer), (problem, reasoning)
                    assert all(term in reasoning for term in task.key_terms(problem)), (problem, reasoning)


# ---------------------------------------------------------------------------------------------- arithmetic
def test_arithmetic_example_and_gold_format() -> None:
    task = ArithmeticTask()
    problem = Problem(
        "What is 37+48*2?",
        "133",
        "arithmetic",
        0.5,
        metadata={"operands": [37, 48, 2], "ops": "+*", "paren": None},
    )
    assert task.solution(problem) == ("48*2=96, 37+96=133", "133")
    assert task.conclusion(problem, "48*2=96, 37+96=133") == "133"
    grouped = {"operands": [3, 2, 9], "ops": "*-", "paren": (1, 2)}
    assert expression_value(grouped["operands"], grouped["ops"], grouped["paren"]) == -21
    assert task.solution(Problem("What is 3*(2-9)?", "-21", "arithmetic", 1.0, metadata=grouped)) == (
        "2-9=-7, 3*(-7)=-21",
        "-21",
    )
    with pytest.raises(ValueError, match="metadata"):
        task.solution(Problem("What is 1+1?", "2", "arithmetic", 0.1))


def test_arithmetic_answer_matches_independent_evaluation() -> None:
    task = ArithmeticTask()
    rng = np.random.default_rng(11)
    for difficulty in LEVELS_TO_TEST:
        for _ in range(200):
            problem = task.sample(difficulty, rng)
            expression = problem.prompt.removeprefix("What is ").removesuffix("?")
            assert evaluate(expression).value == int(problem.answer)


def test_arithmetic_levels_are_monotone() -> None:
    for column in range(len(LEVELS[0])):
        values = [level[column] for level in LEVELS]
        if isinstance(values[0], str):
            assert all(set(a) <= set(b) for a, b in pairwise(values))
        else:
            assert values == sorted(values)
    assert level_for(0.1).operators == "+"
    assert level_for(0.29999999999999993) == level_for(0.3)
    assert level_for(1.0) == LEVELS[-1]


def test_arithmetic_hardness_grows() -> None:
    task = ArithmeticTask()
    stats = []
    for difficulty in (0.1, 0.5, 1.0):
        rng = np.random.default_rng(3)
        problems = [task.sample(difficulty, rng) for _ in range(400)]
        operands = np.mean([len(p.metadata["operands"]) for p in problems])
        digits = np.mean([sum(len(str(x)) for x in p.metadata["operands"]) for p in problems])
        magnitude = np.mean([math.log10(1 + abs(int(p.answer))) for p in problems])
        stats.append((operands, digits, magnitude))
        ops = {op for p in problems for op in p.metadata["ops"]}
        if difficulty == 0.1:
            assert ops == {"+"}
            assert all(len(p.metadata["operands"]) == 2 for p in problems)
        if difficulty == 1.0:
            assert ops == {"+", "-", "*"}
            assert any(p.metadata["paren"] is not None for p in problems)
    for easier, harder in pairwise(stats):
        assert all(a < b for a, b in zip(easier, harder, strict=True)), stats


@pytest.mark.parametrize("text", ["133", " 133 ", "133.", "+133", "\n133\t", "0133"])
def test_arithmetic_accepts_integer_forms(text: str) -> None:
    problem = Problem("What is 37+48*2?", "133", "arithmetic", 0.5)
    assert ArithmeticTask().verify(problem, text) == Verdict(True)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("134", "wrong value"),
        ("-133", "wrong value"),
        ("", "empty answer"),
        ("   ", "empty answer"),
        ("13 3", "not an integer"),
        ("133.0", "not an integer"),
        ("1e2", "not an integer"),
        ("1_33", "not an integer"),
        ("abc", "not an integer"),
        ("37+96", "not an integer"),
        ("\u0661\u0663\u0663", "not an integer"),
        ("\u00b2", "not an integer"),
        ("1" * 5000, "answer longer than 64 characters"),
        ("9" * 1_000_000, "answer longer than 64 characters"),
    ],
)
def test_arithmetic_rejects_with_reason(text: str, reason: str) -> None:
    verdict = ArithmeticTask().verify(Problem("What is 37+48*2?", "133", "arithmetic", 0.5), text)
    assert verdict == Verdict(False, reason)


def test_arithmetic_negative_answers_and_agreement() -> None:
    task = ArithmeticTask()
    problem = Problem("What is 3-10?", "-7", "arithmetic", 0.2)
    assert task.verify(problem, "-7").correct
    assert not task.verify(problem, "7").correct
    assert not task.verify(problem, None).correct  # type: ignore[arg-type]
    assert task.answers_agree(problem, "+7", " 7.")
    assert not task.answers_agree(problem, "7", "-7")
    assert task.key_terms(problem) == ["3", "10"]


# ---------------------------------------------------------------------------------------------- countdown
def _countdown(numbers: list[int], target: int, use_all: bool = True) -> Problem:
    return Problem(
        f"Make {target} from {', '.join(map(str, numbers))}.",
        "",
        "countdown",
        0.5,
        metadata={"numbers": numbers, "target": target, "use_all": use_all},
    )


def test_countdown_parameters_grow() -> None:
    assert countdown_parameters(0.1) == (3, 10, 100)
    assert countdown_parameters(1.0) == (6, 100, 1000)
    grid = [countdown_parameters(d) for d in np.linspace(0.1, 1.0, 37)]
    for column in range(3):
        values = [row[column] for row in grid]
        assert values == sorted(values)


def test_countdown_problems_follow_the_parameters() -> None:
    task = CountdownTask()
    rng = np.random.default_rng(5)
    for difficulty in LEVELS_TO_TEST:
        count, max_number, max_target = countdown_parameters(difficulty)
        for _ in range(100):
            problem = task.sample(difficulty, rng)
            numbers, target = problem.metadata["numbers"], problem.metadata["target"]
            assert len(numbers) == count
            assert all(1 <= n <= max_number for n in numbers)
            assert 1 <= target <= max_target
            assert sorted(evaluate(problem.answer).literals) == sorted(numbers)
            assert problem.prompt == f"Make {target} from {', '.join(map(str, numbers))}."


def test_countdown_hardness_grows() -> None:
    task = CountdownTask()
    means = []
    for difficulty in (0.1, 0.5, 1.0):
        rng = np.random.default_rng(9)
        problems = [task.sample(difficulty, rng) for _ in range(300)]
        means.append(
            (
                np.mean([len(p.metadata["numbers"]) for p in problems]),
                np.mean([max(p.metadata["numbers"]) for p in problems]),
            )
        )
    for easier, harder in pairwise(means):
        assert all(a < b for a, b in zip(easier, harder, strict=True)), means


def test_countdown_gold_example() -> None:
    task = CountdownTask()
    problem = Problem(
        "Make 97 from 25, 4, 3.", "25*4-3", "countdown", 0.3, metadata={"numbers": [25, 4, 3], "target": 97}
    )
    assert task.solution(problem) == ("25*4=100, 100-3=97", "25*4-3")
    assert task.conclusion(problem, "25*4=100, 100-3=97") == "97"
    assert task.answers_agree(problem, "97", "25*4-3")
    assert task.answers_agree(problem, "25*4-3", "4*25-3")
    assert not task.answers_agree(problem, "96", "25*4-3")
    assert task.answers_agree(problem, "x y", "xy")


@pytest.mark.parametrize("text", ["25*4-3", "(25*4)-3", " 4 * 25 - 3 ", "-3+4*25", "25*(4)-3"])
def test_countdown_accepts_valid_expressions(text: str) -> None:
    assert CountdownTask().verify(_countdown([25, 4, 3], 97), text) == Verdict(True)


def test_countdown_exact_fractions_route() -> None:
    assert CountdownTask().verify(_countdown([6, 4, 8], 12), "6/4*8").correct


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os')", "names are not allowed"),
        ("9**9**9", "'**'"),
        ("2**10", "'**'"),
        ("1//2", "'//'"),
        ("(((", "not a valid expression"),
        ("1/0", "division by zero"),
        ("25*4-3/(4-4)", "division by zero"),
        ("1234567890123", "longer than 12 digits"),
        ("1" * 1_000_000, "longer than 256"),
        ("25*4-3-3+3", "uses 3 3 times"),
        ("25*4+4-3", "uses 4 2 times"),
        ("100-3", "uses 100, which is not one of the given numbers"),
        ("25*4", "missing 3"),
        ("25+4+3", "evaluates to 32, not 97"),
        ("25*4-3=97", "'='"),
        ("", "empty expression"),
    ],
)
def test_countdown_rejects_with_reason(text: str, reason: str) -> None:
    verdict = CountdownTask().verify(_countdown([25, 4, 3], 97), text)
    assert not verdict.correct
    assert reason in verdict.reason


def test_countdown_nested_parentheses_within_limits() -> None:
    task = CountdownTask()
    nested = "(" * 10 + "25*4" + ")" * 10 + "-((((3))))"
    assert task.verify(_countdown([25, 4, 3], 97), nested).correct
    too_deep = "(" * 40 + "25*4" + ")" * 40 + "-3"
    assert "nested deeper" in task.verify(_countdown([25, 4, 3], 97), too_deep).reason


def test_countdown_at_most_once() -> None:
    problem = _countdown([25, 4, 3, 7], 97, use_all=False)
    task = CountdownTask(use_all=False)
    assert task.verify(problem, "25*4-3").correct
    assert "uses 3 3 times" in task.verify(problem, "25*4-3-3+3").reason
    strict = _countdown([25, 4, 3, 7], 97, use_all=True)
    assert "missing 7" in task.verify(strict, "25*4-3").reason
    assert "some of" in task.sample(0.5, np.random.default_rng(0)).prompt


def test_countdown_without_metadata_uses_the_gold_expression() -> None:
    problem = Problem("Make 97 from 25, 4, 3.", "25*4-3", "countdown", 0.3)
    task = CountdownTask()
    assert task.verify(problem, "4*25-3").correct
    assert "uses 97" in task.verify(problem, "97+0*25*4").reason
    assert not task.verify(problem, "25+4+3").correct


def test_countdown_verify_never_raises_on_junk() -> None:
    task = CountdownTask()
    problem = _countdown([25, 4, 3], 97)
    rng = np.random.default_rng(0)
    alphabet = list("0123456789+-*/()= .xe_")
    for _ in range(2000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 30))))
        verdict = task.verify(problem, text)
        assert verdict.correct or verdict.reason
    assert not task.verify(problem, None).correct  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- jsonl
def test_jsonl_loads_and_solves(qa_file: Path) -> None:
    task = JsonlTask(qa_file)
    assert len(task) == 4
    problems = {task.sample(1.0, np.random.default_rng(s)).prompt: s for s in range(200)}
    assert set(problems) == {"2+2?", "Capital of France?", "Half of 3?", "17*23?"}
    half = task.sample(1.0, np.random.default_rng(problems["Half of 3?"]))
    assert half.answer == "1.5"
    assert half.seed is None
    assert task.solution(half) == ("3/2=1.5", "1.5")
    france = task.sample(1.0, np.random.default_rng(problems["Capital of France?"]))
    assert task.solution(france) == ("", "Paris")


def test_jsonl_verify_numbers_and_text(qa_file: Path) -> None:
    task = JsonlTask(qa_file)
    number = Problem("?", "1.5", "jsonl", 0.5)
    assert task.verify(number, "1.5").correct
    assert task.verify(number, " 1.5000001 ").correct
    assert task.verify(number, "3/2") == Verdict(False, "does not match the answer")
    assert task.verify(number, "1.6") == Verdict(False, "wrong value")
    integer = Problem("?", "12345678901", "jsonl", 0.5)
    assert task.verify(integer, "12345678901.").correct
    assert not task.verify(integer, "12345678902").correct
    assert task.verify(integer, "1.2345678901e10").correct
    text = Problem("?", "New  York", "jsonl", 0.5)
    assert task.verify(text, " new york ").correct
    assert task.verify(text, "Newyork").reason == "does not match the answer"
    assert task.verify(text, "") == Verdict(False, "empty answer")
    assert not task.verify(text, "x" * 1_000_000).correct
    assert not task.verify(Problem("?", "inf", "jsonl", 0.5), "1e999").correct
    assert task.verify(Problem("?", "NaN", "jsonl", 0.5), "nan").correct


def test_jsonl_difficulty_filtering(qa_file: Path) -> None:
    task = JsonlTask(qa_file)
    seen: dict[float, set[float]] = {}
    for difficulty in (0.1, 0.2, 0.5, 0.8, 1.0):
        rng = np.random.default_rng(1)
        seen[difficulty] = {task.sample(difficulty, rng).metadata["row_difficulty"] for _ in range(200)}
    assert seen[0.1] == {0.2}  # nothing is that easy: the easiest rows
    assert seen[0.2] == {0.2}
    assert seen[0.5] == {0.2, 0.5}
    assert seen[0.8] == {0.2, 0.5}
    assert seen[1.0] == {0.2, 0.5, 0.9}


def test_jsonl_without_difficulties_is_uniform(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "plain.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)])
    task = JsonlTask(path)
    rng = np.random.default_rng(0)
    assert {task.sample(0.1, rng).prompt for _ in range(200)} == {f"q{i}" for i in range(5)}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n', ":3: not valid JSON"),
        ('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n', ':2: missing key "answer"'),
        ('{"answer": "1"}\n', ':1: missing key "prompt"'),
        ("[1, 2]\n", ":1: each line must be a JSON object"),
        ('{"prompt": 3, "answer": "1"}\n', ':1: "prompt" must be a non-empty string'),
        ('{"prompt": "a", "answer": null}\n', ':1: "answer" must be a non-empty string'),
        ('{"prompt": "a", "answer": true}\n', ':1: "answer" must be a non-empty string'),
        ('{"prompt": "a", "answer": "1", "solution": 5}\n', ':1: "solution" must be a string'),
        ('{"prompt": "a", "answer": "1", "difficulty": "hard"}\n', ':1: "difficulty" must be a number'),
        ('{"prompt": "a", "answer": "1", "difficulty": 1.5}\n', ":1: difficulty must be a finite number in [0.1, 1]"),
        (
            '{"prompt": "a", "answer": "1", "difficulty": 0.5}\n{"prompt": "b", "answer": "2"}\n',
            ':2: no "difficulty"',
        ),
        ("\n  \n", "the file has no rows"),
        ("", "the file has no rows"),
    ],
)
def test_jsonl_validation_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        JsonlTask(path)
    assert message in str(info.value)


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no file at"):
        JsonlTask(tmp_path / "absent.jsonl")


# ---------------------------------------------------------------------------------------------- other processes
class SubprocTask(ArithmeticTask):
    """A user's task, registered by name in the parent process."""

    name = "subproc_task"


def test_a_registered_task_reaches_subprocess_workers(scratch_registry: None) -> None:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    register_task("subproc_task", SubprocTask)
    venv = make_vec_env(
        "grpo_gym:R1Zero-v0",
        n_envs=1,
        env_kwargs={"task": "subproc_task", "context_length": 128, "max_new_tokens": 16},
        vec_env_cls=SubprocVecEnv,
        vec_env_kwargs={"start_method": "spawn"},  # a fresh interpreter that never ran register_task
    )
    try:
        assert venv.env_method("sample_problem", seed=0)[0].task == "subproc_task"
    finally:
        venv.close()


def test_a_task_class_in_a_script_reaches_subprocess_workers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from stable_baselines3.common.env_util import make_vec_env\n"
        "from stable_baselines3.common.vec_env import SubprocVecEnv\n"
        "from grpo_gym.tasks import ArithmeticTask, register_task\n\n"
        "class ScriptTask(ArithmeticTask):\n"
        "    name = 'script_task'\n\n"
        "if __name__ == '__main__':\n"
        "    register_task('script_task', ScriptTask)\n"
        "    venv = make_vec_env('grpo_gym:R1Zero-v0', n_envs=1, vec_env_cls=SubprocVecEnv,\n"
        "                        env_kwargs={'task': 'script_task', 'context_length': 128, 'max_new_tokens': 16})\n"
        "    print(venv.env_method('sample_problem', seed=0)[0].task, type(venv.get_attr('task')[0]).__name__)\n"
        "    venv.close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["script_task", "ScriptTask"]


def test_tasks_by_importable_path_and_the_unknown_task_hint(scratch_registry: None) -> None:
    task = make_task("grpo_gym.tasks.countdown:CountdownTask", use_all=False)
    assert isinstance(task, CountdownTask) and task.use_all is False
    with pytest.raises(ValueError, match=r"names .*, not a Task subclass"):
        make_task("os:getcwd")
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        make_task("no_such_module:Task")
    with pytest.raises(ValueError, match=r"pass task='package\.module:ClassName'"):
        make_task("registered_elsewhere")
    register_task("by_path", "grpo_gym.tasks.countdown:CountdownTask")
    assert isinstance(make_task("by_path"), CountdownTask)
    with pytest.raises(ValueError, match="without ':'"):
        register_task("a:b", CountdownTask)
