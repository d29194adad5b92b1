"""Rewards for R1-Zero-style completions: template parsing, the composite reward's three components and their sum.

Importing this package never imports ``torch`` or ``transformers``; :class:`RewardModelScorer` loads them
when it first scores.
"""

from __future__ import annotations

from grpo_gym.rewards.components import consistency_score, length_score, syntax_score, task_score
from grpo_gym.rewards.composite import (
    BUILTIN_COMPONENTS,
    COMPONENTS,
    DEFAULT_WEIGHTS,
    CompositeReward,
    RewardResult,
    TurnInput,
)
from grpo_gym.rewards.functions import check_reward_function, is_per_turn, per_turn
from grpo_gym.rewards.parsing import MAX_COMPLETION_CHARS, ParsedCompletion, completion_text, parse_completion
from grpo_gym.rewards.reward_model import RewardModelScorer

__all__ = [
    "BUILTIN_COMPONENTS",
    "COMPONENTS",
    "DEFAULT_WEIGHTS",
    "MAX_COMPLETION_CHARS",
    "CompositeReward",
    "ParsedCompletion",
    "RewardModelScorer",
    "RewardResult",
    "TurnInput",
    "check_reward_function",
    "completion_text",
    "consistency_score",
    "is_per_turn",
    "length_score",
    "parse_completion",
    "per_turn",
    "syntax_score",
    "task_score",
]
