"""GRPO (Group Relative Policy Optimization) and its policy."""

from algorithms.grpo.grpo import GRPO
from algorithms.grpo.policies import TransformerPolicy

__all__ = ["GRPO", "TransformerPolicy"]
