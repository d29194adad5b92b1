"""TRL's names and ours: the table covers every field of TRL's GRPOConfig, its equivalents exist, the constructors'
hints name them, and the docs (docs/guides/from-trl.md) hold the table as the module writes it."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import gymnasium as gym
import pytest

import grpo_gym
from algorithms import GRPO, LMPPO, TransformerPolicy
from algorithms.common.advantages import ADVANTAGE_SCALES
from algorithms.common.losses import AGGREGATION_MODES, IMPORTANCE_LEVELS
from algorithms.common.trl_names import GRPO_CONFIG, REMOVED, TRAINER_ARGUMENTS, TRL_NAMES, readme_section
from grpo_gym.trl_names import ENV_NAMES

trl = pytest.importorskip("trl")
FROM_TRL = Path(__file__).resolve().parent.parent / "docs" / "guides" / "from-trl.md"


def parameters(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_every_grpo_config_field_has_an_entry_and_no_entry_is_stale() -> None:
    fields = [spec.name for spec in dataclasses.fields(trl.GRPOConfig)]
    assert sorted(GRPO_CONFIG) == sorted(fields)  # trl 1.16's 191 fields, each with ours or a reason
    assert parameters(trl.GRPOTrainer.__init__) >= set(TRAINER_ARGUMENTS)
    assert not set(REMOVED) & set(fields)  # names TRL removed are not fields any more


def test_the_envs_names_are_the_tables_own_entries() -> None:
    """The env's TRL names (grpo_gym.trl_names, which the env reads) are the table's entries whose equivalent is the
    env's: one entry for each, in one place."""
    assert {name: entry for name, entry in TRL_NAMES.items() if entry.where == "env"} == ENV_NAMES
    assert all(TRL_NAMES[name] is entry for name, entry in ENV_NAMES.items())


def test_every_equivalent_exists_where_the_table_says() -> None:
    where = {
        "arg": parameters(GRPO.__init__),
        "env": parameters(grpo_gym.R1ZeroEnv.__init__),
        "policy": parameters(TransformerPolicy.__init__),
    }
    for name, entry in TRL_NAMES.items():
        if entry.where in where:
            assert str(entry.ours).split(".")[0] in where[entry.where], name
        if entry.lmppo is not None:
            assert entry.lmppo in parameters(LMPPO.__init__), name
    for name, valid in (
        ("loss_type", AGGREGATION_MODES),
        ("scale_rewards", ADVANTAGE_SCALES),
        ("bf16", ("bf16",)),
        ("fp16", ("fp16",)),
    ):
        assert set(TRL_NAMES[name].values.values()) <= set(valid), name
    assert set(IMPORTANCE_LEVELS) == {"token", "sequence"}  # TRL's importance_sampling_level values, same names


@pytest.mark.parametrize("algorithm", [GRPO, LMPPO])
def test_a_trl_name_raises_a_type_error_naming_ours(algorithm: type) -> None:
    """Every TRL name the constructor does not take: a TypeError with TRL's name and our equivalent (or none)."""
    accepted = parameters(algorithm.__init__)
    for name, entry in TRL_NAMES.items():
        if name in accepted:
            continue
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}', TRL's name") as error:
            algorithm("TransformerPolicy", None, **{name: 1})
        message = str(error.value)
        if entry.where in ("arg", "env", "policy"):
            ours = entry.lmppo if algorithm is LMPPO and entry.lmppo else str(entry.ours).split(".")[-1]
            assert ours in message, message
        elif entry.where == "none":
            assert "no equivalent" in message and entry.note in message
    hints = {
        "num_generations": "ours is group_size=...",
        "max_completion_length": 'ours is gym.make("R1Zero-v0", max_new_tokens=...)',
        "epsilon": "ours is clip_range=...",
        "num_iterations": "ours is n_epochs=...",
        "temperature": 'ours is policy_kwargs={"temperature": ...}',
        "per_device_train_batch_size": "ours is batch_size=...",
        "train_dataset": 'ours is gym.make("R1Zero-v0", task_kwargs=...)',
        "report_to": "ours is tensorboard_log=...",
        "use_vllm": "ours is rollout_engine=...",
        "vllm_group_port": "we have no equivalent",
    }
    for name, hint in hints.items():
        with pytest.raises(TypeError, match=rf"{name}'.*{hint.replace('(', '.').replace(')', '.')}"):
            algorithm("TransformerPolicy", None, **{name: 1})


def test_other_unknown_names_get_the_closest_of_ours() -> None:
    with pytest.raises(TypeError, match=r"'n_group'; did you mean n_groups\?"):
        GRPO("TransformerPolicy", None, n_group=4)
    with pytest.raises(TypeError, match=r"LMPPO\(\).*'beta', TRL's name: ours is kl_coef=\.\.\.$"):
        LMPPO("TransformerPolicy", None, beta=0.1)


def test_a_typo_of_a_trl_name_gets_trls_name_and_ours() -> None:
    with pytest.raises(TypeError, match=r"'num_generation'; did you mean TRL's 'num_generations'\? ours is group_size"):
        GRPO("TransformerPolicy", None, num_generation=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_completion_length": 64}, r"'max_completion_length', TRL's name: ours is max_new_tokens=\.\.\."),
        ({"processing_class": None}, r"'processing_class', TRL's name: ours is tokenizer=\.\.\."),
        ({"train_dataset": []}, r"'train_dataset', TRL's name: ours is task_kwargs=\.\.\."),
        (
            {"num_generations": 4},
            r"'num_generations'; the algorithm's arguments \(n_groups, group_size, \.\.\.\) go to GRPO",
        ),
        ({"reward_weight": {}}, r"'reward_weight'; did you mean reward_weights"),
    ],
)
def test_the_env_names_ours_for_a_trl_name_or_a_typo(kwargs: dict, message: str) -> None:
    """gym.make("R1Zero-v0", max_completion_length=...): TRL users put its generation names on the env too."""
    with pytest.raises(TypeError, match=rf"R1ZeroEnv\(\) got an unexpected keyword argument {message}"):
        gym.make("R1Zero-v0", **kwargs)


def test_the_signatures_stay_explicit() -> None:
    """The hint is a decorator: what SB3-style code reads (save, presets, load) sees the constructor's own names."""
    assert "kwargs" not in parameters(GRPO.__init__) and "group_size" in parameters(GRPO.__init__)
    assert all(p.kind is not p.VAR_KEYWORD for p in inspect.signature(LMPPO.__init__).parameters.values())
    assert "max_new_tokens" in parameters(grpo_gym.R1ZeroEnv) and "kwargs" not in parameters(grpo_gym.R1ZeroEnv)


def test_the_docs_hold_the_table_as_written_here() -> None:
    text = FROM_TRL.read_text(encoding="utf-8")
    assert readme_section() in text, "docs/guides/from-trl.md's table is stale: paste trl_names.readme_section()"
    for name in GRPO_CONFIG:
        assert f"`{name}`" in readme_section()
