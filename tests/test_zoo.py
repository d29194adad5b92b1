"""``grpo-gym zoo``: rl_zoo3's own train with GRPO registered (algorithms/zoo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from algorithms import GRPO
from algorithms.cli import main
from algorithms.zoo import SEARCH_SPACE, sample_grpo_params, with_defaults

TINY = (
    "policy_kwargs:dict(model='tiny', model_kwargs=dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64,"
    " num_attention_heads=2, num_key_value_heads=1))"
)


def test_zoo_train_runs_and_saves_a_grpo_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["zoo", "train", "-n", "16", "--seed", "0", "-f", str(tmp_path / "logs"), "--eval-freq", "-1"]
    assert main([*argv, "-params", "cold_start_kwargs:{'steps': 2}", "n_groups:2", "group_size:4", TINY]) == 0
    (saved,) = (tmp_path / "logs" / "grpo").glob("R1Zero-v0_*/R1Zero-v0.zip")
    model = GRPO.load(saved)
    assert model.num_timesteps == 16 and model.n_groups == 2


def test_defaults_are_added_only_where_missing() -> None:
    argv = with_defaults(["-n", "8"])
    assert argv[:2] == ["-n", "8"] and "--algo" in argv and "grpo" in argv and "R1Zero-v0" in argv
    assert argv[argv.index("--conf-file") + 1].endswith("grpo.yml")
    mine = with_defaults(["--algo", "grpo", "--env", "Other-v0", "-conf", "my.yml"])
    assert mine == ["--algo", "grpo", "--env", "Other-v0", "-conf", "my.yml"]


def test_the_search_space_sampler_draws_every_hyperparameter() -> None:
    optuna = pytest.importorskip("optuna")
    trial = optuna.trial.FixedTrial({"learning_rate": 1e-5, **{k: v[0] for k, v in SEARCH_SPACE.items()}})
    params = sample_grpo_params(trial, 0, 1, {})
    assert params["learning_rate"] == 1e-5 and set(params) == {"learning_rate", *SEARCH_SPACE}


def test_zoo_needs_the_train_command(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["zoo", "enjoy"])
    assert exit_info.value.code == 2 and "grpo-gym zoo train" in capsys.readouterr().err
