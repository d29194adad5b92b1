"""zoo_configs/grpo.yml and the rl-zoo3 style hyperparameter reader: values, presets, overrides, schedules."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from algorithms import GRPO, TransformerPolicy
from algorithms.common.hyperparams import (
    DEFAULT_CONFIG,
    RUN_KEYS,
    check_keys,
    load_hyperparams,
    parse_overrides,
    parse_value,
    preset_key,
)
from algorithms.common.model.loading import is_builtin_model
from tests.sizes import TINY_KWARGS

# what `grpo-gym train` takes out of a preset before the rest goes to GRPO(...) (see algorithms/cli.py)
NOT_GRPO_ARGUMENTS = RUN_KEYS


def write_config(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def all_presets() -> list[tuple[str, str | None]]:
    """``(env_id, preset)`` of every top-level key of the shipped file."""
    with DEFAULT_CONFIG.open(encoding="utf-8") as handle:
        keys = list(yaml.safe_load(handle))
    env_ids = [k for k in keys if not any(k.startswith(f"{other}-") for other in keys if other != k)]
    presets = []
    for key in keys:
        env_id = next(e for e in env_ids if key == e or key.startswith(f"{e}-"))
        presets.append((env_id, None if key == env_id else key[len(env_id) + 1 :]))
    return presets


def test_default_config_is_the_shipped_file() -> None:
    assert DEFAULT_CONFIG.name == "grpo.yml" and DEFAULT_CONFIG.parent.name == "zoo_configs"
    assert DEFAULT_CONFIG.is_file()


def test_seed_preset_values() -> None:
    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "seed")
    assert config["n_groups"] == 4
    assert config["group_size"] == 8
    assert config["max_grad_norm"] == 0.5
    assert config["cold_start_kwargs"]["steps"] == 5000
    assert config["policy_kwargs"]["top_p"] == 0.92
    assert config["env_kwargs"]["difficulty"] == 0.3
    assert isinstance(config["learning_rate"], float) and config["learning_rate"] == 1e-5
    assert config["beta"] == 0.04 and config["clip_range"] == 0.2
    assert config["policy"] == "TransformerPolicy"
    assert config["n_timesteps"] == 100_000


def test_default_preset_is_grpos_own_defaults() -> None:
    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0")
    assert set(config) == {"n_timesteps", "policy"}  # what rl-zoo3 requires; every GRPO argument at its default
    assert config["policy"] == "TransformerPolicy"


def test_unknown_keys_name_the_closest_valid_one() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'n_group' \(did you mean 'n_groups'\?\); valid keys: a"):
        check_keys({"n_group": 8}, {"n_groups", "group_size", "advantage_scale"}, "c.yml")


@pytest.mark.parametrize(("env_id", "preset"), all_presets())
def test_every_preset_builds_a_grpo_model(env_id: str, preset: str | None) -> None:
    config = load_hyperparams(DEFAULT_CONFIG, env_id, preset)
    extra = {k: config.pop(k) for k in NOT_GRPO_ARGUMENTS if k in config}
    policy_kwargs = dict(config.pop("policy_kwargs", {}))
    policy_params = set(inspect.signature(TransformerPolicy.__init__).parameters) - {"self"}
    assert set(policy_kwargs) <= policy_params, set(policy_kwargs) - policy_params
    n_envs = int(extra.get("n_envs", 1))
    env = make_vec_env(env_id, n_envs=n_envs, env_kwargs=extra.get("env_kwargs", {}), vec_env_cls=DummyVecEnv)
    builtin = is_builtin_model(policy_kwargs.get("model", "tiny"))
    if builtin:  # the preset's own architecture family, shrunk
        policy_kwargs["model_kwargs"] = {**policy_kwargs.get("model_kwargs", {}), **TINY_KWARGS}
    model = GRPO(
        extra.get("policy", "TransformerPolicy"),
        env,
        policy_kwargs=policy_kwargs,
        _init_setup_model=builtin,  # a hub checkpoint cannot be fetched offline: check the arguments only
        **config,
    )
    assert model.n_groups * model.group_size % n_envs == 0
    if builtin:
        assert model.policy.top_p == policy_kwargs.get("top_p", 0.92)


def test_preset_key() -> None:
    for default in (None, "", "default"):
        assert preset_key("R1Zero-v0", default) == "R1Zero-v0"
    assert preset_key("R1Zero-v0", "demo") == "R1Zero-v0-demo"
    assert preset_key("R1Zero-v0", "seed") == "R1Zero-v0-seed"  # the seed's recipe, not the --seed flag


def test_parse_overrides() -> None:
    overrides = parse_overrides(["learning_rate:1e-5", "n_groups=8", "policy_kwargs:{'top_p': 1.0}"])
    assert overrides == {"learning_rate": 1e-5, "n_groups": 8, "policy_kwargs": {"top_p": 1.0}}
    assert isinstance(overrides["learning_rate"], float) and isinstance(overrides["n_groups"], int)
    assert parse_overrides([" clip_range : 0.1 ", "policy:TransformerPolicy"]) == {
        "clip_range": 0.1,
        "policy": "TransformerPolicy",  # not a literal: kept as a string
    }
    assert parse_overrides([]) == {}
    assert parse_value("True") is True and parse_value("None") is None and parse_value("lin_1e-3") == "lin_1e-3"


def test_parse_overrides_equals_form_with_a_dict_value() -> None:
    assert parse_overrides(["policy_kwargs={'top_p': 1.0}"]) == {"policy_kwargs": {"top_p": 1.0}}


@pytest.mark.parametrize("item", ["learning_rate", ":1e-5", "=8"])
def test_parse_overrides_rejects_items_without_key_value(item: str) -> None:
    with pytest.raises(ValueError, match="key:value"):
        parse_overrides([item])


def test_overrides_replace_the_file_values(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yml", "R1Zero-v0:\n  n_groups: 4\n  learning_rate: !!float 1.0e-5\n")
    config = load_hyperparams(path, "R1Zero-v0", overrides=parse_overrides(["n_groups:8", "learning_rate:3e-4"]))
    assert config["n_groups"] == 8 and config["learning_rate"] == 3e-4
    assert config["n_timesteps"] == 10_000  # the default when the preset has none


def test_linear_schedule(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yml", "R1Zero-v0:\n  learning_rate: lin_1.0e-3\n  clip_range: lin_0.2\n")
    config = load_hyperparams(path, "R1Zero-v0")
    learning_rate, clip_range = config["learning_rate"], config["clip_range"]
    assert callable(learning_rate) and callable(clip_range)
    assert learning_rate(1.0) == pytest.approx(1e-3)  # SB3 progress_remaining: 1 at the start
    assert learning_rate(0.5) == pytest.approx(5e-4)
    assert learning_rate(0.0) == pytest.approx(0.0)
    assert clip_range(1.0) == pytest.approx(0.2) and clip_range(0.25) == pytest.approx(0.05)
    # an override written on the command line works the same way
    overridden = load_hyperparams(path, "R1Zero-v0", overrides=parse_overrides(["learning_rate:lin_2e-3"]))
    assert overridden["learning_rate"](1.0) == pytest.approx(2e-3)


def test_float_written_without_a_dot_is_an_error_that_says_how_to_write_it(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yml", "R1Zero-v0:\n  learning_rate: 1e-5\n")
    with open(path, encoding="utf-8") as handle:
        assert yaml.safe_load(handle)["R1Zero-v0"]["learning_rate"] == "1e-5"  # YAML 1.1 reads a string
    with pytest.raises(ValueError, match=r"learning_rate.*1\.0e-5"):
        load_hyperparams(path, "R1Zero-v0")


def test_policy_kwargs_string_is_a_python_literal(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yml", "R1Zero-v0:\n  policy_kwargs: \"{'model': 'tiny', 'top_p': 0.5}\"\n")
    assert load_hyperparams(path, "R1Zero-v0")["policy_kwargs"] == {"model": "tiny", "top_p": 0.5}


def test_unknown_preset_lists_the_available_ones(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "c.yml",
        "R1Zero-v0:\n  n_groups: 4\nR1Zero-v0-demo:\n  n_groups: 2\nOther-v0:\n  n_groups: 1\n",
    )
    assert load_hyperparams(path, "R1Zero-v0", "demo")["n_groups"] == 2
    with pytest.raises(ValueError, match=r"no entry 'R1Zero-v0-nope'.*\['R1Zero-v0', 'R1Zero-v0-demo'\]"):
        load_hyperparams(path, "R1Zero-v0", "nope")
    with pytest.raises(ValueError, match="no entry 'Missing-v0'"):
        load_hyperparams(path, "Missing-v0")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not exist.*--config"):
        load_hyperparams(tmp_path / "nope.yml", "R1Zero-v0")


def test_empty_file_has_no_entries(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yml", "# nothing yet\n")
    with pytest.raises(ValueError, match=r"no entry 'R1Zero-v0'.*\[\]"):
        load_hyperparams(path, "R1Zero-v0")


@pytest.mark.parametrize("line", ["beta: 4e-2", "sft_learning_rate: 1e-3"])
def test_other_floats_written_without_a_dot_are_errors_too(tmp_path: Path, line: str) -> None:
    path = write_config(tmp_path / "c.yml", f"R1Zero-v0:\n  {line}\n")
    with pytest.raises(ValueError, match=r"1\.0e-"):
        load_hyperparams(path, "R1Zero-v0")
