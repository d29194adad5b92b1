"""``R1ZeroEnv.describe()``: a JSON record of the env, and rebuilding the env from it plus the objects it needs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import grpo_gym
from grpo_gym.describe import MUST_PASS, env_kwargs_from_record, make_env_from_record
from grpo_gym.tasks import ArithmeticTask
from tests.sizes import ENV_KWARGS


def accuracy(prompts, completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer, strict=True)]


def brevity(prompts, completions, **kwargs):
    return [-len(c) / 100 for c in completions]


def roundtrip(env: grpo_gym.R1ZeroEnv, **objects) -> grpo_gym.R1ZeroEnv:
    record = json.loads(json.dumps(env.describe()))  # what a model file would hold
    return grpo_gym.R1ZeroEnv.from_description(record, **objects)


def same_episode(a: grpo_gym.R1ZeroEnv, b: grpo_gym.R1ZeroEnv) -> None:
    problem = a.sample_problem(seed=3)
    action = a.encode_action(f"<think>x</think><answer>{problem.answer}</answer>")
    assert a.score_completion(problem, action)[1:] == b.score_completion(problem, action)[1:]
    assert (a.observation_space, a.action_space) == (b.observation_space, b.action_space)


def test_plain_env_roundtrip_needs_nothing() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, task="countdown", task_kwargs={"use_all": False}, overlong_buffer=4)
    record = env.describe()
    assert record["format"] == "grpo-gym-env/1" and record["env_id"] == "R1Zero-v0" and record["needs"] == []
    assert record["kwargs"]["task"] == "countdown" and record["kwargs"]["task_kwargs"] == {"use_all": False}
    rebuilt = roundtrip(env)
    assert rebuilt.task.use_all is False and rebuilt.reward_fn.overlong_buffer == 4
    same_episode(env, rebuilt)
    made = make_env_from_record(record)  # through gym.make, wrappers included
    assert made.unwrapped.describe() == record


def test_reward_functions_are_recorded_by_name_and_must_be_passed() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"acc": accuracy}, reward_weights={"acc": -0.5})
    record = env.describe()
    assert record["kwargs"]["reward_funcs"] == {"acc": MUST_PASS} and record["needs"] == ["reward_funcs"]
    assert "accuracy" not in json.dumps(record)  # never the function's importable name: a file picks no code
    with pytest.raises(ValueError, match=r"pass reward_funcs=\{'acc': \.\.\.\}"):
        roundtrip(env)
    with pytest.raises(ValueError, match="names \\['acc'\\] too"):
        roundtrip(env, reward_funcs={"other": accuracy})
    rebuilt = roundtrip(env, reward_funcs={"acc": accuracy})
    assert rebuilt.reward_fn.weights["acc"] == -0.5
    same_episode(env, rebuilt)


def test_objects_a_file_cannot_hold_are_named(tmp_path: Path) -> None:
    rows = [{"question": f"{i}+1?", "answer": i + 1} for i in range(5)]
    task = ArithmeticTask()
    tokenizer = grpo_gym.build_char_tokenizer()  # an object with no folder or hub name
    env = grpo_gym.R1ZeroEnv(
        **{**ENV_KWARGS, "task": "dataset"},
        task_kwargs={"data": rows * 10_000, "prompt": "question"},  # too large to record
        tokenizer=tokenizer,
    )
    record = env.describe()
    assert set(record["needs"]) == {"tokenizer", "task_kwargs.data"}
    assert record["kwargs"]["task_kwargs"]["prompt"] == "question"
    with pytest.raises(ValueError, match=r"tokenizer=\.\.\., task_kwargs=\{'data': \.\.\.\}"):
        roundtrip(env)
    rebuilt = roundtrip(env, tokenizer=tokenizer, task_kwargs={"data": rows})
    assert len(rebuilt.task) == 5 and rebuilt.task.columns.prompt == "question"
    assert grpo_gym.R1ZeroEnv(**ENV_KWARGS, task=task).describe()["needs"] == ["task"]
    tokenizer.save_pretrained(tmp_path / "tok")
    from_folder = grpo_gym.R1ZeroEnv(**ENV_KWARGS, tokenizer=str(tmp_path / "tok"))
    assert from_folder.describe()["kwargs"]["tokenizer"] == str(tmp_path / "tok")
    same_episode(from_folder, roundtrip(from_folder))


class RecordedTask(ArithmeticTask):
    name = "recorded"


def test_registered_task_is_recorded_by_path_and_imported_only_when_loaded(monkeypatch) -> None:
    from grpo_gym.tasks import register_task, unregister_task

    register_task("recorded_task", RecordedTask)
    try:
        env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, task="recorded_task")
        record = env.describe()
        assert record["kwargs"]["task"] == f"{__name__}:RecordedTask" and record["needs"] == []
        assert type(roundtrip(env).task) is RecordedTask
        record["kwargs"]["task"] = "some_module_never_imported:Task"
        with pytest.raises(ValueError, match="import some_module_never_imported first"):
            env_kwargs_from_record(record)
        assert "some_module_never_imported" not in sys.modules
        with pytest.raises(ValueError, match="not an env record"):
            env_kwargs_from_record({"format": "other"})
        with pytest.raises(ValueError, match="unknown env argument 'colour'"):
            env_kwargs_from_record(env.describe(), colour="red")
    finally:
        unregister_task("recorded_task")


def test_a_list_of_reward_functions_is_recorded_by_name_and_passed_back_as_a_list_or_paths() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs=[accuracy])
    record = env.describe()
    assert record["kwargs"]["reward_funcs"] == {"accuracy": MUST_PASS}
    with pytest.raises(ValueError, match=r"on the command line: --reward-funcs accuracy=<module>:<function>"):
        roundtrip(env)
    same_episode(env, roundtrip(env, reward_funcs=[accuracy]))
    same_episode(env, roundtrip(env, reward_funcs=[f"{__name__}:accuracy"]))  # named by you: imported
    with pytest.raises(ValueError, match=r"names \['accuracy'\] too \(\['brevity'\] given\)"):
        roundtrip(env, reward_funcs=[brevity])
