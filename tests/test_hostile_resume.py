"""``--resume`` from checkpoints that lie about themselves (algorithms/common/saving/checkpoints.py, issue 37): the
newest checkpoint's model.zip deleted (the run goes on from the newest complete one, and says so), a run.json with a
non-number, nested past reading or of the wrong shape (the file, the key and the fix named, on one line), a damaged
model.zip (the way to the checkpoint before it named)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from algorithms.cli import main
from algorithms.common.saving.checkpoints import checkpoints, read_run_json, resume_point
from tests.test_resume import write_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A run of 3 iterations with a checkpoint after each (the newest 2 kept), to copy and damage."""
    folder = tmp_path_factory.mktemp("run")
    config = write_config(folder, n_timesteps=24)
    run = ["train", "--config", str(config), "--checkpoint-every", "1", "--save-path", str(folder / "m.zip")]
    assert main([*run, "--no-progress-bar", "-params", "eval_problems:2"]) == 0
    return folder, run


def copied(finished: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    source, run = finished
    shutil.copytree(source / "m_checkpoints", tmp_path / "m_checkpoints")
    shutil.copy(source / "grpo.yml", tmp_path / "grpo.yml")
    argv = [arg.replace(str(source), str(tmp_path)) for arg in run]
    return tmp_path / "m_checkpoints", [*argv, "--resume", "--no-progress-bar", "-params", "eval_problems:2"]


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_resume_without_the_newest_model_zip_goes_on_from_the_one_before_and_says_so(
    finished, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """It named the missing file and stopped, though the checkpoint before it was whole."""
    directory, argv = copied(finished, tmp_path)
    older, newest = checkpoints(directory)
    (newest / "model.zip").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"--resume: skipped {newest}: it has no model.zip" in out
    assert f"resuming from {older}, the newest complete checkpoint" in out and "after GRPO" in out


def test_resume_without_a_run_json_says_which_checkpoint_it_skipped(finished, tmp_path: Path, capsys) -> None:
    """The newest was skipped without a word."""
    directory, argv = copied(finished, tmp_path)
    newest = checkpoints(directory)[-1]
    (newest / "run.json").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    assert f"--resume: skipped {newest}: it has no run.json" in capsys.readouterr().out


def test_resume_with_no_complete_checkpoint_names_each_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "iteration_0000003").mkdir()
    (tmp_path / "iteration_0000003" / "run.json").write_text("{}")
    with pytest.raises(
        ValueError, match=r"no complete checkpoint in .*iteration_0000003: it has no model\.zip.*without"
    ):
        resume_point(tmp_path)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda run: run.update(total_timesteps="24k"), r"'total_timesteps' must be an integer >= 1 .*got '24k'"),
        (lambda run: run.update(total_timesteps=None), r"'total_timesteps' must be an integer >= 1"),
        (lambda run: run.update(total_timesteps=True), r"'total_timesteps' must be an integer >= 1"),
        (lambda run: run.update(total_timesteps=-3), r"'total_timesteps' must be an integer >= 1"),
        (lambda run: run.update(before=[{"difficulty": "easy"}]), r"'before' must be the held-out results"),
        (lambda run: run.update(before={"a": 1}), r"'before' must be the held-out results"),
    ],
)
def test_a_run_json_with_a_value_of_the_wrong_kind_names_the_file_the_key_and_the_fix(
    finished, tmp_path: Path, capsys: pytest.CaptureFixture, edit, words: str
) -> None:
    """'24k' gave "invalid literal for int() with base 10: '24k'"; a malformed 'before' a TypeError traceback after
    the whole run had trained."""
    directory, argv = copied(finished, tmp_path)
    path = checkpoints(directory)[-1] / "run.json"
    run = json.loads(path.read_text())
    edit(run)
    path.write_text(json.dumps(run))
    err = one_line_error(argv, capsys)
    assert (
        str(path) in err and re.search(words, err) and "move" in err and "to resume from the checkpoint before" in err
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested deeper than 100 levels"),
        ('"just a string"', "must hold a JSON object, got str"),
        ("{not json", r"not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
)
def test_a_run_json_that_is_not_a_run_names_the_file(tmp_path: Path, content: Any, words: str) -> None:
    folder = tmp_path / "iteration_0000001"
    folder.mkdir()
    (folder / "run.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=words) as refusal:
        read_run_json(folder)
    assert str(folder / "run.json") in str(refusal.value)


def test_a_damaged_model_zip_names_the_checkpoint_before_it(finished, tmp_path: Path, capsys) -> None:
    directory, argv = copied(finished, tmp_path)
    newest = checkpoints(directory)[-1]
    (newest / "model.zip").write_bytes((newest / "model.zip").read_bytes()[:3000])
    err = one_line_error(argv, capsys)
    assert "truncated or corrupt" in err and f"or move {str(newest)!r} away to resume from the one before" in err


def test_a_run_json_without_before_trains_and_reports_none(finished, tmp_path: Path, capsys) -> None:
    """Hostile round four: it trained the whole run, saved, then died with KeyError: 'before'."""
    directory, argv = copied(finished, tmp_path)
    path = checkpoints(directory)[-1] / "run.json"
    run = json.loads(path.read_text())
    del run["before"]
    path.write_text(json.dumps(run))
    capsys.readouterr()
    assert main(argv) == 0
    assert "after GRPO" in capsys.readouterr().out


@pytest.fixture(scope="module")
def started_with_env_params(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A run started with ``-params env_kwargs:{...}`` (its env differs from the config's), its newest checkpoint
    deleted so that resuming has an iteration to train."""
    folder = tmp_path_factory.mktemp("run")
    config = write_config(folder, n_timesteps=24)
    argv = ["train", "--config", str(config), "--checkpoint-every", "1", "--save-path", str(folder / "m.zip"),
            "--no-progress-bar", "-params", "eval_problems:2", "env_kwargs:{'max_new_tokens': 20}"]  # fmt: skip
    assert main(argv) == 0
    shutil.rmtree(checkpoints(folder / "m_checkpoints")[-1])
    return folder, [*argv, "--resume"]


@pytest.mark.parametrize("again", [True, False], ids=["same-params", "without-them"])
def test_a_run_started_with_env_params_resumes_with_or_without_them(
    started_with_env_params, tmp_path: Path, capsys, again: bool
) -> None:
    """Hostile round four: the same -params were refused ("not a saved setting") and without them the env's
    spaces differed from the run's. Now the env is the one the checkpoint records."""
    source, argv = started_with_env_params
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    argv = [arg.replace(str(source), str(tmp_path)) for arg in argv]
    if not again:
        argv.remove("env_kwargs:{'max_new_tokens': 20}")
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "after GRPO" in out
    assert ("-params taken: eval_problems, env_kwargs" in out) == again


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (["-params", "env_kwargs:{'max_new_tokens': 32}"], r"env_kwargs.max_new_tokens:32 \(saved: 20\)"),
        (["--difficulty", "0.5"], r"env_kwargs.difficulty:0.5 \(saved: 0.3\)"),
        (["-params", "env_kwargs:{'bogus': 1}"], "env_kwargs.bogus:1 \\(saved: 'not an env argument'\\)"),
    ],
    ids=["other-value", "flag", "unknown"],
)
def test_a_changed_env_setting_on_resume_is_refused_naming_it(started_with_env_params, capsys, change, words) -> None:
    """Nothing is written: the refusal comes before any work."""
    _, argv = started_with_env_params
    argv = [arg for arg in argv if not arg.startswith("env_kwargs:")] + change
    assert re.search(words, one_line_error(argv, capsys))


def test_resume_takes_the_settings_dict_the_run_was_started_with() -> None:
    """-params cold_start_kwargs:{'steps': 50} was compared with the whole saved dict (the preset's keys merged in)
    and the same command line was refused on resume (found by examples/resume_after_crash.py); a key given with
    another value is still refused, naming it."""
    from algorithms.cli_options import resumed_params

    saved = {"cold_start_kwargs": {"steps": 50, "batch_size": 32, "learning_rate": 1e-3, "data": None}, "n_groups": 4}
    assert resumed_params(["cold_start_kwargs:{'steps': 50}", "n_groups:4"], saved, {"total_timesteps": 64}) == []
    with pytest.raises(ValueError, match=r"cold_start_kwargs:\{'steps': 60\} \(saved: \{'steps': 50"):
        resumed_params(["cold_start_kwargs:{'steps': 60}"], saved, {"total_timesteps": 64})
    with pytest.raises(ValueError, match=r"n_groups:8 \(saved: 4\)"):
        resumed_params(["n_groups:8"], saved, {"total_timesteps": 64})


def test_a_run_json_with_pass_at_k_results_reads_back_and_a_bad_count_is_refused(tmp_path: Path) -> None:
    """``eval_samples`` adds the pass@k fields to the results a checkpoint's run.json records before GRPO."""
    folder = tmp_path / "iteration_0000001"
    folder.mkdir()
    row = {"difficulty": 0.3, "n_problems": 4, "success_rate": 0.25, "mean_reward": 0.5, "mean_length": 9.0,
           "source": "new seeds", "samples": 4, "sampled_success": 0.375, "pass_at_k": 0.75}  # fmt: skip
    (folder / "run.json").write_text(json.dumps({"total_timesteps": 8, "before": [row, {**row, "samples": 0,
                                     "sampled_success": None, "pass_at_k": None}]}))  # fmt: skip
    assert read_run_json(folder)["before"][0]["pass_at_k"] == 0.75
    (folder / "run.json").write_text(json.dumps({"total_timesteps": 8, "before": [{**row, "samples": -1}]}))
    with pytest.raises(ValueError, match="'before' must be the held-out results"):
        read_run_json(folder)
