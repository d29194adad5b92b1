"""Distillation: the KL terms, student specs, the tokenizer check, a run with every option, and what it achieves."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.common.evaluation import evaluate_problems, held_out_problems
from algorithms.common.model.loading import load_model
from algorithms.deploy import distill, distillation_kl, kl_terms, load_policy, policy_for_model
from algorithms.deploy.distill import DistillSettings, student_policy_kwargs
from algorithms.deploy.quantize import int8_layers
from tests.sizes import ENV_KWARGS, TINY, TINY_KWARGS
from tests.test_loading import small_tokenizer

#: the student of the short runs: the tests' 1-layer model, narrower
STUDENT = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1}  # fmt: skip


def make_env() -> gym.Env:
    return gym.make("R1Zero-v0", **ENV_KWARGS)


@pytest.fixture(scope="module")
def trained_teacher() -> GRPO:
    """A teacher that solves some held-out problems: a 1-layer, 64-wide model after 800 SFT steps (the tests'
    budget; its greedy held-out success is about 14%)."""
    kwargs = {**TINY_KWARGS, "hidden_size": 64, "intermediate_size": 128}
    teacher = GRPO(
        "TransformerPolicy",
        make_env(),
        policy_kwargs={"model": "tiny", "model_kwargs": kwargs},
        cold_start_kwargs={"steps": 800, "batch_size": 32, "learning_rate": 5e-3},
        seed=0,
    )
    teacher.run_cold_start()
    return teacher


@pytest.fixture(scope="module")
def untrained_teacher() -> GRPO:
    return GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, seed=0)


def test_kl_terms_by_hand() -> None:
    teacher = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    student = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    forward, reverse = kl_terms(teacher, student)
    torch.testing.assert_close(
        forward, torch.tensor([0.0, 0.9 * torch.log(torch.tensor(1.8)) + 0.1 * torch.log(torch.tensor(0.2))])
    )
    torch.testing.assert_close(
        reverse, torch.tensor([0.0, 0.5 * torch.log(torch.tensor(0.5 / 0.9)) + 0.5 * torch.log(torch.tensor(5.0))])
    )
    hot_forward, _ = kl_terms(teacher, student, tau=100.0)  # a high temperature flattens both: KL -> 0
    assert hot_forward[1] < 1e-4 < forward[1]


def test_student_specs(tmp_path: Path) -> None:
    assert student_policy_kwargs("small") == {"model": "small"}
    assert student_policy_kwargs({"hidden_size": 64}) == {"model": "tiny", "model_kwargs": {"hidden_size": 64}}
    assert student_policy_kwargs({"model": "small", "num_hidden_layers": 2})["model"] == "small"
    config = tmp_path / "student.json"
    config.write_text(json.dumps(STUDENT))
    assert student_policy_kwargs(config)["model_kwargs"] == STUDENT
    load_model("tiny", **TINY_KWARGS).save_pretrained(tmp_path / "folder")
    assert student_policy_kwargs(tmp_path / "folder") == {"model": str(tmp_path / "folder")}
    with pytest.raises(ValueError, match="built-in size"):
        student_policy_kwargs("enormous")
    with pytest.raises(ValueError, match="'model' must be a built-in"):
        student_policy_kwargs({"model": "enormous"})
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="JSON"):
        student_policy_kwargs(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"reverse_kl": 1.5}, "reverse_kl"), ({"on_policy": -0.1}, "on_policy"), ({"temperature": 0}, "temperature"),
     ({"steps": -1}, "steps"), ({"sft_coef": -1}, "sft_coef"), ({"qat_start": 2}, "qat_start")],
)  # fmt: skip
def test_bad_settings_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DistillSettings(**kwargs)


def test_teacher_and_student_must_share_a_tokenizer() -> None:
    model = load_model("tiny", vocab_size=12, **TINY_KWARGS)
    teacher = policy_for_model(model, small_tokenizer(), max_new_tokens=8)
    with pytest.raises(ValueError, match="share a tokenizer"):
        distill(teacher, STUDENT, make_env(), steps=1)


def test_a_short_run_with_every_option_saves_a_trainable_student(untrained_teacher: GRPO, tmp_path: Path) -> None:
    student = distill(
        untrained_teacher, STUDENT, make_env(), steps=4, batch_size=4, on_policy=0.5, reverse_kl=0.5, sft_coef=0.5,
        int8_qat=True, qat_start=0.5, log_interval=2, tensorboard_log=str(tmp_path / "tb"), seed=0,
        save_path=tmp_path / "student.zip",
    )  # fmt: skip
    assert all(type(m) is nn.Linear or not isinstance(m, nn.Linear) for m in student.policy.model.modules())
    assert student.policy.model.config.hidden_size == 24 and student.policy.top_p == untrained_teacher.policy.top_p
    for name, value in student.policy.model.state_dict().items():  # the reference starts from the student
        assert torch.equal(student.ref_model.state_dict()[name], value)
    [run] = (tmp_path / "tb").iterdir()
    events = EventAccumulator(str(run)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"distill/kl_forward", "distill/kl_reverse", "distill/sft_loss", "distill/loss", "distill/int8_qat"} <= tags
    assert [e.value for e in events.Scalars("distill/int8_qat")] == [0.0, 1.0]  # QAT from the third step

    loaded = GRPO.load(tmp_path / "student.zip", env=make_env(), n_groups=1, group_size=2)
    for name, value in student.policy.state_dict().items():
        assert torch.equal(loaded.policy.state_dict()[name], value)
    loaded.learn(2)  # trainable further with GRPO
    assert loaded.num_timesteps == 2
    policy, _ = load_policy(tmp_path / "student")  # the save_pretrained folder
    assert policy.model.config.hidden_size == 24
    int8, _ = load_policy(tmp_path / "student-int8")
    assert int8_layers(int8.model)
    ids = torch.tensor([[3, 4, 5, 6]])
    assert int8.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=4).tokens.shape == (1, 4)


def test_zero_steps_returns_the_initial_student(untrained_teacher: GRPO) -> None:
    first = distill(untrained_teacher, STUDENT, make_env(), steps=0, seed=3)
    again = distill(untrained_teacher, STUDENT, make_env(), steps=0, seed=3)
    for name, value in first.policy.state_dict().items():
        assert torch.equal(again.policy.state_dict()[name], value)


def test_distillation_lowers_the_kl_and_keeps_held_out_success_within_10_points(trained_teacher: GRPO) -> None:
    """The margin: the student's greedy held-out success (100 problems of the embedded default) is at most 10
    points below the teacher's, after 800 steps from a random initialisation (same width as the teacher here; the
    benchmark distils into a smaller student). 300 steps were too few where the teacher learns more: on an AVX2-only
    CPU its float rounding gives a teacher at 24% and a student at 11% after 300 steps, 22% after 800."""
    student_config = {**TINY_KWARGS, "hidden_size": 64, "intermediate_size": 128}
    before = distill(trained_teacher, student_config, make_env(), steps=0, seed=1)
    env = before.get_env()
    kl_before = distillation_kl(trained_teacher.policy, before.policy, env, n=64)
    after = distill(trained_teacher, student_config, make_env(), steps=800, learning_rate=5e-3, seed=1)
    kl_after = distillation_kl(trained_teacher.policy, after.policy, env, n=64)
    assert kl_after < kl_before / 4
    problems = held_out_problems(env, 100, 0.1)
    teacher_success = evaluate_problems(trained_teacher.policy, env, problems, greedy=True).success_rate
    student_success = evaluate_problems(after.policy, env, problems, greedy=True).success_rate
    assert teacher_success >= 0.05  # the teacher has something to pass on
    assert round(100 * student_success) >= round(100 * teacher_success) - 10  # in problems: 0.14 - 0.10 != 0.04
