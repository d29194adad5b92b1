"""grpo-gym's learning package, laid out like sb3-contrib: ``from algorithms import GRPO``."""

from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import GRPO, TransformerPolicy

__all__ = ["GRPO", "TransformerPolicy", "UpdateDecay"]
