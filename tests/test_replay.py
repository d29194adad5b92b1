"""Prioritized trajectory replay wired into GRPO (replay_ratio, max_replay_age, priorities, save/load)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common.rollout.batch import RolloutBatch
from tests.test_grpo import make_env, make_model


def _batch(n, prompt_width, completion_width, **extra):
    return RolloutBatch(
        prompt_ids=th.arange(n * prompt_width).view(n, prompt_width) + 3,
        prompt_mask=th.ones(n, prompt_width, dtype=th.long),
        completion_ids=th.full((n, completion_width), 7),
        completion_mask=th.ones(n, completion_width, dtype=th.bool),
        old_log_probs=th.full((n, completion_width), -1.0),
        advantages=th.ones(n),
        returns=th.zeros(n),
        groups=th.zeros(n, dtype=th.long),
        **extra,
    )


def test_concat_pads_prompts_left_and_completions_right():
    fresh = _batch(2, 3, 4)
    replayed = _batch(1, 5, 2, weights=th.tensor([0.5]), slots=th.tensor([9]))
    both = fresh.concat(replayed)
    assert both.prompt_ids.shape == (3, 5) and both.completion_ids.shape == (3, 4)
    assert both.prompt_mask.tolist()[0] == [0, 0, 1, 1, 1] and both.prompt_ids[0, 2:].tolist() == [3, 4, 5]
    assert both.completion_mask.tolist()[2] == [True, True, False, False]
    assert both.weights.tolist() == [1.0, 1.0, 0.5] and both.slots.tolist() == [-1, -1, 9]
    assert both.ref_log_probs is None


def test_grpo_with_replay_trains_and_logs(tmp_path: Path):
    model = make_model(
        controls_kwargs={"replay_ratio": 0.5, "max_replay_age": 2}, tensorboard_log=str(tmp_path), seed=1
    )
    assert model.replay_buffer is not None
    model.learn(8 * 5)  # 5 iterations of 2 groups x 4
    buffer = model.replay_buffer
    assert len(buffer) == 8 * 3  # the rows of iterations 3, 4, 5: older ones evicted (max age 2), 8 each
    events = EventAccumulator(str(tmp_path / "GRPO_1")).Reload()
    fraction = [e.value for e in events.Scalars("replay/fraction")]
    assert fraction[0] == 0.0 and fraction[1:] == [0.5] * 4  # the first update has nothing to replay
    assert all(0 <= e.value <= 2 for e in events.Scalars("replay/age_mean"))
    assert [e.value for e in events.Scalars("replay/size")] == [0, 8, 16, 16, 16]  # after eviction, before ingest
    # replayed slots got |A| exp(-drift) + 1e-3 instead of the max priority new ones get
    priorities = buffer.sampler.priorities(np.flatnonzero(buffer.ring.is_live(np.arange(buffer.capacity))[:24]))
    assert len(set(np.round(priorities, 6))) > 1


def test_replay_buffer_save_and_load(tmp_path: Path):
    model = make_model(controls_kwargs={"replay_ratio": 0.25}, seed=2)
    model.learn(16)
    model.save_replay_buffer(tmp_path / "buffer.npz")
    other = make_model(controls_kwargs={"replay_ratio": 0.25}, seed=2)
    other.load_replay_buffer(tmp_path / "buffer.npz")
    assert len(other.replay_buffer) == len(model.replay_buffer) == 16
    a, b = model.replay_buffer.sample_batch(4), other.replay_buffer.sample_batch(4)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.completion_ids, b.completion_ids)
    model.save(tmp_path / "model.zip")  # the buffer is not pickled into the zip
    assert "replay_buffer" in model._excluded_save_params()


def test_replay_on_the_demo_task():
    """The demo's env settings (compact template, arithmetic at difficulty 0.1), a quarter of each update replayed."""
    env = make_env(n_envs=2)
    model = make_model(env, controls_kwargs={"replay_ratio": 0.25}, n_groups=4, group_size=4, beta=0.04, seed=3)
    model.learn(16 * 4)
    assert model.num_timesteps == 64 and len(model.replay_buffer) == 64


def test_bad_replay_arguments():
    with pytest.raises(ValueError, match="replay_ratio"):
        make_model(controls_kwargs={"replay_ratio": 1.0})
    model = make_model()
    with pytest.raises(ValueError, match="no replay buffer"):
        model.save_replay_buffer("x.npz")
