"""grpo-gym's environment package: ``import grpo_gym; gym.make("R1Zero-v0")``.

Importing it registers ``R1Zero-v0`` with Gymnasium (idempotently). Without the import,
``gym.make("grpo_gym:R1Zero-v0")`` imports it for you. This package never imports torch.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from grpo_gym.curriculum import DynamicCurriculum
from grpo_gym.env import R1ZeroEnv
from grpo_gym.rewards import DEFAULT_WEIGHTS, CompositeReward, RewardModelScorer, parse_completion, per_turn
from grpo_gym.tasks import Problem, Task, Verdict, list_tasks, make_task, register_task
from grpo_gym.tokenizer import build_char_tokenizer, load_tokenizer

ENV_ID = "R1Zero-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="grpo_gym.env:R1ZeroEnv")

__version__ = "0.1.0"
__all__ = [
    "DEFAULT_WEIGHTS",
    "ENV_ID",
    "CompositeReward",
    "DynamicCurriculum",
    "Problem",
    "R1ZeroEnv",
    "RewardModelScorer",
    "Task",
    "Verdict",
    "build_char_tokenizer",
    "list_tasks",
    "load_tokenizer",
    "make_task",
    "parse_completion",
    "per_turn",
    "register_task",
]
