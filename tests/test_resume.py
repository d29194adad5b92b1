"""Crash-safe runs (algorithms/common/saving/checkpoints.py and ``grpo-gym train``): checkpoints, --resume, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch as th
import yaml

from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.saving.checkpoints import (
    check_writable_dir,
    check_writable_file,
    latest_checkpoint,
    read_run_json,
    write_checkpoint,
)
from tests.test_cli import CONFIG
from tests.test_state import make_model

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoints_keep_the_newest_two_and_ignore_partial_writes(tmp_path: Path) -> None:
    model = make_model(
        cold_start=False,
        controls_kwargs={"replay_ratio": 0.25},
    )
    for _ in range(3):
        model.learn(8, reset_num_timesteps=False)
        write_checkpoint(model, tmp_path, {"total_timesteps": 64})
    killed = tmp_path / ".iteration_0000009.999999999.0badc0de.tmp"  # a write killed half-way (its process gone)
    killed.mkdir()
    (tmp_path / "iteration_0000010").mkdir()  # a folder without run.json: not a checkpoint
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("iteration_") and (p / "run.json").exists())
    assert names == ["iteration_0000002", "iteration_0000003"]
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and newest.name == "iteration_0000003"
    assert read_run_json(newest) == {"total_timesteps": 64, "iteration": 3}
    assert {p.name for p in newest.iterdir()} == {"model.zip", "replay.npz", "run.json"}
    write_checkpoint(model, tmp_path, {"total_timesteps": 64})  # cleans the partial write up
    assert not killed.exists()
    assert latest_checkpoint(tmp_path / "missing") is None


def test_unwritable_paths_are_found_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot write"):
        check_writable_file(tmp_path / "file" / "model.zip")
    with pytest.raises(ValueError, match="is a folder"):
        check_writable_file(".")
    with pytest.raises(ValueError, match="is a folder"):
        check_writable_file(f"{tmp_path}{os.sep}")
    (tmp_path / "run.zip").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        check_writable_file(tmp_path / "run")
    (tmp_path / "R1Zero-v0").mkdir()  # SB3's rule, which rl_zoo3 relies on: a folder's name gets .zip beside it
    assert check_writable_file(tmp_path / "R1Zero-v0") == tmp_path / "R1Zero-v0.zip"
    with pytest.raises(ValueError, match="cannot write"):
        check_writable_dir("/proc/grpo-gym-checkpoints")
    assert check_writable_file(tmp_path / "sub" / "m") == tmp_path / "sub" / "m.zip"


def write_config(folder: Path, n_timesteps: int = 32) -> Path:
    config = {"R1Zero-v0": {**CONFIG["R1Zero-v0"], "n_timesteps": n_timesteps, "mixed_precision": "no"}}
    path = folder / "grpo.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "save_path",
    [".", "{tmp}/file/m.zip", "/proc/m.zip"],
)
def test_cli_refuses_an_unwritable_save_path_at_once(tmp_path: Path, capsys, save_path: str) -> None:
    (tmp_path / "file").write_text("x")
    config = write_config(tmp_path)
    started = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(config), "--save-path", save_path.format(tmp=tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-gym train: error: --save-path") and "Traceback" not in err
    assert time.perf_counter() - started < 30  # found before the cold start and training (generous bound)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "algorithms.cli", "train", "--no-progress-bar", *args]


def wait_for_checkpoint(directory: Path, process: subprocess.Popen, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = latest_checkpoint(directory)
        if found is not None:
            return found
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError("no checkpoint was written")


def same_weights(a: Path, b: Path, n_timesteps: int) -> None:
    first, second = GRPO.load(a), GRPO.load(b)
    for p, q in zip(first.policy.parameters(), second.policy.parameters(), strict=True):
        assert th.equal(p, q)
    assert first.num_timesteps == second.num_timesteps == n_timesteps


def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    # 8 iterations: the kill lands after the first checkpoint with 7 left to run, however late a loaded machine
    # wakes this test (with 4, the run once ended before the kill on a busy 2-core machine)
    config = write_config(tmp_path, n_timesteps=64)
    common = ["--config", str(config), "--checkpoint-every", "1", "--seed", "3"]
    whole = subprocess.run(
        cli(*common, "--save-path", str(tmp_path / "whole.zip")), cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert whole.returncode == 0, whole.stderr
    run = [*common, "--save-path", str(tmp_path / "part.zip")]
    process = subprocess.Popen(cli(*run), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_checkpoint(tmp_path / "part_checkpoints", process)
    process.kill()
    process.communicate()
    assert not (tmp_path / "part.zip").exists()
    resumed = subprocess.run(cli(*run, "--resume"), cwd=ROOT, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "before GRPO" in resumed.stdout and "after GRPO" in resumed.stdout
    same_weights(tmp_path / "whole.zip", tmp_path / "part.zip", n_timesteps=64)


@pytest.mark.parametrize("number,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_leaves_a_resumable_checkpoint(tmp_path: Path, number: int, code: int) -> None:
    config = write_config(tmp_path, n_timesteps=80)
    run = ["--config", str(config), "--checkpoint-every", "2", "--save-path", str(tmp_path / "m.zip")]
    process = subprocess.Popen(cli(*run), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(tmp_path / "m_checkpoints", process)
    os.kill(process.pid, number)
    out, err = process.communicate(timeout=300)
    assert process.returncode == code, err
    assert "resume with: grpo-gym train" in out and "--resume" in out
    assert "Traceback" not in err
    newest = latest_checkpoint(tmp_path / "m_checkpoints")
    assert newest is not None
    resumed = subprocess.run(cli(*run, "--resume"), cwd=ROOT, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert GRPO.load(tmp_path / "m.zip").num_timesteps == 80


@pytest.mark.parametrize("save_path", ["", ".zip", "   "])
def test_a_save_path_that_is_no_file_name_is_refused_before_any_work(tmp_path: Path, capsys, save_path: str) -> None:
    config = write_config(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(config), "--save-path", save_path])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--save-path" in err and "file name" in err and "Traceback" not in err


@pytest.mark.parametrize("number,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_cold_start_stops_within_seconds(tmp_path: Path, number: int, code: int) -> None:
    config = write_config(tmp_path)
    run = [
        "--config",
        str(config),
        "--save-path",
        str(tmp_path / "m.zip"),
        "-params",
        "cold_start_kwargs:{'steps': 100000}",
    ]
    process = subprocess.Popen(cli(*run), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(600, process.kill)  # a run that never reaches its cold start fails, never hangs
    watchdog.start()
    lines = [process.stdout.readline()]
    while "cold start" not in lines[-1]:  # wait until the cold start has begun (line by line: it prints few)
        assert process.poll() is None and lines[-1], lines
        lines.append(process.stdout.readline())
    time.sleep(1.0)
    os.kill(process.pid, number)
    signalled = time.monotonic()
    _, err = process.communicate(timeout=120)
    stopped_after = time.monotonic() - signalled
    watchdog.cancel()
    assert process.returncode == code, err
    assert "stopped before training started" in err and "no checkpoint was written yet" in err
    assert "start again with: grpo-gym train" in err and "--resume" not in err and "Traceback" not in err
    assert stopped_after < 60, stopped_after  # (the run would take hours: it stopped at once; a loose bound)
    assert latest_checkpoint(tmp_path / "m_checkpoints") is None


def test_after_a_stop_the_hint_resumes_only_when_a_checkpoint_exists(tmp_path: Path) -> None:
    from algorithms.cli_options import next_step

    argv = ["train", "--config", "my config.yml", "--resume"]
    assert (
        next_step(tmp_path, argv)
        == "no checkpoint was written yet; start again with: grpo-gym train --config 'my config.yml'"
    )
    (tmp_path / "iteration_0000002").mkdir()
    (tmp_path / "iteration_0000002" / "run.json").write_text("{}")
    (tmp_path / "iteration_0000002" / "model.zip").write_text("")
    assert next_step(tmp_path, argv) == "resume with: grpo-gym train --config 'my config.yml' --resume"


def test_resume_refuses_changed_params_and_says_which_it_takes(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    run = ["train", "--config", str(config), "--checkpoint-every", "1", "--save-path", str(tmp_path / "m.zip")]
    assert main([*run, "--no-progress-bar", "-params", "n_timesteps:16"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*run, "--resume", "-params", "learning_rate:0.5", "n_timesteps:16"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--resume continues the saved run with its own settings" in err and "learning_rate:0.5" in err
    assert main([*run, "--resume", "--no-progress-bar", "-params", "n_timesteps:16", "eval_problems:3"]) == 0
    assert "-params taken: eval_problems" in capsys.readouterr().out


def test_resume_of_an_earlier_versions_checkpoint_reads_its_retired_arguments_as_today(tmp_path: Path) -> None:
    """A checkpoint written before ``drop_uniform_groups`` retired records it: ``--resume`` compares ``-params`` with
    what it stands for today (``dynamic_sampling=True, max_resample_rounds=0``), so giving that is no change."""
    from tests.test_hostile_files import with_data

    config = write_config(tmp_path)
    run = ["train", "--config", str(config), "--checkpoint-every", "1", "--save-path", str(tmp_path / "m.zip")]
    assert main([*run, "--no-progress-bar", "-params", "n_timesteps:16"]) == 0
    newest = latest_checkpoint(tmp_path / "m_checkpoints")
    assert newest is not None

    def as_before(data: dict) -> None:
        data["arguments"].update(drop_uniform_groups=True)
        del data["arguments"]["dynamic_sampling"], data["arguments"]["max_resample_rounds"]

    with_data(newest / "model.zip", tmp_path / "old.zip", as_before)
    os.replace(tmp_path / "old.zip", newest / "model.zip")
    today = ["-params", "n_timesteps:16", "dynamic_sampling:True", "max_resample_rounds:0"]
    assert main([*run, "--resume", "--no-progress-bar", *today]) == 0
    model = GRPO.load(tmp_path / "m.zip")
    assert (model.dynamic_sampling, model.max_resample_rounds, model.num_timesteps) == (True, 0, 16)
