"""What a rollout logs: each reward component as ``rollout/reward/<name>`` (Nones left out), read back from
TensorBoard, and the functions' ``log_metric`` values as ``rollout/reward_metric/<name>``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.logger import configure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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
