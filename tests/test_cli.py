"""The ``grpo-gym`` command: train, sft, eval and env-demo in-process on a tiny config, errors, and --help."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms import GRPO
from algorithms.cli import build_parser, main

CONFIG = {
    "R1Zero-v0": {
        "n_timesteps": 16,
        "n_groups": 2,
        "group_size": 4,
        "cold_start_kwargs": {"steps": 3, "batch_size": 4},
        "eval_problems": 4,
        "policy_kwargs": {
            "model": "tiny",
            "model_kwargs": {
                "num_hidden_layers": 1,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
            },
        },
        "env_kwargs": {"template": "compact", "max_new_tokens": 24, "context_length": 256, "difficulty": 0.1},
    }
}
ROW = re.compile(
    r"^(?P<label>.+?)\s+(?P<difficulty>\d\.\d\d)\s+(?P<n>\d+)\s+(?P<success>[\d.]+%)\s+(?P<reward>-?[\d.]+)"
)


def write_config(folder: Path) -> Path:
    path = folder / "grpo.yml"
    path.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    return path


def table_rows(text: str) -> list[tuple[str, float, int]]:
    """``(label, difficulty, problems)`` of every line of the tables printed in ``text``."""
    rows = []
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            rows.append((match["label"].strip(), float(match["difficulty"]), int(match["n"])))
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One ``grpo-gym train`` run: ``(folder, config, stdout)``."""
    folder = tmp_path_factory.mktemp("train")
    config = write_config(folder)
    out = io.StringIO()
    argv = [
        "train",
        "--config",
        str(config),
        "--save-path",
        str(folder / "m.zip"),
        "--tensorboard-log",
        str(folder / "tb x"),
    ]  # the progress bar on (the default): output to a StringIO, so progress lines
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return folder, config, out.getvalue()


def test_train_prints_tables_and_the_tensorboard_line(trained: tuple[Path, Path, str]) -> None:
    folder, _, out = trained
    assert "cold start: 3 SFT steps" in out
    assert "GRPO: 16 completions" in out
    rows = table_rows(out)
    labels = [label for label, _, _ in rows]
    assert "before GRPO" in labels and "after GRPO" in labels
    assert all(difficulty == 0.1 and n == 4 for _, difficulty, n in rows)  # the env's level, eval_problems
    assert "held-out success at difficulty 0.10:" in out and "percentage points" in out
    assert f"saved to {folder / 'm.zip'}" in out
    checkpoints = folder / "m_checkpoints"
    assert f"the model goes to {folder / 'm.zip'}; checkpoints (every 50 iterations, the newest 2 kept) go to " in out
    assert f"checkpoints: {checkpoints}" in out
    assert "cold start (SFT steps): 3/3 (100%)" in out  # progress as lines: the output is not a terminal
    assert "GRPO: 8/16 (50%)" in out and "GRPO: 16/16 (100%)" in out
    assert out.rstrip().splitlines()[-1] == f"tensorboard --logdir '{folder / 'tb x'}'"  # pasted into a shell as it is


def test_train_saves_a_loadable_model(trained: tuple[Path, Path, str]) -> None:
    folder, _, _ = trained
    model = GRPO.load(folder / "m.zip")
    assert model.num_timesteps == 16  # two iterations of 2 groups x 4 completions
    assert model._cold_start_done and model.sft_steps == 3
    assert model.n_groups == 2 and model.group_size == 4
    assert model.policy.model.config.hidden_size == 32


def test_train_writes_one_run_with_sft_and_grpo(trained: tuple[Path, Path, str]) -> None:
    folder, _, _ = trained
    runs = sorted(p.name for p in (folder / "tb x").iterdir())
    assert runs == ["GRPO_1"]  # the cold start and GRPO log to the same run
    events = EventAccumulator(str(folder / "tb x" / "GRPO_1")).Reload()
    assert [e.step for e in events.Scalars("sft/loss")] == [3]
    assert [e.step for e in events.Scalars("train/loss")] == [8, 16]


def test_the_docs_tensorboard_list_names_tags_the_run_writes(trained: tuple[Path, Path, str]) -> None:
    folder, _, _ = trained
    text = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "tensorboard.md").read_text(encoding="utf-8")
    listed = text[text.index("<!-- tensorboard-tags:") : text.index("<!-- tensorboard-tags end -->")]
    tags = set(re.findall(r"`((?:rollout|train|time|sft|samples|precision)/[a-z_/]+)`", listed))
    tags = (tags - {"rollout/reward/accuracy"}) | {"rollout/reward/task"}  # <name>: a function's, a built-in's
    events = EventAccumulator(str(folder / "tb x" / "GRPO_1")).Reload().Tags()
    texts = {tag.removesuffix("/text_summary") for tag in events["tensors"]}  # SB3 writes text as a tensor
    written = set(events["scalars"]) | set(events["histograms"]) | texts
    assert len(tags) > 25 and tags <= written, sorted(tags - written)


def test_eval_needs_only_the_model_file(trained: tuple[Path, Path, str], capsys: pytest.CaptureFixture) -> None:
    """The zip records its env (id and arguments): eval rebuilds it, whatever the default config's env is."""
    folder, config, _ = trained
    argv = ["eval", str(folder / "m.zip"), "--difficulty", "0.1", "--n", "4", "--greedy"]
    assert main(argv) == 0
    recorded = capsys.readouterr().out
    assert table_rows(recorded) == [("m", 0.1, 4)]
    assert main([*argv, "--config", str(config)]) == 0  # the training config gives the same env: the same table
    assert capsys.readouterr().out == recorded


def test_eval_prints_a_row_per_difficulty(trained: tuple[Path, Path, str], capsys: pytest.CaptureFixture) -> None:
    folder, config, _ = trained
    argv = ["eval", str(folder / "m.zip"), "--config", str(config), "--difficulty", "0.1", "0.2", "--n", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = ["policy", "difficulty", "problems", "success", "reward", "length", "source"]
    assert out.splitlines()[0].split() == header
    assert table_rows(out) == [("m", 0.1, 4), ("m", 0.2, 4)]
    assert all(line.endswith("new seeds") for line in out.splitlines()[1:3])
    # same model, same eval seed: the same table (sampling is seeded)
    assert main([*argv, "--greedy"]) == 0
    greedy = capsys.readouterr().out
    assert main([*argv, "--greedy"]) == 0
    assert capsys.readouterr().out == greedy


def test_eval_samples_prints_pass_at_k_beside_greedy(trained: tuple[Path, Path, str], capsys) -> None:
    folder, _, _ = trained
    assert main(["eval", str(folder / "m.zip"), "--difficulty", "0.1", "--n", "4", "--samples", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["policy", "difficulty", "problems", "greedy", "sampled", "pass@3"]
    greedy, sampled, at_k = (float(cell.rstrip("%")) for cell in lines[1].split()[3:6])
    assert at_k >= sampled and at_k >= 0
    assert main(["eval", str(folder / "m.zip"), "--difficulty", "0.1", "--n", "4", "--greedy"]) == 0
    assert float(capsys.readouterr().out.splitlines()[1].split()[3].rstrip("%")) == greedy  # the greedy success


def test_sft_saves_a_cold_started_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path)
    assert main(["sft", "--config", str(config), "--save-path", str(tmp_path / "s.zip")]) == 0
    out = capsys.readouterr().out
    assert table_rows(out) == [("after SFT", 0.1, 4)]
    assert f"saved to {tmp_path / 's.zip'}" in out
    model = GRPO.load(tmp_path / "s.zip")
    assert model._cold_start_done and model.num_timesteps == 0


def test_hyperparams_override_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path)
    argv = [
        "sft",
        "--config",
        str(config),
        "--save-path",
        str(tmp_path / "s.zip"),
        "-params",
        "cold_start_kwargs:{'steps': 1}",
    ]
    assert main([*argv, "n_groups=1", "beta:0.0"]) == 0
    capsys.readouterr()
    model = GRPO.load(tmp_path / "s.zip")
    assert model.sft_steps == 1 and model.n_groups == 1 and model.beta == 0.0


def test_env_demo_prints_a_gold_completion_with_full_reward(capsys: pytest.CaptureFixture) -> None:
    assert main(["env-demo", "--difficulty", "0.2", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "=== gold completion ===" in out and "=== random completion ===" in out
    gold = out.split("=== random completion ===")[0]
    assert "--- reward 1.000" in gold and "success True" in gold
    assert "<think>" in gold and "</answer>" in gold


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--preset", "nope"], r"no entry 'R1Zero-v0-nope'.*\['R1Zero-v0'\]"),
        (["--env", "Missing-v0"], "no entry 'Missing-v0'"),
        (["-params", "learning_rate"], "key:value"),
    ],
)
def test_bad_config_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], match: str
) -> None:
    config = write_config(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(config), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-gym train: error: ")
    assert re.search(match, err), err
    assert "Traceback" not in err


def test_a_run_refused_at_setup_leaves_no_checkpoint_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "ck"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(write_config(tmp_path)), "--checkpoint-dir", str(folder), "-params", "nope:1"])
    assert exit_info.value.code == 2 and "nope" in capsys.readouterr().err
    assert not folder.exists()


def test_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(tmp_path / "m.zip"), "--config", str(tmp_path / "nope.yml")])
    err = capsys.readouterr().err  # both are missing: the model file is read first
    assert exit_info.value.code == 2 and "no model file at" in err and "m.zip" in err


def test_eval_with_an_env_that_does_not_fit_the_model_exits_2(
    trained: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, _, _ = trained
    other = {"R1Zero-v0": {**CONFIG["R1Zero-v0"], "env_kwargs": {"context_length": 512}}}
    config = tmp_path / "other.yml"
    config.write_text(yaml.safe_dump(other), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(folder / "m.zip"), "--config", str(config), "--n", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-gym eval: error: ") and "spaces do not match" in err.lower()


def test_the_resume_line_pastes_into_a_shell() -> None:
    import shlex

    from algorithms.cli_options import resume_hint

    argv = ["train", "--save-path", "my run.zip", "-params", "policy_kwargs:{'model': 'tiny'}", "--resume"]
    hint = resume_hint(argv)
    assert hint.startswith("resume with: grpo-gym train ")
    assert shlex.split(hint.removeprefix("resume with: ")) == ["grpo-gym", *argv]


def test_the_demo_preset_saves_its_model() -> None:
    from algorithms.cli import preset_save_path

    assert preset_save_path(build_parser().parse_args(["train", "--preset", "demo"])) == "demo.zip"
    assert preset_save_path(build_parser().parse_args(["train", "--preset", "demo", "--save-path", "x.zip"])) == "x.zip"
    assert preset_save_path(build_parser().parse_args(["train"])) is None  # checkpoints in ./checkpoints, said so


def exact(prompts, completions, answer, **kwargs):
    return [float(c.endswith(f"<answer>{a}</answer>")) for c, a in zip(completions, answer, strict=True)]


def test_eval_of_a_run_made_in_python_names_its_reward_functions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import gymnasium as gym

    env_kwargs = CONFIG["R1Zero-v0"]["env_kwargs"]
    env = gym.make("R1Zero-v0", **env_kwargs, reward_funcs=[exact])
    GRPO("TransformerPolicy", env, seed=0, policy_kwargs=CONFIG["R1Zero-v0"]["policy_kwargs"]).save(tmp_path / "r.zip")
    argv = ["eval", str(tmp_path / "r.zip"), "--difficulty", "0.1", "--n", "2"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "--reward-funcs exact=<module>:<function>" in capsys.readouterr().err
    assert main([*argv, "--reward-funcs", f"{__name__}:exact"]) == 0  # named on the command line: imported
    assert table_rows(capsys.readouterr().out) == [("r", 0.1, 2)]
    assert main([*argv, "--reward-funcs", f"exact={__name__}:exact"]) == 0
    capsys.readouterr()
    for spec, words in (("nosuch:fn", "cannot import 'nosuch'"), ("os:nosuchfn", "'os' has no 'nosuchfn'"),
                        ("nocolon", "must look like 'package.module:name'")):  # fmt: skip
        with pytest.raises(SystemExit):  # a list-form value: its own clear error, not a crash
            main([*argv, "--reward-funcs", spec])
        assert words in capsys.readouterr().err


def test_parser_defaults() -> None:
    args = build_parser().parse_args(["train"])
    assert args.config.endswith(os.path.join("zoo_configs", "grpo.yml")) and Path(args.config).is_file()
    assert args.env == "R1Zero-v0" and args.preset is None and args.progress_bar is True
    assert build_parser().parse_args(["eval", "m.zip"]).difficulty == [0.1, 0.3, 0.5]
    with pytest.raises(SystemExit):
        build_parser().parse_args([])  # a command is required


def test_help_in_a_subprocess() -> None:
    script = Path(sys.executable).with_name("grpo-gym")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "algorithms.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: grpo-gym")
    for name in ("train", "sft", "eval", "env-demo"):
        assert name in result.stdout


def test_eval_data_is_the_held_out_split(trained: tuple[Path, Path, str], capsys: pytest.CaptureFixture) -> None:
    import json

    folder, _, _ = trained
    train, held_out = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("\n".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) for i in range(9)))
    held_out.write_text("\n".join(json.dumps({"prompt": f"{i}+2?", "answer": str(i + 2)}) for i in range(3)))
    config = yaml.safe_load(yaml.safe_dump(CONFIG))
    config["R1Zero-v0"]["env_kwargs"].update(task="jsonl", task_kwargs={"path": str(train)})
    path = folder / "jsonl.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    argv = ["eval", str(folder / "m.zip"), "--config", str(path), "--difficulty", "0.1", "--n", "50"]
    assert main([*argv, "--eval-data", str(held_out)]) == 0
    out = capsys.readouterr().out
    assert table_rows(out) == [("m", 0.1, 3)] and out.splitlines()[1].endswith("eval split")
    with pytest.warns(UserWarning, match="no eval split"):
        assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("training rows")


def test_tasks_lists_the_tasks_and_reasoning_gym(capsys: pytest.CaptureFixture) -> None:
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert {"arithmetic", "countdown", "dataset", "jsonl"} <= {line.strip() for line in out.splitlines()}
    assert re.search(r"reasoning_gym:chain_sum\s+num_terms \(11 levels\), num_digits \(10 levels\)", out)
    assert re.search(r"reasoning_gym:gsm_symbolic\s+fixed", out)


def test_train_with_algo_ppo_saves_an_lmppo_model_that_eval_reads(tmp_path: Path) -> None:
    from algorithms import LMPPO

    config = write_config(tmp_path)
    out = io.StringIO()
    argv = ["train", "--algo", "ppo", "--config", str(config), "--save-path", str(tmp_path / "p.zip"), "-n", "16",
            "--checkpoint-every", "1"]  # fmt: skip
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--no-progress-bar", "-params", "n_epochs:1"]) == 0
    assert "LMPPO: 16 completions" in out.getvalue()
    model = LMPPO.load(tmp_path / "p.zip")
    assert model.num_timesteps == 16 and model.n_epochs == 1 and model.policy.value_net is not None
    with contextlib.redirect_stdout(io.StringIO()) as table:
        assert main(["eval", str(tmp_path / "p.zip"), "--algo", "ppo", "--config", str(config), "--n", "4"]) == 0
    assert [label for label, _, _ in table_rows(table.getvalue())] == ["p"] * 3
    with contextlib.redirect_stdout(io.StringIO()) as again:  # without --algo: the class the zip records
        assert main(["eval", str(tmp_path / "p.zip"), "--config", str(config), "--n", "4"]) == 0
    assert again.getvalue() == table.getvalue()
    assert build_parser().parse_args(["train", "--algo", "ppo"]).algo == "ppo"
    resume = ["train", "--config", str(config), "--save-path", str(tmp_path / "p.zip"), "--resume"]
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:  # without --algo ppo
        main(resume)
    assert "is a LMPPO run: resume it with --algo ppo" in err.getvalue()


def test_eval_every_prints_and_logs_held_out_success_along_the_way(tmp_path: Path) -> None:
    """``--eval-every 1``: a held-out line per iteration boundary, ``eval/success_rate`` in TensorBoard, the
    evaluations' time reported apart from GRPO's; ``eval_greedy`` evaluates greedily."""
    config = write_config(tmp_path)
    out = io.StringIO()
    argv = ["train", "--config", str(config), "-n", "24", "--eval-every", "1", "--no-progress-bar",
            "--tensorboard-log", str(tmp_path / "tb"), "-params", "eval_greedy:True", "eval_samples:2"]  # fmt: skip
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    text = out.getvalue()
    pattern = r"^iteration (\d) \(GRPO \d+ s\): held-out success [\d.]+% \(greedy; sampled [\d.]+%, pass@2 [\d.]+%\)"
    lines = re.findall(pattern + r" at 0\.10$", text, re.MULTILINE)
    assert lines == ["1", "2"]  # at the boundaries after iterations 1 and 2; the third's is the final table
    assert re.search(r"held-out evaluations along the way: \d+ s\)", text) and "GRPO iterations: 3" in text
    events = EventAccumulator(str(tmp_path / "tb" / "GRPO_1")).Reload()
    assert len(events.Scalars("eval/success_rate")) == 2 and "time/eval_seconds" in events.Tags()["scalars"]
    at_k, sampled = events.Scalars("eval/pass_at_k"), events.Scalars("eval/sampled_success")
    assert len(at_k) == 2 and all(a.value >= s.value for a, s in zip(at_k, sampled, strict=True))
    assert "pass@2" in text.split("after GRPO")[0]  # the before/after tables show it too
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "-params", "eval_greedy:1"])  # refused: not a bool
