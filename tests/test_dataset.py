"""The ``dataset`` task: a ``datasets.Dataset``, a list of dicts, .jsonl/.json/.csv/.parquet files; the column
mapping, every column reaching reward functions, the eval split, and the errors."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

import grpo_gym
from grpo_gym.tasks import DatasetTask, make_task
from tests.sizes import ENV_KWARGS

ROWS = [
    {"question": "What is 2+2?", "final": "4", "steps": "2+2=4", "level": 0.2, "topic": "sums"},
    {"question": "Capital of France?", "final": "Paris", "steps": None, "level": 0.5, "topic": "places"},
    {"question": "Half of 3?", "final": "1.5", "steps": "3/2=1.5", "level": 0.9, "topic": "fractions"},
]
MAPPING = {"prompt": "question", "answer": "final", "solution": "steps", "difficulty": "level"}


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` in the format ``path``'s suffix names."""
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def all_problems(task: DatasetTask, difficulty: float = 1.0) -> dict[str, grpo_gym.Problem]:
    rng = np.random.default_rng(0)
    return {p.prompt: p for p in (task.sample(difficulty, rng) for _ in range(100))}


@pytest.mark.parametrize("form", ["dataset", "list", ".jsonl", ".json", ".csv", ".parquet"])
def test_every_form_gives_the_same_problems(tmp_path: Path, form: str) -> None:
    if form == "dataset":
        data: Any = Dataset.from_list(ROWS)
    elif form == "list":
        data = ROWS
    else:
        data = write(tmp_path / f"rows{form}", ROWS)
    task = make_task("dataset", data=data, **MAPPING)
    problems = all_problems(task)
    assert sorted(problems) == sorted(r["question"] for r in ROWS)
    paris = problems["Capital of France?"]
    assert (paris.answer, paris.solution, paris.metadata["row_difficulty"]) == ("Paris", None, 0.5)
    assert problems["What is 2+2?"].answer == "4" and task.solution(problems["Half of 3?"]) == ("3/2=1.5", "1.5")
    assert set(all_problems(task, 0.5)) == {"What is 2+2?", "Capital of France?"}  # rows graded by "level"
    assert task.missing_solutions == 1
    assert DatasetTask([{"prompt": "x", "answer": 4}]).rows[0].answer == "4"  # numbers are kept as their text


def test_dataset_json_lines_file_as_written_by_datasets(tmp_path: Path) -> None:
    Dataset.from_list(ROWS).to_json(tmp_path / "rows.json")  # JSON lines, in a .json file
    task = DatasetTask(tmp_path / "rows.json", **MAPPING)
    assert len(task) == 3


def test_every_column_reaches_reward_functions_as_trl_passes_them() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts, completions, question, final, topic, **kwargs):
        seen.update(kwargs, question=question, final=final, topic=topic)
        return [float(str(f) in c) for c, f in zip(completions, final, strict=True)]

    env = grpo_gym.R1ZeroEnv(
        **{**ENV_KWARGS, "task": "dataset", "max_new_tokens": 32},
        task_kwargs={"data": Dataset.from_list(ROWS), **MAPPING},
        reward_funcs={"spy": spy},
    )
    problem = all_problems(env.task)["Capital of France?"]
    env.reset(options={"problem": problem})
    info = env.step(env.encode_action("<think>France</think><answer>Paris</answer>"))[4]
    assert info["reward_components"]["spy"] == 1.0 and info["is_success"]
    assert info["reward_components"]["consistency"] is None  # a text answer: not applicable
    assert seen["question"] == ["Capital of France?"] and seen["final"] == ["Paris"] and seen["topic"] == ["places"]
    assert seen["steps"] == [None] and seen["level"] == [0.5]
    assert seen["answer"] == ["Paris"] and seen["difficulty"] == [problem.difficulty]  # added: no such columns
    assert "prompt" not in seen and env.get_state()  # problems stay JSON data


def test_eval_split_is_used_for_held_out_problems(tmp_path: Path) -> None:
    eval_rows = [
        {"question": f"{i}+{i}?", "final": 2 * i, "steps": None, "level": 0.1 * (1 + i % 9)} for i in range(30)
    ]
    task = DatasetTask(ROWS, **MAPPING, eval_data=write(tmp_path / "eval.parquet", eval_rows))
    assert task.eval_source == "eval split" and len(task.eval_rows) == 30
    easy = task.eval_problems(100, 0.2)
    assert sorted(p.prompt for p in easy) == sorted(r["question"] for r in eval_rows if r["level"] <= 0.2 + 1e-9)
    picked = task.eval_problems(5, 1.0, seed=0)
    assert len(picked) == 5 and picked == task.eval_problems(5, 1.0, seed=0) != task.eval_problems(5, 1.0, seed=1)
    assert all(p.difficulty == 1.0 and p.prompt not in {r["question"] for r in ROWS} for p in picked)
    no_split = DatasetTask(ROWS, **MAPPING)
    with pytest.warns(UserWarning, match="no eval split: its held-out problems are drawn from the training rows"):
        drawn = no_split.eval_problems(4, 1.0)
    assert no_split.eval_source == "training rows" and {p.prompt for p in drawn} <= {r["question"] for r in ROWS}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per task
        no_split.eval_problems(4, 1.0)


@pytest.mark.parametrize(
    ("data", "kwargs", "message"),
    [
        (ROWS, {"prompt": "prompt"}, "data row 1: no column 'prompt' (the prompt= column); its columns: question"),
        (ROWS, {"prompt": "question", "answer": "answer"}, "no column 'answer' (the answer= column)"),
        ([{"q": "", "a": "1"}], {"prompt": "q", "answer": "a"}, "data row 1: the prompt column 'q' must hold"),
        ([{"q": "x", "a": None}], {"prompt": "q", "answer": "a"}, "the answer column 'a' must hold"),
        ([{"q": "x", "a": [1]}], {"prompt": "q", "answer": "a"}, "the answer column 'a' must hold"),
        ([{"q": "x", "a": "1", "s": 3}], {"prompt": "q", "answer": "a", "solution": "s"}, "solution column 's'"),
        ([{"q": "x", "a": "1", "d": 2.0}], {"prompt": "q", "answer": "a", "difficulty": "d"}, "in [0.1, 1]"),
        ([{"q": "x", "a": "1", "d": "hard"}], {"prompt": "q", "answer": "a", "difficulty": "d"}, "must hold numbers"),
        (["x"], {}, "data row 1: each row must be a dict"),
        ([], {}, "data: no rows"),
        (42, {}, "data must be a datasets.Dataset, a list of dicts"),
        ("rows.txt", {}, "unknown format '.txt'"),
        ("absent.jsonl", {}, "no file at 'absent.jsonl'"),
        (ROWS, {"prompt": ""}, "prompt must be a column name"),
        (ROWS, {"solution": 3}, "solution must be a column name or None"),
    ],
)
def test_bad_data_is_refused_naming_the_row_and_column(data: Any, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        DatasetTask(data, **kwargs)
    assert message in str(info.value)


def test_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: no column 'answer'"):
        DatasetTask(path)
    (tmp_path / "rows.json").write_text('{"prompt": "a", "answer": ')
    with pytest.raises(ValueError, match=r"rows\.json: not valid JSON"):
        DatasetTask(tmp_path / "rows.json")
    with pytest.raises(ValueError, match=r"DatasetDict.*pass one split: data=ds\['train'\]"):
        DatasetTask(DatasetDict({"train": Dataset.from_list(ROWS)}))
    with pytest.raises(ValueError, match="eval_data row 1: no column 'question'"):
        DatasetTask(ROWS, **MAPPING, eval_data=[{"prompt": "x", "answer": "1"}])


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    path = write(tmp_path / "rows.parquet", ROWS)
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match=r"pip install 'grpo-gym\[datasets\]'"):
        DatasetTask(path, **MAPPING)


# ---------------------------------------------------------------------------------------------- conversational
SYSTEM = "Answer in <think></think><answer></answer> tags."
CHAT_ROWS = [
    {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + 1?"}],
     "solution": str(a + 1)}
    for a in range(6)
]  # fmt: skip
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_tokenizer_folder(tmp_path: Path) -> Path:
    """A real tokenizer with a chat template, saved and read back as a folder: the built-in one plus a template."""
    tokenizer = grpo_gym.build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "chat-tokenizer")
    return tmp_path / "chat-tokenizer"


def accuracy(completions, solution, **kwargs):
    """A TRL reward function for conversational data: completions are [{"role": "assistant", "content": ...}]."""
    return [
        float(c[0]["content"].endswith(f"<answer>{s}</answer>")) for c, s in zip(completions, solution, strict=True)
    ]


def think_format(completions, **kwargs):
    return [float(c[0]["content"].startswith("<think>")) for c in completions]


def conversational_env(tokenizer: Any = None, **kwargs: Any) -> grpo_gym.R1ZeroEnv:
    task_kwargs = {"data": Dataset.from_list(CHAT_ROWS), "answer": "solution"}
    kwargs = {**ENV_KWARGS, "task": "dataset", "max_new_tokens": 32, "tokenizer": tokenizer, **kwargs}
    return grpo_gym.R1ZeroEnv(**kwargs, task_kwargs=task_kwargs, reward_funcs=[accuracy, think_format])


def test_conversational_prompts_without_a_chat_template_use_the_plain_layout() -> None:
    env = conversational_env()
    assert env.tokenizer.chat_template is None and env.task.conversational
    obs, info = env.reset(seed=0)
    problem = info["problem"]
    question = problem.prompt
    assert question.startswith("What is ") and problem.prompt_input == CHAT_ROWS[int(question.split()[2])]["prompt"]
    assert info["prompt"] == f"{SYSTEM}\nUser: {question}\nAssistant: "  # the templates' plain layout
    shown = obs["input_ids"][obs["attention_mask"] == 1]
    assert env.codec.decode(shown) == info["prompt"]
    instructions = grpo_gym.templates.R1ZERO_INSTRUCTIONS
    for template, messages in (
        ("compact", [{"role": "user", "content": "q?"}]),
        ("r1zero", [{"role": "system", "content": instructions}, {"role": "user", "content": "q?"}]),
    ):
        assert env.formatter.prompt(messages) == grpo_gym.templates.TEMPLATES[template].format(prompt="q?")


def test_conversational_prompts_with_a_chat_template_and_trl_reward_functions(tmp_path: Path) -> None:
    env = conversational_env(tokenizer=chat_tokenizer_folder(tmp_path))
    obs, info = env.reset(seed=0)
    problem = info["problem"]
    expected = env.tokenizer.apply_chat_template(problem.prompt_input, tokenize=False, add_generation_prompt=True)
    assert info["prompt"] == expected == f"<|system|>{SYSTEM}\n<|user|>{problem.prompt}\n<|assistant|>"
    assert env.codec.decode(obs["input_ids"][obs["attention_mask"] == 1]) == expected
    _, reward, *_, info = env.step(env.encode_action(f"<think>add one</think><answer>{problem.answer}</answer>"))
    components = info["reward_components"]
    assert (components["accuracy"], components["think_format"]) == (1.0, 1.0) and info["is_success"]
    assert reward == pytest.approx(0.3 + 0.3 + 2.0)  # syntax, task, and the two functions: no clip
    gold, _ = env.encode_example(problem.prompt_input, "")
    assert env.codec.decode(gold) == expected  # what evaluation and the cold start show the model
    assert not grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, "tokenizer": env.tokenizer}, use_chat_template=False).formatter.chat


def test_reward_functions_get_trls_conversational_forms() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    env = grpo_gym.R1ZeroEnv(
        **{**ENV_KWARGS, "task": "dataset", "max_new_tokens": 32},
        task_kwargs={"data": CHAT_ROWS, "answer": "solution"},
        reward_funcs=[spy],
    )
    _, info = env.reset(seed=0)
    env.step(env.encode_action("<answer>1</answer>"))
    assert seen["prompts"] == [info["problem"].prompt_input]  # the messages, as TRL passes them
    assert seen["completions"] == [[{"role": "assistant", "content": "<answer>1</answer>"}]]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "got an empty list"),
        ([{"content": "hi"}], "message 0 has no role"),
        ([{"role": "user", "content": [{"type": "image"}]}], "must hold text content, got list"),
        ([{"role": "user", "content": " "}], "every message is empty"),
    ],
)
def test_bad_conversations_are_refused(prompt: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DatasetTask([{"prompt": prompt, "answer": 1}])


def test_rows_mixing_strings_and_conversations_are_refused() -> None:
    with pytest.raises(ValueError, match="data row 2: its prompt is a string but the first row's is a conversation"):
        DatasetTask([CHAT_ROWS[0], {"prompt": "plain?", "solution": "1"}], answer="solution")
