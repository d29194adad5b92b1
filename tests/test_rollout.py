"""What a rollout logs: each reward component as ``rollout/reward/<name>`` (Nones left out), read back from
TensorBoard, and the functions' ``log_metric`` values as ``rollout/reward_metric/<name>``; how often a rollout
resets its envs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest
import torch as th
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from algorithms import GRPO
from algorithms.common.rollout.rows import log_rollout
from algorithms.common.runtime.distributed import Distributed


def test_reward_components_are_logged_per_name_without_nones(tmp_path: Path) -> None:
    infos = [
        {"reward_components": {"syntax": 1.0, "consistency": None, "mine": -0.5, "never": None},
         "reward_metrics": {"calls": 2.0}, "completion": "a"},
        {"reward_components": {"syntax": 0.0, "consistency": 0.5, "mine": 0.25, "never": None},
         "reward_metrics": {"calls": 4.0}},
        {"reward_components": {"syntax": 1.0, "consistency": None, "mine": None, "never": None}},
    ]  # fmt: skip
    logger = configure(str(tmp_path), ["tensorboard"])
    masks = [th.ones(4, dtype=th.bool)] * 3
    log_rollout(logger, Distributed(), th.tensor([[0.5, 0.1, 0.9]]), masks, infos, generation_seconds=1.0)
    logger.dump(step=7)
    logger.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0}).Reload()
    scalars = events.Tags()["scalars"]

    def read(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert read("rollout/reward/syntax") == [(7, pytest.approx(2 / 3))]
    assert read("rollout/reward/consistency") == [(7, 0.5)]  # the two Nones left out
    assert read("rollout/reward/mine") == [(7, pytest.approx(-0.125))]
    assert "rollout/reward/never" not in scalars  # nothing applied: no value at all
    assert read("rollout/reward_metric/calls") == [(7, 3.0)]
    assert not any(tag.startswith("rollout/reward_") and tag != "rollout/reward_metric/calls"
                   and tag != "rollout/reward_mean" for tag in scalars)  # fmt: skip


class CountResets(gym.Wrapper):
    """Counts the resets that pin a problem (``options={"problem": ...}``), by problem seed, and the others."""

    def __init__(self, env: gym.Env, pinned: Counter, other: list[int]) -> None:
        super().__init__(env)
        self.pinned, self.other = pinned, other

    def reset(self, *, seed=None, options=None):
        if options and "problem" in options:
            self.pinned[options["problem"].seed] += 1
        else:
            self.other.append(1)
        return self.env.reset(seed=seed, options=options)


@pytest.mark.parametrize("n_envs", [1, 3])
def test_a_rollout_resets_each_env_once_per_episode_and_once_per_group_for_its_prompt(n_envs: int) -> None:
    """K x G episodes: the prompt of a group is read from one reset (its G episodes share it), then each episode's
    env is reset with its problem before its step; the VecEnv's own reset after each done pins nothing."""
    pinned: Counter = Counter()
    other: list[int] = []
    env = DummyVecEnv([lambda: CountResets(gym.make("R1Zero-v0"), pinned, other) for _ in range(n_envs)])
    model = GRPO("TransformerPolicy", env, n_groups=3, group_size=4, cold_start=False, seed=0)
    model.learn(12)  # SB3's learn resets every env once first
    pinned.clear()
    other.clear()
    model.learn(12, reset_num_timesteps=False)  # one iteration: 3 groups of 4
    assert len(pinned) == 3 and set(pinned.values()) == {4 + 1}  # per problem: G episodes' resets + its prompt's
    assert len(other) == 12  # the auto-reset of each ended (one-turn) episode
    pinned.clear()
    assert model.rollouts.prompts(env, []) == [] and not pinned  # no episodes (a rank with no groups): no reset
