"""grpo-gym's learning package, laid out like sb3-contrib: ``from algorithms import GRPO, LMPPO`` (``LMPPO``: PPO for
language models, named so that it does not shadow Stable-Baselines3's ``PPO``)."""

from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import GRPO, TransformerPolicy
from algorithms.ppo import LMPPO

__all__ = ["GRPO", "LMPPO", "TransformerPolicy", "UpdateDecay"]
