"""The seed's training controls: each rule by hand (algorithms.grpo.controls), then active in learn()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common.callbacks import CurriculumCallback
from algorithms.grpo import controls
from tests.sizes import TINY
from tests.test_grpo import make_env, make_model, parameters

# ---------------------------------------------------------------------------------------------- rules by hand


def test_competition_scales_the_winning_group():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # means 0.5, 1.0, 0.0: group 1 wins
    assert controls.competition_scale(rewards).tolist() == pytest.approx([1.0, 1.2, 1.0])
    tie = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # equal means: no winner
    assert controls.competition_scale(tie).tolist() == [1.0, 1.0]
    two = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    assert controls.winning_groups(two).tolist() == [True, True, False]


def test_adaptive_competition_coefficient():
    assert controls.adaptive_competition_coef(0.02, 0.0) == 1.2  # no reference yet
    assert controls.adaptive_competition_coef(0.02, 0.02) == pytest.approx(1.2)
    assert controls.adaptive_competition_coef(0.025, 0.02) == pytest.approx(1.5)  # 1.2 * 1.25 = 1.5
    assert controls.adaptive_competition_coef(0.1, 0.02) == 1.5  # clipped
    assert controls.adaptive_competition_coef(0.01, 0.02) == pytest.approx(0.8)  # 0.6 -> clipped to 0.8
    assert controls.adaptive_competition_coef(0.015, 0.02) == pytest.approx(0.9)


def test_group_entropies_and_spread():
    log_probs = torch.tensor([[-1.0, -3.0, 0.0], [-2.0, 0.0, 0.0], [-0.1, -0.1, -0.1]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]).bool()
    groups = torch.tensor([0, 0, 1])
    entropies = controls.group_entropies(log_probs, mask, groups, 2)
    assert entropies.tolist() == pytest.approx([(1 + 3 + 2) / 3, 0.1])
    assert controls.diversity_spread(entropies) == pytest.approx(1.9)
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert controls.signal_free_groups(rewards).tolist() == [True, False]


def test_reward_model_weight_ramp():
    assert controls.reward_model_weight(0.4, 0) == 0.0
    assert controls.reward_model_weight(0.4, 999) == 0.0
    assert controls.reward_model_weight(0.4, 1000) == pytest.approx(0.05)
    assert controls.reward_model_weight(0.4, 5500) == pytest.approx(0.25)
    assert controls.reward_model_weight(0.4, 100_000) == 0.4


def test_gradient_spread_and_group_stability():
    assert controls.gradient_spread(torch.tensor([1.0, 1.0])) == 0.0
    assert controls.gradient_spread(torch.tensor([1.0, 3.0])) == pytest.approx(0.5)  # std 1 / mean 2
    same = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    orthogonal = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert controls.group_stability(same) == pytest.approx(1.0)
    assert controls.group_stability(opposite) == pytest.approx(0.0)
    assert controls.group_stability(orthogonal) == pytest.approx(0.5)
    three = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])  # the zero gradient is left out
    assert controls.group_stability(three) == pytest.approx((1 + (0 + 0 + 1) / 3) / 2)


# ---------------------------------------------------------------------------------------------- in learn()


def _scalars(tmp_path: Path) -> dict[str, list[float]]:
    events = EventAccumulator(str(tmp_path / "GRPO_1"), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    scalars["histograms"] = events.Tags()["histograms"]
    return scalars


@pytest.mark.parametrize(
    ("kwargs", "tag"),
    [
        ({"controls_kwargs": {"competition": "fixed"}}, "train/competition_coef"),
        ({"controls_kwargs": {"competition": "adaptive"}}, "train/competition_coef"),
        ({"controls_kwargs": {"diversity_guard": True}}, "diversity/entropy_spread"),
        ({"controls_kwargs": {"reward_ramp": True}}, "train/reward_model_weight"),
        ({"controls_kwargs": {"curriculum": True}}, "curriculum/difficulty"),
        ({"controls_kwargs": {"diagnostics": True}}, "groups/stability"),
        ({"controls_kwargs": {"replay_ratio": 0.25}}, "replay/fraction"),
        ({"controls_kwargs": {"update_mode": "sequential"}}, "train/optimizer_steps"),
        ({"controls_kwargs": {"protected_rollouts": 1}}, "rollout/protected"),
        ({"advantage_baseline": "value", "policy_kwargs": {**TINY, "value_head": True}}, "train/value_baseline"),
    ],
)
def test_each_control_is_active_in_learn(tmp_path: Path, kwargs, tag):
    model = make_model(tensorboard_log=str(tmp_path), **kwargs)
    model.learn(16)
    assert tag in _scalars(tmp_path), tag


def test_fixed_competition_scales_the_advantages(tmp_path: Path):
    model = make_model(controls_kwargs={"competition": "fixed"}, tensorboard_log=str(tmp_path), seed=4)
    model.learn(8)
    coef = _scalars(tmp_path)["train/competition_coef"]
    assert coef == [pytest.approx(1.2)]


def test_reward_ramp_sets_the_env_weight():
    env = make_env(reward_weights={"syntax": 0.3, "consistency": 0.4, "task": 0.3})
    model = make_model(env, controls_kwargs={"reward_ramp": True})
    model.learn(8)
    assert env.get_attr("reward_fn")[0].weights["consistency"] == 0.0  # 0 timesteps: nothing yet
    model.num_timesteps = 2500
    model.learn(8, reset_num_timesteps=False)
    assert env.get_attr("reward_fn")[0].weights["consistency"] == pytest.approx(0.1)


def test_curriculum_moves_the_difficulty(tmp_path: Path):
    model = make_model(controls_kwargs={"curriculum": True}, tensorboard_log=str(tmp_path))
    model.learn(8 * 3)
    levels = _scalars(tmp_path)["curriculum/difficulty"]
    assert levels[0] == pytest.approx(0.3) or levels[0] == pytest.approx(0.27)  # from the curriculum's start
    assert model.env.get_attr("difficulty")[0] == pytest.approx(levels[-1])
    callback = CurriculumCallback()
    assert callback.curriculum.difficulty == 0.3


#: tolerances of a comparison of weights after a short run, per precision: bf16 rounds the forward passes'
#: matmuls (and their order of accumulation differs between the two ways of summing the gradient)
TOLERANCES = {"no": {"atol": 1e-6, "rtol": 1e-5}, "bf16": {"atol": 5e-4, "rtol": 1e-3}}


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_diagnostics_give_the_joint_gradient(tmp_path: Path, mixed_precision: str):
    """Accumulating the update group by group gives the same weights as the joint update, and logs the
    per-group histograms. The precision is pinned (``auto`` may pick bf16 on a CPU with native bf16), and
    bf16 (emulated on a CPU without it) is compared with bf16's tolerances."""
    runs = []
    for diagnostics in (False, True):
        model = make_model(
            controls_kwargs={"diagnostics": diagnostics},
            tensorboard_log=str(tmp_path / str(diagnostics)),
            learning_rate=1e-3,
            mixed_precision=mixed_precision,
        )
        model.learn(8)
        runs.append(parameters(model))
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **TOLERANCES[mixed_precision])
    events = EventAccumulator(str(tmp_path / "True" / "GRPO_1"), size_guidance={"histograms": 0}).Reload()
    assert {"groups/rewards_0", "groups/rewards_1"} <= set(events.Tags()["histograms"])


def test_sequential_updates_step_once_per_group(tmp_path: Path):
    model = make_model(controls_kwargs={"update_mode": "sequential"}, tensorboard_log=str(tmp_path))
    model.learn(8)
    assert model._n_updates == 2  # two groups, one step each
    assert _scalars(tmp_path)["train/optimizer_steps"] == [2.0]


def test_value_baseline_and_protected_rollouts():
    model = make_model(
        advantage_baseline="value",
        policy_kwargs={**TINY, "value_head": True},
        controls_kwargs={"protected_rollouts": 1},
    )
    assert model.ref_model is not None  # the frozen sampler of the protected rollouts
    model.learn(16)
    with pytest.raises(ValueError, match="value head"):
        make_model(advantage_baseline="value")
    with pytest.raises(ValueError, match="update_mode"):
        make_model(controls_kwargs={"update_mode": "parallel"})
