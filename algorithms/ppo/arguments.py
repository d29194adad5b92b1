"""LMPPO's own constructor arguments and their rules (the shared ones are in :mod:`algorithms.common.arguments`)."""

from __future__ import annotations

from algorithms.common.arguments import Rule, boolean, choice, integer, number, schedule
from algorithms.common.sampler_correction import SAMPLER_CORRECTIONS

#: where the KL to the reference goes: a per-token reward penalty (InstructGPT) or a k3 term in the loss (GRPO's)
KL_PLACEMENTS = ("reward", "loss")

PPO_RULES: dict[str, Rule] = {
    "n_epochs": integer(low=1),
    "batch_size": integer(low=1, allow_none=True),
    "clip_range": schedule(low=0.0),
    "clip_range_vf": schedule(low=0.0, allow_none=True),
    "ent_coef": schedule(),
    "vf_coef": number(low=0.0),
    "gae_lambda": number(low=0.0, high=1.0),
    "normalize_advantage": boolean(),
    "kl_coef": number(low=0.0),
    "kl_placement": choice(*KL_PLACEMENTS),
    "target_kl": number(low=0.0, low_open=True, allow_none=True),
    "sampler_correction": choice(*SAMPLER_CORRECTIONS),
    "sampler_correction_cap": number(low=1.0),
}
