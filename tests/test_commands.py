"""``grpo-gym distill``, ``quantize`` and ``serve`` on the command line (the server itself: tests/test_server.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli import main
from algorithms.deploy.commands import size_on_disk
from algorithms.deploy.loading import load_policy
from algorithms.deploy.quantize import int8_layers
from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE
from tests.sizes import ENV_KWARGS, TINY
from tests.test_cli import table_rows, write_config

STUDENT = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1}  # fmt: skip


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "teacher.zip"
    GRPO("TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs=TINY, seed=0).save(path)
    return path


def test_distill_saves_the_student_and_prints_the_table(
    teacher: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    save = tmp_path / "out" / "student.zip"
    argv = ["distill", "--teacher", str(teacher), "--student", json.dumps(STUDENT), "--steps", "2"]
    argv += ["--batch-size", "4", "--int8-qat", "--save-path", str(save), "--n", "4", "--no-progress-bar"]
    assert main([*argv, "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert [(label, n) for label, _, n in table_rows(out)] == [("teacher", 4), ("student", 4), ("student int8", 4)]
    for path in (save, save.with_suffix(""), tmp_path / "out" / "student-int8"):
        assert path.exists() and f"MiB  {path}" in out
    assert size_on_disk(tmp_path / "out" / "student-int8") < size_on_disk(save.with_suffix(""))
    assert GRPO.load(save).policy.model.config.hidden_size == 24


def test_quantize_writes_the_int8_export(teacher: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["quantize", str(teacher), "--save-path", str(tmp_path / "int8")]) == 0
    policy, tokenizer = load_policy(tmp_path / "int8")
    assert int8_layers(policy.model) and len(tokenizer) == BUILTIN_VOCAB_SIZE
    out = capsys.readouterr().out
    assert f"MiB  {tmp_path / 'int8'} ({len(int8_layers(policy.model))} INT8 layers)" in out
    with pytest.raises(SystemExit):  # an INT8 export is not quantised twice
        main(["quantize", str(tmp_path / "int8"), "--save-path", str(tmp_path / "again")])
    assert "INT8 export already" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["distill", "--teacher", "missing.zip", "--student", "tiny", "--steps", "1"], "does not exist"),
        (["distill", "--teacher", "t.zip", "--student", "{oops"], "--student: not valid JSON"),
        (["serve", "missing-model"], "does not exist"),
    ],
)
def test_errors_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([*argv, *(["--config", str(write_config(tmp_path))] if argv[0] == "distill" else [])])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_distill_never_writes_over_existing_outputs_unless_told(
    teacher: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "config.json").write_text("{}")  # someone's model folder where the student would go
    argv = ["distill", "--teacher", str(teacher), "--student", json.dumps(STUDENT), "--steps", "1", "--n", "2"]
    argv += ["--batch-size", "2", "--save-path", str(tmp_path / "student.zip"), "--no-progress-bar"]
    argv += ["--config", str(write_config(tmp_path))]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "is a folder that is not empty" in capsys.readouterr().err
    assert (tmp_path / "student" / "config.json").read_text() == "{}" and not (tmp_path / "student.zip").exists()
    assert main([*argv, "--overwrite"]) == 0
    assert GRPO.load(tmp_path / "student.zip").policy.model.config.hidden_size == 24
    (tmp_path / "student").rename(tmp_path / "moved")
    with pytest.raises(SystemExit):  # the folder moved away, the zip is still there
        main(argv)
    assert "student.zip' exists; choose a new name, or pass --overwrite" in capsys.readouterr().err
