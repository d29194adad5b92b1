"""Config files, JSON flags and data files that are not what they say (algorithms/common/hyperparams.py, the
commands' JSON flags, grpo_gym/tasks/, issue 37): each ends in one line naming the file (or flag), the key and the
fix, before any work: never a traceback, never a run that builds a hundred million envs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from algorithms.cli import main
from grpo_gym.tasks import make_task

DEEP = "[" * 100_000 + "]" * 100_000


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("R1Zero-v0: {a: [", "is not valid YAML at line 1, column 17: expected the node content"),
        ('!!python/object/apply:os.system ["echo pwned"]\n', "is not valid YAML at line 1, column 1: could not"),
        ("R1Zero-v0: [1, 2]\n", "the entry 'R1Zero-v0' must be a mapping of hyperparameters"),
        (
            "R1Zero-v0: 5\n",
            "the entry 'R1Zero-v0' must be a mapping of hyperparameters (n_timesteps: ...,",
        ),
        ("- R1Zero-v0\n", "must map env ids to hyperparameters, got a list"),
        (b"\xff\xfeR1Zero-v0:\n", "is not UTF-8 text"),
        (
            "R1Zero-v0:\n  n_groups: 2\n  learning_rate: 1.0e-5\n  n_groups: 8\n",
            "at line 4, column 3: the key 'n_groups' is written twice (only the last would count); keep one",
        ),
        ("R1Zero-v0: 1\nR1Zero-v0: 2\n", "at line 2, column 1: the key 'R1Zero-v0' is written twice"),
        ("R1Zero-v0: " + "[" * 50_000 + "]" * 50_000 + "\n", "nests lists or mappings too deeply to read"),
    ],
)
def test_a_config_file_that_is_not_a_config_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | bytes, words: str
) -> None:
    """PyYAML's ParserError or ConstructorError traceback, a TypeError traceback for an entry that is not a mapping,
    "'utf-8' codec can't decode" without the file, a RecursionError traceback, before; a key written twice was read
    as its last value without a word."""
    path = tmp_path / "grpo.yml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = one_line_error(["sft", "--config", str(path)], capsys)
    assert str(path) in err and words in err


def test_a_folder_given_as_the_config_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "grpo.yml").mkdir()
    assert "cannot be read (Is a directory)" in one_line_error(["sft", "--config", str(tmp_path / "grpo.yml")], capsys)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("n_timesteps", "abc", "n_timesteps must be an integer >= 1, got 'abc'"),
        ("n_timesteps", ".nan", "n_timesteps must be an integer >= 1, got nan"),
        ("n_envs", "abc", "n_envs must be an integer in [1, 4096]"),
        ("n_envs", "100000000", "n_envs must be an integer in [1, 4096], got 100000000"),
        ("eval_problems", "0", "eval_problems must be an integer >= 1"),
        ("eval_difficulties", "0.5", "eval_difficulties must be a list of difficulties, e.g. [0.1, 0.5], got 0.5"),
        ("eval_difficulties", "[5.0]", "eval_difficulties must be a finite number in [0.1, 1], got 5.0"),
        ("policy", "MlpPolicy", "policy must be 'TransformerPolicy', got 'MlpPolicy'"),
        ("save_path", "5", "save_path must be a file name such as model.zip, got 5"),
        ("learning_rate", "lin_abc", "'lin_abc' is not a lin_<x> schedule; write e.g. lin_1.0e-5"),
    ],
)
def test_a_run_key_of_the_wrong_kind_is_named_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, key: str, value: str, words: str
) -> None:
    """'abc' gave "invalid literal for int()", NaN "cannot convert float NaN to integer", n_envs 1e8 built envs until
    it was killed, eval_difficulties 0.5 a TypeError traceback after the cold start, MlpPolicy SB3's "Policy
    MlpPolicy unknown"."""
    path = tmp_path / "grpo.yml"
    path.write_text(f"R1Zero-v0:\n  {key}: {value}\n", encoding="utf-8")
    err = one_line_error(["sft", "--config", str(path)], capsys)
    assert words in err


def test_a_misspelt_env_kwargs_key_in_a_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A TypeError traceback (gymnasium's, with every argument after it) before."""
    path = tmp_path / "grpo.yml"
    path.write_text("R1Zero-v0:\n  env_kwargs:\n    max_new_token: 5\n", encoding="utf-8")
    err = one_line_error(["sft", "--config", str(path)], capsys)
    assert "unexpected keyword argument 'max_new_token'; did you mean max_new_tokens?" in err


def test_a_long_params_value_is_cut_in_the_message(capsys: pytest.CaptureFixture) -> None:
    value = '{"a":' * 300 + "1" + "}" * 300
    err = one_line_error(["sft", "-params", f"policy_kwargs:{value}"], capsys)
    assert "is not a Python dict literal" in err and len(err) < 600


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["openenv-serve", "--env-kwargs", DEEP], "--env-kwargs: JSON nested deeper than 100 levels"),
        (["openenv-serve", "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object of R1ZeroEnv arguments"),
        (["distill", "--teacher", "x", "--student", '{"a":' * 5000 + "1" + "}" * 5000], "--student: JSON nested"),
    ],
)
def test_a_json_flag_nested_past_reading_or_misspelt_is_one_line(argv, words: str, capsys) -> None:
    """RecursionError tracebacks before; --env-kwargs with a misspelt key a TypeError traceback."""
    assert words in one_line_error(argv, capsys)


def test_a_misspelt_env_kwargs_key_of_openenv_serve_is_one_line(capsys: pytest.CaptureFixture) -> None:
    """A TypeError traceback before; the env is built (and refused) before the server starts."""
    pytest.importorskip("openenv")
    argv = ["openenv-serve", "--port", "0", "--env-kwargs", '{"max_new_token": 5}']
    assert "did you mean max_new_tokens" in one_line_error(argv, capsys)


def test_a_student_config_file_nested_past_reading_is_named(tmp_path: Path) -> None:
    from algorithms.deploy.distill import student_policy_kwargs

    path = tmp_path / "student.json"
    path.write_text(DEEP, encoding="utf-8")
    with pytest.raises(ValueError, match=r"student config .*student\.json.*nested deeper than 100 levels"):
        student_policy_kwargs(str(path))


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_data_file_nested_past_reading_names_the_file(tmp_path: Path, suffix: str) -> None:
    """A .json file nested 100,000 levels raised RecursionError; a row nested 800 levels (which json reads) raised
    it later, while the row was converted."""
    for depth, words in ((100_000, "nested too deeply"), (800, "nested deeper than 100 levels")):
        row = '{"prompt": "p", "answer": "1", "x": ' + "[" * depth + "]" * depth + "}"
        path = tmp_path / f"rows{suffix}"
        path.write_text(f"[{row}]" if suffix == ".json" else row + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=words) as refusal:
            make_task("dataset", data=str(path))
        assert str(path) in str(refusal.value)


def test_a_row_nested_past_reading_in_python_data_names_the_row() -> None:
    """A RecursionError traceback from deep in the row's conversion before, for a value nested 5000 levels and for
    a list that holds itself."""
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    cycle: list = [1]
    cycle.append(cycle)
    for value in (deep, cycle):
        with pytest.raises(ValueError, match=r"data row 2: a value nested deeper than 100 levels .*flatten the col"):
            make_task("dataset", data=[{"prompt": "p", "answer": "1"}, {"prompt": "q", "answer": "2", "tree": value}])


@pytest.mark.parametrize("task", ["dataset", "jsonl"])
def test_a_5000_digit_number_in_a_data_file_names_the_line(tmp_path: Path, task: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "p", "answer": "1"}) + '\n{"prompt": "q", "answer": ' + "9" * 5000 + "}\n")
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: not valid JSON \(a number longer than 4300 digits\)"):
        make_task(task, **({"data": str(path)} if task == "dataset" else {"path": str(path)}))
