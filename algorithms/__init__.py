"""grpo-gym's learning package, laid out like sb3-contrib: ``from algorithms import GRPO, LMPPO`` (``LMPPO``: PPO for
language models, named so that it does not shadow Stable-Baselines3's ``PPO``). An algorithm imported here is
registered by its ``algo_name`` (:attr:`~algorithms.common.base_class.LMBaseAlgorithm.registry`): the command line's
``--algo``, ``eval``, ``serve``, ``export``, ``distill`` and ``quantize`` find it there."""

from algorithms.common.base_class import LMBaseAlgorithm
from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import GRPO, TransformerPolicy
from algorithms.ppo import LMPPO
from algorithms.rloo import RLOO

#: every algorithm by its command-line name (``--algo``)
ALGORITHMS = LMBaseAlgorithm.registry

__all__ = ["ALGORITHMS", "GRPO", "LMPPO", "RLOO", "TransformerPolicy", "UpdateDecay"]
