"""GRPO's own constructor arguments and their rules (the shared ones are in :mod:`algorithms.common.arguments`)."""

from __future__ import annotations

import inspect

from algorithms.common.arguments import Rule, boolean, choice, integer, mapping, number, schedule
from algorithms.common.losses import AGGREGATION_MODES, IMPORTANCE_LEVELS
from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.grpo import advantages

#: the keys ``replay_buffer_kwargs`` may hold (``PrioritizedTrajectoryBuffer``'s arguments but those GRPO sets)
REPLAY_BUFFER_KEYS = tuple(
    name
    for name in inspect.signature(PrioritizedTrajectoryBuffer.__init__).parameters
    if name not in ("self", "pad_id", "seed")
)

GRPO_RULES: dict[str, Rule] = {
    "group_size": integer(low=2),  # a group of one has no group-relative advantage (LMPPO allows 1)
    "n_epochs": integer(low=1),
    "batch_size": integer(low=1, allow_none=True),
    "clip_range": schedule(low=0.0),
    "clip_range_high": schedule(low=0.0, allow_none=True),
    "beta": number(low=0.0),
    "ent_coef": schedule(updates=True),
    "vf_coef": number(low=0.0),
    "advantage_scale": choice(*advantages.ADVANTAGE_SCALES),
    "loss_aggregation": choice(*AGGREGATION_MODES),
    "drop_uniform_groups": boolean(),
    "importance_level": choice(*IMPORTANCE_LEVELS),
    "sequence_clip_range": number(low=0.0),
    "sequence_clip_range_high": number(low=0.0),
    "dynamic_sampling": boolean(),
    "max_resample_rounds": integer(low=0),
    "mask_truncated": boolean(),
    "prompt_sampling": choice("uniform", "learnability"),
    "prompt_pool_size": integer(low=1),
    "fresh_prompt_fraction": number(low=0.0, high=1.0),
    "competition": choice(None, "fixed", "adaptive"),
    "competition_coef": number(low=0.0, low_open=True),
    "diversity_guard": boolean(),
    "diversity_threshold": number(low=0.0),
    "update_mode": choice("joint", "sequential"),
    "advantage_baseline": choice("group", "value", "leave_one_out"),
    "reward_ramp": boolean(),
    "protected_rollouts": integer(low=0),
    "diagnostics": boolean(),
    "replay_ratio": number(low=0.0, high=1.0, high_open=True),
    "max_replay_age": integer(low=0),
    "replay_buffer_kwargs": mapping(REPLAY_BUFFER_KEYS),
}
